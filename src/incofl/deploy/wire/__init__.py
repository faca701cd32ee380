"""What the two sides of a federation share: the federation's credentials (keys, certificates),
what travels between them (the codec of a message's content, the signatures on it, a node's
schedule) and what an export binds a run to."""
