"""Sub-models cut in width and depth as index maps (docs/methods.md, hetero splitting).

A client of a width level trains a sub-model whose state entries are a name-subset of the
global (server) model's, each a block of it: per dimension, the global indices of the sub-
tensor's entries (`Index`; None where the dimension is whole). HeteroFL keeps the leading
channels; FedRolex a rolling window, channels (j - t) mod C for j < c after t rounds. The
window depends only on (C, c, t), so a layer's output channels and the next layer's input
channels (equal C) always get the same map, and image channels and class rows (never cut)
are whole. Extraction (`extract`) reads the blocks; aggregation (`sliced_mean`) scatters the
clients' deltas back with a per-element count: never a copy of the full model per client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence, Set
from dataclasses import dataclass

import torch

from incofl.fl.contracts import Index, State

# A client's weight per element of a block (entry name, its index, the delta); None: weight 1
Weigh = Callable[[str, Index, torch.Tensor], torch.Tensor | None]


def window(full: int, sub: int, offset: int = 0) -> torch.Tensor | None:
    """The global channels a sub-layer of `sub` of `full` channels holds after `offset` rounds
    of rolling (FedRolex; offset 0: HeteroFL's leading channels). None: all, in order."""
    if sub == full:
        return None
    if not 0 < sub < full:
        raise ValueError(f"a sub-layer of {sub} channels cannot be cut from {full}")
    return (torch.arange(sub) - offset) % full


def index_map(full: dict[str, torch.Size], sub: dict[str, torch.Size], offset: int = 0) -> dict[str, Index]:
    """Every entry of the sub-model: per dimension its window of the full entry's."""
    index = {}
    for name, shape in sub.items():
        if name not in full or len(full[name]) != len(shape):
            raise ValueError(f"{name} {tuple(shape)} is not a block of the server model")
        index[name] = tuple(window(f, s, offset) for f, s in zip(full[name], shape, strict=True))
    return index


def _grid(index: Index, shape: torch.Size, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Broadcastable indices of every position of a block of `shape` (index_put_ takes tensors
    only, so a whole dimension is spelled out)."""
    grid = []
    for d, (ix, n) in enumerate(zip(index, shape, strict=True)):
        view = [1] * len(shape)
        view[d] = -1
        grid.append((torch.arange(n) if ix is None else ix).to(device).view(view))
    return tuple(grid)


def take(tensor: torch.Tensor, index: Index) -> torch.Tensor:
    """The block of `tensor` an index selects (a view when no dimension is windowed)."""
    for d, ix in enumerate(index):
        if ix is not None:
            tensor = tensor.index_select(d, ix.to(tensor.device))
    return tensor


def extract(state: State, index: dict[str, Index]) -> State:
    """A sub-model's state: the block of each of its entries."""
    return {name: take(state[name], ix) for name, ix in index.items()}


def scatter_add(target: torch.Tensor, index: Index, block: torch.Tensor) -> None:
    """target[block's positions] += block (each position once: no two entries of an index collide)."""
    target.index_put_(_grid(index, block.shape, target.device), block.to(target.dtype), accumulate=True)


@dataclass
class Sliced:
    """Per-element (weighted) sums and holder counts (total weights) of one federation's round,
    in the server's shapes."""

    sums: State
    counts: State

    def add(
        self, name: str, index: Index, delta: torch.Tensor, shape: torch.Size, weight: torch.Tensor | None = None
    ) -> None:
        if name not in self.sums:
            self.sums[name] = torch.zeros(shape, dtype=delta.dtype, device=delta.device)
            self.counts[name] = torch.zeros(shape, dtype=delta.dtype, device=delta.device)
        if weight is None:
            scatter_add(self.sums[name], index, delta)
            scatter_add(self.counts[name], index, torch.ones_like(delta))
        else:
            scatter_add(self.sums[name], index, weight * delta)
            scatter_add(self.counts[name], index, weight)

    def add_client(
        self,
        shapes: dict[str, torch.Size],
        delta: State,
        index: dict[str, Index],
        classifier: Set[str] = frozenset(),
        classes: torch.Tensor | None = None,
        weigh: Weigh | None = None,
    ) -> None:
        """One client's blocks; with `classes`, of its `classifier` entries only the rows of those
        classes; with `weigh`, its weights (`sliced_mean`)."""
        for name, d in delta.items():
            ix = index[name]
            if name in classifier and classes is not None:
                ix = rows_of(ix, classes)
                d = d.index_select(0, ix[0].to(d.device))
            self.add(name, ix, d, shapes[name], None if weigh is None else weigh(name, ix, d))

    def mean(self) -> tuple[State, dict[str, torch.Tensor]]:
        """(the per-element mean over the clients covering each element, 0 where none did; which were covered)."""
        covered = {name: c > 0 for name, c in self.counts.items()}
        return {name: s / self.counts[name].clamp(min=1) for name, s in self.sums.items()}, covered


def rows_of(index: Index, classes: torch.Tensor) -> Index:
    """A classifier entry's index narrowed to the rows of `classes`: rows are never cut, so a
    class's row has the same position in the sub-tensor and in the full one."""
    return (classes.to(torch.long).cpu(), *index[1:])


def sliced_mean(
    shapes: dict[str, torch.Size],
    deltas: Sequence[tuple[State, dict[str, Index]]],
    class_rows: Iterable[tuple[set[str], torch.Tensor | None]] = (),
    weigh: Weigh | None = None,
) -> tuple[State, dict[str, torch.Tensor]]:
    """Every element's unweighted mean over the clients whose block holds it; with `class_rows`
    (per client: its classifier entries and its classes), a classifier row only from the
    clients holding that class; with `weigh`, asked in client order, each client's weights.
    Returns (mean, covered) in the server's shapes for every entry some client uploaded; elements
    no client covered are 0 in the mean (they keep their value)."""
    acc = Sliced({}, {})
    rows = list(class_rows) or [(set(), None)] * len(deltas)
    for (delta, index), (classifier, classes) in zip(deltas, rows, strict=True):
        acc.add_client(shapes, delta, index, classifier, classes, weigh)
    return acc.mean()
