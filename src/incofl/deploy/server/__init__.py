"""The server's side of a federation: the ServerApp, the facts it reads in place of the data set,
its transport over Flower, and the gate of the sites' port (which runs in the SuperLink)."""
