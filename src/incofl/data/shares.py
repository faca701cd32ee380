"""What a run's client side holds, and the facts derived from it (data/facts.py).

`Holdings`: the training data of the clients one client side serves: the images (the data set in
the simulator, a site's share on a federation's node) and, for each of its clients, its training
indices and, with `holdout`, its held-out ones. The simulator's client side holds every client, a
node its own. The server side holds none of it: it reads the facts (`derive`), one rule for both.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from incofl.data.dataset import ImageDataset
from incofl.data.facts import UNDECLARED, ClientFacts, Facts
from incofl.data.partition import Partition, hold_out
from incofl.data.tensors import normalisation


@dataclass(frozen=True)
class Holdings:
    """The clients a client side serves (module docstring): client -> its training indices into
    `data`'s training split, and client -> its held-out indices (None without holdout)."""

    data: ImageDataset
    parts: dict[int, np.ndarray]
    held_out: dict[int, np.ndarray] | None

    @classmethod
    def of(cls, data: ImageDataset, parts: dict[int, np.ndarray], holdout: float, seed: int) -> Holdings:
        """`parts` of `data`, each less its held-out share (`holdout`, seeded per client by `seed`)."""
        if not holdout:
            return cls(data, parts, None)
        split = {client: hold_out(idx, data.y_train, holdout, seed, client) for client, idx in parts.items()}
        return cls(data, {c: train for c, (train, _) in split.items()}, {c: held for c, (_, held) in split.items()})

    def facts(self, client: int) -> ClientFacts:
        """The facts of one of its clients' shares (what a site serving its own data declares)."""
        part = self.parts[client]
        held = 0 if self.held_out is None else len(self.held_out[client])
        return ClientFacts(len(part), held, tuple(int(c) for c in np.unique(self.data.y_train[part])))


def shares(
    data: ImageDataset, partition: Partition, holdout: float, seed: int, normalize: str
) -> tuple[Holdings, Facts]:
    """Every client's share of `data` (with `holdout`, less its held-out share: `Holdings.of`) and
    the run's facts: the one rule that both sides' inputs follow."""
    holdings = Holdings.of(data, dict(enumerate(partition.parts)), holdout, seed)
    return holdings, derive(holdings, normalize)


def derive(holdings: Holdings, normalize: str) -> Facts:
    """The facts of a client side's holdings (every client's, in client order) and of its data set."""
    data = holdings.data
    mean, std = normalisation(data, normalize)
    clients = tuple(holdings.facts(client) for client in sorted(holdings.parts))
    shape = (data.channels, *data.x_train.shape[2:])
    return Facts(clients, data.num_classes, shape, tuple(map(float, mean)), tuple(map(float, std)))


def declared_only(data: ImageDataset, clients: int, normalize: str) -> Facts:
    """The facts of `data` with each of `clients` clients' left to its site's declaration (a
    federation whose sites all serve their own data: no partition is drawn)."""
    facts = derive(Holdings(data, {}, None), normalize)
    return replace(facts, clients=(UNDECLARED,) * clients, to_declare=tuple(range(clients)))
