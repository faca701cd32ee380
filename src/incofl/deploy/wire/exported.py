"""What an export binds a run to, read by both sides (`incofl federation export` writes it into
each site's data file and into the server's facts file): the settings the partition was drawn with
(a file made under others is refused in one line: the server's facts file naming the first that
differs, a site's file by their digest, which is all a node is told: incofl.sides), and the digest
of the data set's test split (the server checks a node's against its own at identify)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np

from incofl.config import ConfigError, RunConfig
from incofl.sides import DIGESTED, PartitionSettings, partition_digest


def partition_settings(cfg: RunConfig) -> dict[str, object]:
    """The settings a file is exported with: those a client's share depends on, and the normalisation it holds."""
    return PartitionSettings.of(cfg).model_dump()


def check_digest(what: str, saved: Mapping[str, object], digest: str) -> None:
    """Refuse, in one line naming `what` (a site's file) and the settings it was exported with, a
    file whose partition settings `saved` are not those whose digest the run told (`digest`)."""
    if partition_digest(dict(saved)) != digest:
        told = ", ".join(f"{key}={saved.get(key)!r}" for key in sorted(DIGESTED))
        raise ConfigError(f"{what}: exported with other partition settings than the run's ({told}); export it again")


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


def test_sha256(x: np.ndarray, y: np.ndarray) -> str:
    """The digest of a data set's test split `x`, `y` ('' without one)."""
    return split_sha256(x, y) if len(y) else ""
