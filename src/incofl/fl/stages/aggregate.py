"""The aggregate and apply stages (docs/methods.md).

An aggregator turns the round's client updates into one averaged update per server state
(federation): `GroupWise` keeps one state per model group (each group its own federation),
`Shared` one global state of which every group trains its name-subset (HeteroAvg; InCo is
HeteroAvg followed by the InCo transform). Each entry is averaged over the clients that
uploaded it, so a client that trains or uploads only part of its model (a partial round)
counts only where it uploaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from incofl.fl.contracts import Average, ClientUpdate, Setup
from incofl.fl.stages.component import Stateful
from incofl.params import AggregationParams


def mean_over_holders(updates: Sequence[ClientUpdate], weighted: bool = False) -> Average:
    """Every entry averaged over the clients that hold it (sample-weighted if asked): the InCo
    paper's HeteroAvg over a shared state, FedAvg within a group."""
    sums: dict[str, torch.Tensor] = {}
    totals: dict[str, float] = {}
    for u in updates:
        w = float(u.num_samples) if weighted else 1.0
        for name, delta in u.delta.items():
            if name in sums:
                sums[name].add_(delta, alpha=w)
            else:
                sums[name] = delta * w if weighted else delta.clone()
            totals[name] = totals.get(name, 0.0) + w
    return {name: s.div_(totals[name]) for name, s in sums.items()}


class Aggregator(Stateful):
    """Turns the round's client updates into one averaged update per federation (server state).
    `shared`: one global state for every model group, else one per group. What it carries from
    round to round (FedRolex's released counts) is its `state_dict`: none here."""

    shared: ClassVar[bool]

    def __init__(self, hp: AggregationParams, setup: Setup):
        """`setup`: the run's Setup, for aggregators that need the server's shapes."""
        self.weighted = hp.weighted

    @classmethod
    def federation(cls, group: int) -> int:
        """The server state a group's clients train from and update (known before one is built:
        the planner's `Setup.federation`)."""
        return 0 if cls.shared else group

    def aggregate(self, updates: Sequence[ClientUpdate]) -> dict[int, Average]:
        raise NotImplementedError


class Shared(Aggregator):
    """HeteroAvg: one shared global state; every entry averaged over the sampled clients that hold it."""

    shared = True

    def aggregate(self, updates: Sequence[ClientUpdate]) -> dict[int, Average]:
        return {0: mean_over_holders(updates, self.weighted)}


class GroupWise(Aggregator):
    """The paper's FedAvg baseline: each model group averages only its own clients."""

    shared = False

    def aggregate(self, updates: Sequence[ClientUpdate]) -> dict[int, Average]:
        groups = sorted({u.group for u in updates})
        return {g: mean_over_holders([u for u in updates if u.group == g], self.weighted) for g in groups}


def apply_update(state: dict[str, torch.Tensor], update: Average) -> None:
    """w <- w + g (no server learning rate); BN running variances stay >= 0."""
    for name, delta in update.items():
        state[name].add_(delta)
        if name.endswith("running_var"):
            state[name].clamp_(min=0.0)
