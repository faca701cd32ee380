"""Published numbers to hold results against: the ResNet half of the InCo paper's Table 2
(100 clients, ratio 0.1, 500 rounds of E = 5, mean ± std over 3 seeds; the paper's Table 2)."""

from __future__ import annotations

import pandas as pd

from incofl.models.names import RESNETS

PAPER_SETTING = "ResNet family, 100 clients, ratio 0.1, 500 rounds of E = 5"
_COLUMNS = [(d, a) for d in ("fmnist", "svhn", "cifar10", "cinic10") for a in (0.5, 1.0)]
_TABLE2_RESNET = {  # mean±std per column of _COLUMNS
    "FedAvg": "86.7±1.0 87.7±0.6 74.8±3.2 81.6±2.5 52.3±3.4 61.3±3.2 43.1±2.7 49.2±3.1",
    "FedProx": "75.1±1.8 76.6±1.5 32.0±2.8 43.7±2.9 19.2±2.2 23.4±2.4 17.4±1.7 19.8±1.4",
    "SCAFFOLD": "87.9±0.5 88.0±0.3 76.3±3.4 82.4±3.1 54.3±3.6 61.8±3.0 43.5±2.4 49.4±3.1",
    "FedNova": "12.7±0.2 15.6±0.2 13.4±0.4 15.3±0.3 10.4±0.3 14.3±0.2 12.0±0.3 14.0±0.2",
    "MOON": "87.7±0.4 87.5±0.3 72.8±4.3 81.2±3.2 47.2±2.7 58.8±2.6 40.8±2.1 49.2±1.9",
    "InCoAvg": "90.2±1.2 88.4±1.8 87.6±2.8 89.0±2.6 67.8±3.2 70.7±3.4 53.0±3.2 57.5±3.3",
    "InCoProx": "88.8±2.3 86.4±3.2 89.0±1.3 90.8±1.2 74.5±2.3 76.8±1.8 59.1±3.2 62.5±2.4",
    "InCoScaffold": "88.3±1.4 90.1±1.2 85.4±2.4 87.8±3.5 67.3±3.6 73.8±2.9 53.5±3.3 61.7±3.0",
    "InCoNova": "86.6±1.4 87.4±1.3 86.4±2.5 88.4±1.8 62.8±3.9 69.7±4.2 48.0±2.7 54.1±1.7",
    "InCoMOON": "89.1±1.3 89.5±1.2 85.6±3.8 89.3±2.0 68.2±3.1 71.8±2.3 54.3±3.0 57.6±2.7",
}


def paper_table2() -> pd.DataFrame:
    """The paper's ResNet Table 2 in tidy form: method, dataset, alpha, mean, std."""
    rows = [
        (method, d, a, *map(float, cell.split("±")))
        for method, cells in _TABLE2_RESNET.items()
        for (d, a), cell in zip(_COLUMNS, cells.split(), strict=True)
    ]
    return pd.DataFrame(rows, columns=["method", "dataset", "alpha", "mean", "std"])


def is_resnet_family(summaries: pd.DataFrame) -> bool:
    """True when every run trained the ResNet family (the setting of the paper's numbers)."""
    if "config" not in summaries or summaries.empty:
        return False
    return all(set(c["models"]) <= set(RESNETS) for c in summaries["config"])


# The InCo paper's Table 3: share (%) of kernel slices with beta > 0 in target layers 11 and 13
# (ResNet, CIFAR-10); and its Table 1, the case study (CIFAR-10, 10 clients, 50 rounds, ResNets;
# the paper gives these three cells only).
PAPER_TABLE3 = {"InCoAvg": {11: 83.8, 13: 74.4}, "w/o optimisation": {11: 53.5, 13: 50.2}}
PAPER_TABLE1 = {
    ("ResNet", "IID", "homogeneous"): 81.0,
    ("ResNet", "non-IID", "homogeneous"): 62.3,
    ("ResNet", "non-IID", "heterogeneous"): 52.3,
}
