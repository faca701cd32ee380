"""FedDyn (Acar et al., ICLR 2021): each client's dynamic regulariser, its gradient state kept
in the client store, and the server's correction by h, one per federation; and InCoDyn."""
