"""A site's side of a federation: its node's ClientApp, the client it builds from its schedule,
and its data (an exported share, or its own)."""
