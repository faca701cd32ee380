"""The aggregate and apply stages (docs/methods.md).

An aggregator turns the round's client updates into one averaged update per server state
(federation): `GroupWise` keeps one state per model group (each group its own federation),
`Shared` one global state of which every group trains its name-subset (HeteroAvg; InCo is
HeteroAvg followed by the InCo transform). Each entry is averaged over the clients that
uploaded it, so a client that trains or uploads only part of its model (a partial round)
counts only where it uploaded.

Aggregation streams: a round's `Fold` adds each client's update into running sums as it
arrives (`add`, in client order) and divides once the round's last is in (`averages`), so a
round holds one model's worth of sums per server state, never every update. The sums are the
same floats as adding the whole round's updates in client order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import torch

from incofl.fl.contracts import Average, ClientUpdate, Setup, State
from incofl.fl.stages.component import Stateful
from incofl.params import AggregationParams


class Sums:
    """Running (sample-weighted if asked) sums of each entry over the clients that hold it, and
    their total weights: `mean_over_holders` one update at a time."""

    def __init__(self, weighted: bool = False):
        self.weighted = weighted
        self.sums: State = {}
        self.totals: dict[str, float] = {}

    def add(self, update: ClientUpdate) -> None:
        w = float(update.num_samples) if self.weighted else 1.0
        for name, delta in update.delta.items():
            if name in self.sums:
                self.sums[name].add_(delta, alpha=w)
            else:
                self.sums[name] = delta * w if self.weighted else delta.clone()
            self.totals[name] = self.totals.get(name, 0.0) + w

    def mean(self) -> Average:
        """Each sum divided by its total weight (in place: a `Sums` is done after it)."""
        return {name: s.div_(self.totals[name]) for name, s in self.sums.items()}


def mean_over_holders(updates: Iterable[ClientUpdate], weighted: bool = False) -> Average:
    """Every entry averaged over the clients that hold it (sample-weighted if asked): the InCo
    paper's HeteroAvg over a shared state, FedAvg within a group."""
    sums = Sums(weighted)
    for u in updates:
        sums.add(u)
    return sums.mean()


class Fold:
    """One round's aggregation in progress: `add` each client's update (in client order), then
    `averages` once: one averaged update per federation that got one, and with width splitting
    per federation which elements some client covered (`covered`)."""

    def __init__(self) -> None:
        self.covered: dict[int, State] = {}

    def add(self, update: ClientUpdate) -> None:
        raise NotImplementedError

    def averages(self) -> dict[int, Average]:
        raise NotImplementedError


class Aggregator(Stateful):
    """Turns the round's client updates into one averaged update per federation (server state).
    `shared`: one global state for every model group, else one per group. What it carries from
    round to round (FedRolex's released counts) is its declared `state`: none here."""

    shared: ClassVar[bool]

    def __init__(self, hp: AggregationParams, setup: Setup):
        """`setup`: the run's Setup, for aggregators that need the server's shapes."""
        self.weighted = hp.weighted

    @classmethod
    def federation(cls, group: int) -> int:
        """The server state a group's clients train from and update (known before one is built:
        the planner's `Setup.federation`)."""
        return 0 if cls.shared else group

    def fold(self) -> Fold:
        """A round's running aggregation (module docstring)."""
        raise NotImplementedError

    def aggregate(self, updates: Iterable[ClientUpdate]) -> dict[int, Average]:
        """A whole round's updates at once: `fold` them all."""
        fold = self.fold()
        for u in updates:
            fold.add(u)
        return fold.averages()


class SharedFold(Fold):
    def __init__(self, weighted: bool):
        super().__init__()
        self.sums = Sums(weighted)

    def add(self, update: ClientUpdate) -> None:
        self.sums.add(update)

    def averages(self) -> dict[int, Average]:
        return {0: self.sums.mean()}


class GroupFold(Fold):
    def __init__(self, weighted: bool):
        super().__init__()
        self.weighted = weighted
        self.groups: dict[int, Sums] = {}

    def add(self, update: ClientUpdate) -> None:
        self.groups.setdefault(update.group, Sums(self.weighted)).add(update)

    def averages(self) -> dict[int, Average]:
        return {g: self.groups[g].mean() for g in sorted(self.groups)}


class Shared(Aggregator):
    """HeteroAvg: one shared global state; every entry averaged over the sampled clients that hold it."""

    shared = True

    def fold(self) -> Fold:
        return SharedFold(self.weighted)


class GroupWise(Aggregator):
    """The paper's FedAvg baseline: each model group averages only its own clients."""

    shared = False

    def fold(self) -> Fold:
        return GroupFold(self.weighted)


def apply_update(state: dict[str, torch.Tensor], update: Average) -> None:
    """w <- w + g (no server learning rate); BN running variances stay >= 0."""
    for name, delta in update.items():
        state[name].add_(delta)
        if name.endswith("running_var"):
            state[name].clamp_(min=0.0)
