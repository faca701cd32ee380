"""FedNova: the normalisation of each client's update (normalize.py) and its methods (spec.py)."""
