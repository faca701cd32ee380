"""incofl: model-heterogeneous federated learning with InCo Aggregation, reproduced."""

__version__ = "0.1.0"
