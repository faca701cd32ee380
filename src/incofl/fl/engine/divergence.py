"""Divergence: a run stops at the first non-finite training loss or server weight.

A diverged run is a result, not a crash: it writes summary.json with `"status": "diverged"`
(and where it happened), tables and figures show it as diverged and never average it in, and
`incofl train` exits with code 3 and one line (the workflow accepts that code: the run is done).
"""

from __future__ import annotations

import math

import torch

from incofl.errors import Diverged
from incofl.fl.contracts import ClientUpdate


def first_nonfinite(tensors: dict[str, torch.Tensor]) -> str | None:
    """The name of the first floating-point tensor with a NaN or inf (one host sync when there is
    none). A NaN or inf makes a tensor's sum NaN or inf, and a sum is ~25x cheaper than an
    elementwise check (every client's update is checked): only a non-finite sum (or one that
    overflowed) is looked at element by element."""
    floats = [(name, t) for name, t in tensors.items() if t.is_floating_point()]
    if not floats or bool(torch.stack([t.sum().double() for _, t in floats]).isfinite().all()):
        return None
    finite = torch.stack([torch.isfinite(t).all() for _, t in floats])
    return None if bool(finite.all()) else floats[int((~finite).nonzero()[0, 0])][0]


def check_updates(round_: int, updates: list[ClientUpdate]) -> None:
    """A client that took steps and ended with a non-finite loss or update."""
    for u in updates:
        if u.steps and not math.isfinite(u.loss):
            raise Diverged(round_, f"client {u.client}'s training loss is {u.loss}")
        bad = first_nonfinite(u.delta)
        if bad is not None:
            raise Diverged(round_, f"client {u.client}'s update of {bad} is not finite")


def check_states(round_: int, states: list[dict[str, torch.Tensor]]) -> None:
    for state in states:
        bad = first_nonfinite(state)
        if bad is not None:
            raise Diverged(round_, f"server weight {bad} is not finite")
