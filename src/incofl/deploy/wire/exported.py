"""What an export binds a run to, read by both sides (`incofl federation export` writes it into
each site's data file and into the server's facts file): the settings the partition was drawn with
(a file made under others is refused in one line, naming the first that differs), and the digest of
the data set's test split (the server checks a node's against its own at identify)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np

from incofl.config import Affects, ConfigError, Role, RunConfig, run_settings
from incofl.data.dataset import ImageDataset

# The settings a site file is made with: those its client's share depends on, and the normalisation
# it holds (a node checks them against those its schedule carries: schedule.py).
PARTITION_KEYS = tuple(sorted(run_settings(Affects.PARTITION, Role.EXPORTED)))


def partition_settings(cfg: RunConfig) -> dict[str, object]:
    return {key: getattr(cfg, key) for key in PARTITION_KEYS}


def check_settings(what: str, saved: Mapping[str, object], wanted: Mapping[str, object]) -> None:
    """Refuse, in one line naming `what` (the file), settings `saved` at export that differ from the run's `wanted`."""
    for key, value in wanted.items():
        if saved.get(key) != value:
            raise ConfigError(f"{what}: exported with {key}={saved.get(key)!r}, the run has {key}={value!r}")


def split_sha256(x: np.ndarray, y: np.ndarray) -> str:
    """SHA-256 of a split: its images' dtype, shape and bytes, and its labels as int64."""
    digest = hashlib.sha256(f"{x.dtype}{list(x.shape)}".encode())
    digest.update(np.ascontiguousarray(x).tobytes())
    digest.update(np.ascontiguousarray(y).astype(np.int64).tobytes())
    return digest.hexdigest()


def test_sha256(data: ImageDataset) -> str:
    """The digest of a data set's test split ('' without one)."""
    return split_sha256(data.x_test, data.y_test) if len(data.y_test) else ""
