"""FedAvg and HeteroAvg: generic components only (spec.py)."""
