"""Personalisation as plans (plan.py): Local, FedPer, FedLAG, and their methods (spec.py)."""
