"""FedAvg and HeteroAvg: the generic stages only (local cross-entropy, a full plan), averaged
per model group (FedAvg, as the InCo paper's baselines) or over the shared global state."""

from incofl.spec import GROUPWISE_SOURCE, SHARED, Method

METHODS = (
    Method("FedAvg", source="McMahan et al. 2017" + GROUPWISE_SOURCE),
    Method("HeteroAvg", aggregator=SHARED, source="Chan et al., ICLR 2024"),
)
