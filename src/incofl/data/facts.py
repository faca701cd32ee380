"""The facts of a run's data that its server side reads, and nothing else of the data: per client
the size of its training share, of its held-out share and the classes its training share holds;
of the data set its class count, an image's shape and the normalisation its splits are served
with. One rule derives them from the partition (data/shares.py): the simulator derives them in
process, `incofl federation export` writes them for a federation's server (deploy/server/serverdata.py),
which never reads a training image; `export --declared` leaves every client's to its site's
declaration, for a federation whose sites all serve their own data. This module reads no partition
and no data set: the server side imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ClientFacts:
    """One client's share: its training samples, its held-out samples, the classes it trains on."""

    samples: int
    held_out: int
    classes: tuple[int, ...]  # sorted


UNDECLARED = ClientFacts(0, 0, ())  # the row of a client whose site declares its facts (Facts.to_declare)


@dataclass(frozen=True)
class TestSplit:
    """The data set's test split (empty with `pool_test`): what the server side scores on, beside the facts."""

    x: np.ndarray  # uint8 (N, C, H, W)
    y: np.ndarray  # int64 (N,)


@dataclass(frozen=True)
class Facts:
    """Every client's facts, in client order, and the data set's (module docstring). A client in
    `to_declare` has the UNDECLARED row until its site's signed declaration fills it (a federation's
    server: deploy/server/serverapp.py, which runs no round before every one is filled)."""

    clients: tuple[ClientFacts, ...]
    classes: int
    shape: tuple[int, ...]  # an image's channels, height, width
    mean: tuple[float, ...]
    std: tuple[float, ...]
    to_declare: tuple[int, ...] = ()

    def held_out_clients(self) -> list[int]:
        """The clients that hold samples out (scored on them where they are: the personal accuracy)."""
        return [client for client, facts in enumerate(self.clients) if facts.held_out]

    def check(self, x: np.ndarray, y: np.ndarray) -> None:
        """Images and labels of this data set: uint8 (N, C, H, W) of its image shape, one integer
        label an image within its classes; a ValueError says what is not."""
        if x.dtype != np.uint8 or x.ndim != 4 or x.shape[1:] != self.shape:
            shape = ", ".join(map(str, self.shape))
            raise ValueError(f"images {x.dtype} {list(x.shape)}, the run's are uint8 [N, {shape}]")
        if y.shape != (len(x),) or y.dtype.kind not in "iu":
            raise ValueError(f"labels {y.dtype} {list(y.shape)}, not one integer label an image")
        outside = y[(y < 0) | (y >= self.classes)]
        if len(outside):
            raise ValueError(f"label {int(outside[0])}: the run has classes 0..{self.classes - 1}")

    def normalisation(self) -> tuple[np.ndarray, np.ndarray]:
        return np.array(self.mean), np.array(self.std)

    def to_json(self) -> dict[str, Any]:
        return {
            "clients": [
                None if i in self.to_declare else [c.samples, c.held_out, list(c.classes)]
                for i, c in enumerate(self.clients)
            ],
            "classes": self.classes,
            "shape": list(self.shape),
            "mean": list(self.mean),
            "std": list(self.std),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], clients: int) -> Facts:
        """Facts read back (`to_json`), every value checked: a ValueError names the first that is wrong."""
        classes, shape = _count(data["classes"], "classes"), tuple(_count(n, "shape") for n in data["shape"])
        mean, std = tuple(_number(v, "mean") for v in data["mean"]), tuple(_number(v, "std") for v in data["std"])
        if len(shape) != 3 or len(mean) != shape[0] or len(std) != shape[0]:
            raise ValueError("shape, mean, std: not one image shape and one mean and std per channel")
        rows = data["clients"]
        if not isinstance(rows, list) or len(rows) != clients:
            raise ValueError(f"clients: not one entry for each of the run's {clients} clients")
        told = tuple(UNDECLARED if row is None else client_facts(row, classes) for row in rows)
        return cls(told, classes, shape, mean, std, tuple(i for i, row in enumerate(rows) if row is None))


def _count(value: Any, key: str) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"{key}: {str(value)[:20]} is not a count")
    return value


def _number(value: Any, key: str) -> float:
    if type(value) not in (int, float) or not np.isfinite(value):
        raise ValueError(f"{key}: {str(value)[:20]} is not a finite number")
    return float(value)


def client_facts(row: Any, classes: int) -> ClientFacts:
    """A client's facts read back from [samples, held_out, classes], checked (a ValueError names the first wrong)."""
    if not isinstance(row, list) or len(row) != 3 or not isinstance(row[2], list):
        raise ValueError("clients: an entry is not [samples, held_out, classes]")
    held = tuple(_count(c, "clients.classes") for c in row[2])
    if list(held) != sorted(set(held)) or any(c >= classes for c in held):
        raise ValueError("clients.classes: not sorted distinct classes of the data set")
    return ClientFacts(_count(row[0], "clients.samples"), _count(row[1], "clients.held_out"), held)
