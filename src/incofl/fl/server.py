"""Server-side aggregation rules (METHODS.md section 4).

A rule turns the round's client updates into one averaged update per server state:
`groupwise` keeps one state per model group (each group its own federation), `heteroavg`
and `inco` one shared global state of which every group trains its name-subset.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from incofl.fl.client import ClientUpdate
from incofl.fl.inco import InCoOptions, cross_layer_update, vit_pairs


def heteroavg(updates: Sequence[ClientUpdate], weighted: bool = False) -> dict[str, torch.Tensor]:
    """Every entry averaged over the clients that hold it (sample-weighted if asked)."""
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


class ServerRule:
    """Base rule: `heteroavg` over all sampled clients into one shared state."""

    shared = True

    def __init__(self, weighted: bool = False):
        self.weighted = weighted
        self.stats: dict[str, dict[str, float]] = {}  # per-round diagnostics, e.g. InCo's theta/beta

    def state_index(self, group: int) -> int:
        return 0 if self.shared else group

    def aggregate(self, updates: Sequence[ClientUpdate]) -> dict[int, dict[str, torch.Tensor]]:
        return {0: heteroavg(updates, self.weighted)}


class GroupWise(ServerRule):
    """The paper's FedAvg baseline: each model group averages only its own clients."""

    shared = False

    def aggregate(self, updates: Sequence[ClientUpdate]) -> dict[int, dict[str, torch.Tensor]]:
        groups = sorted({u.group for u in updates})
        return {g: heteroavg([u for u in updates if u.group == g], self.weighted) for g in groups}


class InCo(ServerRule):
    """`heteroavg`, then internal cross-layer gradients on the averaged update.

    The authors' code divides every ViT client update by the number of local epochs before
    averaging; `official` on ViT pairs does the same (on the average: the mean is linear)."""

    def __init__(self, pairs: dict[str, str], options: InCoOptions, weighted: bool = False, local_epochs: int = 1):
        super().__init__(weighted)
        self.pairs, self.options = pairs, options
        self.scale = 1.0 / local_epochs if options.variant == "official" and vit_pairs(pairs) else 1.0

    def aggregate(self, updates: Sequence[ClientUpdate]) -> dict[int, dict[str, torch.Tensor]]:
        self.stats = {}
        average = heteroavg(updates, self.weighted)
        if self.scale != 1.0:
            average = {k: v.mul_(self.scale) for k, v in average.items()}
        return {0: cross_layer_update(average, self.pairs, stats=self.stats, **vars(self.options))}


def apply_update(state: dict[str, torch.Tensor], update: dict[str, torch.Tensor]) -> None:
    """w <- w + g (no server learning rate); BN running variances stay >= 0."""
    for name, delta in update.items():
        state[name].add_(delta)
        if name.endswith("running_var"):
            state[name].clamp_(min=0.0)
