"""The train stage: local training of the round's planned clients.

`SerialTrainer` trains one client after the other on its group's model object (reused with
`load_state_dict`, never a copy per client): load the global sub-state, freeze what the plan
does not train, a fresh optimizer over the trainable parameters, the objective's session,
E epochs of mini-batches, then the delta of the uploaded entries; it hands each client's
update on as soon as it has it, so a round never holds more than one. A batched trainer (clients
of one group side by side) can replace it: sessions are independent of each other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from incofl.data.tensors import TensorSplit
from incofl.fl.contracts import ClientContext, ClientPlan, ClientUpdate, Round, State
from incofl.fl.stages.local import client_batches, local_train, make_optimizer
from incofl.fl.stages.objective import ClientObjective
from incofl.fl.stages.sampling import client_seed

if TYPE_CHECKING:
    from incofl.sides import ClientSettings

Parts = Sequence[np.ndarray] | Mapping[int, np.ndarray]  # client -> its training indices (a node: its own only)


def set_trainable(model: nn.Module, trainable: frozenset[str] | None) -> list[nn.Parameter]:
    """requires_grad on exactly the planned parameters (all if None); returns them in order."""
    params = []
    for name, p in model.named_parameters():
        p.requires_grad_(trainable is None or name in trainable)
        if p.requires_grad:
            params.append(p)
    return params


def last_gradients(model: nn.Module) -> State:
    """Every trained parameter's gradient of the last local mini-batch (zero if it had none)."""
    return {
        name: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
        for name, p in model.named_parameters()
        if p.requires_grad
    }


def held_classes(data: TensorSplit, indices: np.ndarray) -> torch.Tensor:
    """The classes of `data` the samples at `indices` hold (sorted; on the data's device)."""
    return data.y[torch.from_numpy(indices).to(data.y.device)].unique()


class Trainer:
    """What every trainer holds: the client side's settings, the group models, the training split, the
    indices of each client it trains; and each client's batches of a round, from its own generator."""

    def __init__(
        self, settings: ClientSettings, models: list[nn.Module], data: TensorSplit, parts: Parts, autocast: bool
    ):
        self.settings, self.models, self.data, self.parts, self.autocast = settings, models, data, parts, autocast
        self.held: dict[int, torch.Tensor] = {}

    def classes(self, client: int) -> torch.Tensor:
        """The classes a client holds samples of (masked cross-entropy, HeteroFL's classifier rows)."""
        if client not in self.held:
            self.held[client] = held_classes(self.data, self.parts[client])
        return self.held[client]

    def batches(self, round_: Round, client: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        settings = self.settings
        gen = torch.Generator().manual_seed(client_seed(settings.seed, round_.index, client))
        return client_batches(
            self.data, self.parts[client], settings.local_epochs, settings.batch_size, gen, settings.drop_last
        )

    def assemble(
        self,
        plan: ClientPlan,
        start: State,
        final: State,
        params: set[str],
        steps: int,
        loss: float,
        last_grad: State | None,
    ) -> ClientUpdate:
        """A trained client's update, for every trainer: the delta of each uploaded
        floating-point entry from its `final` state (in state order), the entries it keeps, and
        with a `last_grad` plan its last mini-batch gradients. `params`: the model's parameter names."""
        delta = {k: final[k].detach() - start[k] for k in plan.uploaded(final)}
        kept = {k: v.detach().clone() for k, v in final.items() if k in plan.keep}
        return ClientUpdate(
            plan.client,
            plan.group,
            delta,
            len(self.parts[plan.client]),
            steps,
            federation=plan.federation,
            loss=loss,
            full=plan.full,
            upload_params=plan.upload_params(final, params),
            kept=kept,
            extra={"last_grad": last_grad} if plan.last_grad else {},
            view=plan.view,
            classes=self.classes(plan.client),
        )


class SerialTrainer(Trainer):
    def train(
        self,
        round_: Round,
        plans: list[ClientPlan],
        start_of: Callable[[ClientPlan], State],
        objective: ClientObjective,
    ) -> Iterator[ClientUpdate]:
        """Each planned client's update as soon as it is trained, in the plans' order (the
        server folds it in before the next client trains: fl/engine/fold.py)."""
        for plan in plans:
            yield self.train_client(round_, plan, start_of(plan), objective)

    def train_client(self, round_: Round, plan: ClientPlan, start: State, objective: ClientObjective) -> ClientUpdate:
        settings, model = self.settings, self.models[plan.group]
        model.load_state_dict(start)  # copies: `start` stays the untouched global weights
        params = set_trainable(model, plan.trainable)
        optimizer = make_optimizer(params, settings.optimizer, settings.lr, settings.momentum, settings.weight_decay)
        ctx = ClientContext(
            plan.client,
            plan.group,
            round_,
            model,
            start,
            settings.lr,
            federation=plan.federation,
            federation_size=plan.federation_size,
            rounds=settings.rounds,
            classes=self.classes(plan.client),
        )
        model.train()
        session = objective.session(ctx)
        loss = local_train(session, optimizer, self.batches(round_, plan.client), self.autocast)
        params = {name for name, _ in model.named_parameters()}
        last_grad = last_gradients(model) if plan.last_grad else None
        update = self.assemble(plan, start, model.state_dict(), params, ctx.steps, loss, last_grad)
        return session.end(update)
