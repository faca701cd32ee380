"""Real federations: incofl's methods as a Flower app (docs/federation.md). Only the app
modules (codec, serverapp, clientapp, inprocess) import flwr, the `flower` extra."""
