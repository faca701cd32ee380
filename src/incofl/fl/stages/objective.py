"""A method's local objective, in two halves, each built on its own side of the run
(fl/engine/server.py, fl/engine/clients.py), in the simulator as in a federation.

The server half (`Objective`) holds what the method keeps on the server (SCAFFOLD's control
variates), says what its clients read of it besides the weights (`broadcast(federation)`) and
folds in what they send back (`server_add` as each update is aggregated, in client order: what the
round's end needs, SCAFFOLD's sum of increments, never the update itself; `server_round_end` once
the round is applied). The client half (`ClientObjective`) takes a copy of each broadcast
(`receive(federation, state)`, before training: fl/engine/exchange.py), keeps per client what the
method keeps there (SCAFFOLD's c_i, MOON's previous models, in the run's `ClientStore`) and opens
one `Session` per client and round: the session holds what one client's training needs (its
anchors, its corrections, its frozen models), so two clients can train side by side, and reaches
the server's state only through what was delivered. FedAvg is the base pair (plain
cross-entropy); a method overrides a hook or two. The methods live in `incofl.fl.methods`, one
module or folder per family.

Order for one client (the loop is local.py's): `objective.session(ctx)`, then per step `loss`,
`after_backward` and `after_step`, then `end(update)`. Each half's state across rounds is its
`state_dict` (fl/stages/component.py); the server half names its client half (`client`), and a
method's registry entry names the server half. This module holds no training loop, data or
optimizer, so building a server (which loads the server halves) loads none.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from incofl.fl.contracts import ClientContext, ClientUpdate, Setup, State
from incofl.fl.stages.clientstore import ClientStore
from incofl.fl.stages.component import Stateful
from incofl.params import Params


class Session:
    """One client's local training under FedAvg's objective: plain cross-entropy."""

    def __init__(self, objective: ClientObjective, ctx: ClientContext):
        self.objective, self.ctx = objective, ctx

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.ctx.model(x), y)

    def after_backward(self) -> None:
        """Between backward and the optimizer step (gradient corrections)."""

    def after_step(self) -> None:
        """After the optimizer step (weight corrections)."""

    def end(self, update: ClientUpdate) -> ClientUpdate:
        """After local training; may transform the update before it is sent."""
        return update


class ClientObjective(Stateful):
    """FedAvg's client half. `session_type` is the per-client part; `model_args` name the
    parameters that configure the model rather than the loss (MOON's projection head, for
    `build_model`)."""

    session_type: ClassVar[type[Session]] = Session
    model_args: ClassVar[tuple[str, ...]] = ()

    def __init__(self, hp: Params, setup: Setup):
        self.hp = hp
        self.store = setup.store or ClientStore()  # what each client keeps across rounds

    def begin(self, initial: dict[str, torch.Tensor]) -> None:
        """Once before training: the models' initial weights (read-only)."""

    def receive(self, federation: int, state: State) -> None:
        """Take what the server half's `broadcast(federation)` sent, before the client trains."""

    def session(self, ctx: ClientContext) -> Session:
        return self.session_type(self, ctx)

    def batched_correction(self, weights: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> dict:
        """The batched trainer's form of a session whose one hook adds a correction to the
        gradients: the correction of each trained entry, for stacked weights (one row per client)
        and their stacked start values. An objective that defines it `corrects()`."""
        raise NotImplementedError(f"{type(self).__name__} has no batched gradient correction")

    @classmethod
    def corrects(cls) -> bool:
        return cls.batched_correction is not ClientObjective.batched_correction

    @classmethod
    def capturable(cls) -> bool:
        """Its local steps can replay as CUDA graphs (`cuda_graphs`): plain cross-entropy sessions."""
        return cls.session_type is Session

    @classmethod
    def batchable(cls) -> bool:
        """The batched trainer can train it: plain cross-entropy sessions, or a gradient
        correction it also gives in batched form, and no `end` of its own."""
        return cls.session_type.end is Session.end and (cls.session_type is Session or cls.corrects())


class Objective(Stateful):
    """FedAvg's server half: nothing to broadcast or fold in. `client`: its client half."""

    client: ClassVar[type[ClientObjective]] = ClientObjective

    def __init__(self, hp: Params, setup: Setup):
        self.hp = hp

    def begin(self, initial: dict[str, torch.Tensor]) -> None:
        """Once before training (again on resume): the server model's initial weights (read-only)."""

    def broadcast(self, federation: int) -> State:
        """What a client of `federation` reads of this half's state besides the weights (module
        docstring); none for FedAvg."""
        return {}

    def server_add(self, update: ClientUpdate) -> None:
        """As each of the round's updates is aggregated (in client order)."""

    def server_round_end(self) -> None:
        """After the round's aggregation is applied (server-side method state)."""
