"""FedPart: partial network updates, as a planner (plan.py), and its methods (spec.py)."""
