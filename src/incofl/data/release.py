"""The InCo release's fixed partitions (`fed_experiments/InCo/fix_distribution/*.npy`).

Each file is a pickled dict {client: list of training-set indices}, one per data set, alpha
and client count; the release's FashionMNIST runs read the CIFAR-10 file (docs/methods.md,
"Fidelity"). Pickles can run code when loaded, so these are read with an unpickler that only
builds the numpy array holding the dict: any other global in the file is refused.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

PREFIX = {"cifar10": "", "fmnist": "", "svhn": "SVHN_", "cinic10": "cinic10_"}
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
}


class ReleasePartitionError(ValueError):
    """A release partition file that is missing, unsafe or does not fit the run."""


def release_file(folder: str | Path, dataset: str, clients: int, alpha: float) -> Path:
    """The release's file name for a run (`'{}'.format(alpha)`, so 0.5 and 1.0)."""
    if dataset not in PREFIX:
        raise ReleasePartitionError(f"partition: release has no partition files for {dataset}")
    return Path(folder) / f"{PREFIX[dataset]}hetero-fix-{clients}-{float(alpha)}.npy"


class _NumpyOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # type: ignore[no-untyped-def]
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refused global {module}.{name}")
        return super().find_class(module, name)


def read_release_partition(path: str | Path, num_samples: int) -> list[np.ndarray]:
    """Client index arrays (client 0, 1, ...) from a release .npy file, checked to be disjoint
    indices into a training set of `num_samples`."""
    path = Path(path)
    if not path.is_file():
        raise ReleasePartitionError(f"{path}: release partition file not found")
    try:
        with path.open("rb") as fh:
            np.lib.format.read_magic(fh)
            np.lib.format.read_array_header_1_0(fh)
            mapping = _NumpyOnly(fh).load().item()
        parts = [np.asarray(mapping[k], dtype=np.int64) for k in range(len(mapping))]
    except (pickle.UnpicklingError, ValueError, KeyError, EOFError, AttributeError, TypeError) as err:
        raise ReleasePartitionError(f"{path}: not a release partition file ({err})") from None
    flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if len(flat) and (flat.min() < 0 or flat.max() >= num_samples):
        raise ReleasePartitionError(f"{path}: indices outside the {num_samples} training samples")
    if len(np.unique(flat)) != len(flat):
        raise ReleasePartitionError(f"{path}: a sample is given to two clients")
    return parts
