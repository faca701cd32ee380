"""Width splitting's aggregation (`SlicedMean`): every element's unweighted mean over the
sampled clients that covered it, classifier rows only from clients holding the class
(`class_rows`: HeteroFL, FedRolex); elements no client covered keep their value. FedRolex's
`RolexMean` is that mean, or with `weighting: released` its release's count weighting
(docs/fedrolex-weighting.md). The round's fold also says which elements were covered (the post
transforms' `RoundContext.covered`), so the InCo step touches only slices both target and
reference cover.
"""

from __future__ import annotations

from typing import Any

import torch

from incofl.fl.contracts import Average, ClientUpdate, Index, Setup, State
from incofl.fl.methods.width.slicing import Sliced, Weigh, scatter_add, take
from incofl.fl.stages.aggregate import Fold, Shared

CLASSIFIER = frozenset({"fc.weight", "fc.bias"})  # the width models' class rows


class SlicedFold(Fold):
    """A round's per-element sums and holder counts in the server's shapes."""

    def __init__(self, aggregator: SlicedMean):
        super().__init__()
        self.aggregator, self.acc = aggregator, Sliced({}, {})

    def add(self, update: ClientUpdate) -> None:
        a = self.aggregator
        classes = update.classes if a.class_rows else None
        self.acc.add_client(a.shapes, update.delta, update.view.index, CLASSIFIER, classes, a.weigh)

    def averages(self) -> dict[int, Average]:
        mean, self.covered[0] = self.acc.mean()
        return {0: mean}


class SlicedMean(Shared):
    """Per-element mean over the clients that covered each element (module docstring)."""

    def __init__(self, hp: Any, setup: Setup):  # unweighted (HeteroFL's release): no `weighted`
        self.shapes, self.class_rows = setup.layout.widths.shapes, hp.class_rows
        self.weigh: Weigh | None = None

    def fold(self) -> Fold:
        return SlicedFold(self)


class RolexMean(SlicedMean):
    """FedRolex's aggregation. `weighting: mean` (default) is SlicedMean: the paper's selective
    average, each element over the clients whose sub-model holds it, every holder once. It is
    the default because it is the algorithm the paper states; the counts below appear only in
    the code. `released` is the release's server (`combine`): convolution weights as that mean,
    every other entry (BN weight and bias, the classifier) weighted by `tmp_counts`, 1 + how
    often each element was covered before, over all rounds, with this round's earlier clients
    already counted. The counts persist across rounds: this aggregator's checkpointed state."""

    state = ("times",)

    def __init__(self, hp: Any, setup: Setup):
        super().__init__(hp, setup)
        self.times: State = {}  # per weighted entry: the release's tmp_counts (1 + times covered)
        if hp.weighting == "released":
            self.weigh = self.times_held

    def times_held(self, name: str, index: Index, delta: torch.Tensor) -> torch.Tensor | None:
        """A client's weights on its block (asked in client order), then its hold counted: the
        m-th holder of an element in a round weighs 1 + earlier holds + (m - 1). The release's
        first entry reads the counts of the round's start; its and incofl's first entry is
        `conv1.weight`, which is unweighted, so that never matters."""
        if delta.dim() > 1 and name not in CLASSIFIER:  # a convolution weight: the release's K = 1
            return None
        times = self.times.get(name)
        if times is None:
            times = torch.ones(self.shapes[name], dtype=delta.dtype)
        self.times[name] = times = times.to(delta.device)
        weight = take(times, index).clone()  # take may return a view of `times`
        scatter_add(times, index, torch.ones_like(delta))
        return weight
