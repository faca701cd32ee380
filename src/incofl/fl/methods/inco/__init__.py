"""InCo Aggregation: the InCo step and its log (step.py), its methods and `with_inco` (spec.py)."""
