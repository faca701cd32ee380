"""The one protocol of every stage component: what it carries from round to round, and what
its clients send the server besides their weights, both declared on the class.

Every component of a round's stages (the objective, the aggregator, the transforms before and
after aggregation, the planner, the observers, the layout) derives from `Stateful`. The engine
checkpoints each of them by its role (`Engine.components`). A component that keeps state (a
server momentum buffer, FedRolex's counts, SCAFFOLD's control variates) names the attributes
that hold it in `state`; saving and loading them is the protocol's default, so a resumed run
equals the run never stopped without a method of its own. A test runs a round of every
registered method and fails when an attribute that is not declared changes (tests/test_state.py):
state cannot be forgotten silently. Attributes a component recomputes as it goes (caches, the
last round's diagnostics) are declared `scratch`: they change, but are not state.

A component whose clients leave something for the server in `ClientUpdate.extra` (SCAFFOLD's
control-variate increments, FedLAG's last gradients) declares it in `sends`: the server checks
every reply against the declarations (names, shapes, dtypes: `expected_extra`) before it uses
one. Components are built from the method's typed parameters and the run's `Setup`
(fl/contracts.py), `cls(hp, setup)`; the layout, which builds the models the Setup names, from
its `LayoutInputs`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from incofl.fl.contracts import ClientPlan, State


@dataclass(frozen=True)
class Sent:
    """An entry of `ClientUpdate.extra` that a component's clients send: a state with one tensor
    per parameter the client trained, of that parameter's shape and dtype in its start weights.
    `asked_by`: the `ClientPlan` flag that asks for it (sent exactly when set; None: every round);
    `stepped_only`: sent exactly when the client took a local step (SCAFFOLD's: a round without
    one moves nothing), which the server knows from the client's share and the batch size."""

    key: str
    asked_by: str | None = None
    stepped_only: bool = False


Expected = dict[str, tuple[tuple[int, ...], torch.dtype]]  # entry -> its shape and dtype


class Stateful:
    """A stage component (module docstring): `state` names the attributes it carries across
    rounds (none by default), `scratch` those it changes but need not carry, `sends` what its
    clients leave for the server in `ClientUpdate.extra`."""

    state: ClassVar[tuple[str, ...]] = ()
    scratch: ClassVar[tuple[str, ...]] = ()
    sends: ClassVar[tuple[Sent, ...]] = ()

    def state_dict(self) -> dict[str, Any]:
        """Each declared attribute, copied (tensors to the CPU, numpy arrays as tensors: the
        checkpoint holds plain types and must not move on with the run)."""
        return {name: snapshot(getattr(self, name)) for name in self.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (each attribute in the kind it has now)."""
        for name in self.state:
            setattr(self, name, restore(state[name], getattr(self, name)))


def snapshot(value: Any) -> Any:
    """A checkpointable copy of an attribute's value: tensors detached on the CPU, numpy arrays
    as tensors, containers copied, other values as they are."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, dict):
        return {k: snapshot(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(snapshot(v) for v in value)
    return value


def restore(saved: Any, like: Any) -> Any:
    """`saved` (a `snapshot`) in the kind of the attribute's current value `like`: numpy where it
    is numpy, tensors cloned (a loaded checkpoint is not shared with the run)."""
    if isinstance(like, np.ndarray):
        return saved.numpy().astype(like.dtype) if isinstance(saved, torch.Tensor) else np.asarray(saved, like.dtype)
    if isinstance(saved, torch.Tensor):
        return saved.clone()
    if isinstance(saved, dict):
        return {k: restore(v, like.get(k) if isinstance(like, dict) else None) for k, v in saved.items()}
    if isinstance(saved, list | tuple):
        return type(saved)(restore(v, None) for v in saved)
    return saved


def expected_extra(
    components: Iterable[Stateful], plan: ClientPlan, start: State, params: Iterable[str], steps: int
) -> dict[str, Expected]:
    """Exactly what a planned client's update holds in `extra`, from the run's components'
    declarations: key -> each entry's shape and dtype. `start`: the client's start weights (their
    shapes are the sub-model's), `params`: its model's parameter names (the rest of `start` is
    buffers, which no client trains), `steps`: the local steps it takes."""
    trained = {
        name: (tuple(start[name].shape), start[name].dtype)
        for name in params
        if name in start and (plan.trainable is None or name in plan.trainable)
    }
    return {
        sent.key: trained
        for component in components
        for sent in component.sends
        if (sent.asked_by is None or getattr(plan, sent.asked_by)) and (steps > 0 or not sent.stepped_only)
    }
