"""Local training, parameterised by a local objective.

An `Objective` is a small class with a few hooks (the FedAvg objective is the base class);
a method changes local training by overriding one or two of them. Objectives keep any
per-client state they need (SCAFFOLD's c_i, MOON's previous model) in `state_dict()`,
which the engine checkpoints. The methods live in `incofl.fl.objectives`, one module each.

Order in a round: for each sampled client `begin`, then per step `loss`, `after_backward`
and `after_step`, then `end`; then `before_aggregate` on all updates, the server rule, and
`server_round_end`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from incofl.data.tensors import TensorSplit


@dataclass
class ClientContext:
    """What one client's local training sees."""

    client: int
    group: int
    round: int
    model: nn.Module
    global_state: dict[str, torch.Tensor]  # the model's sub-state of the global weights (read-only)
    lr: float
    momentum: float = 0.0  # the local optimizer's heavy-ball momentum (SGD's; Adam has none)
    state: int = 0  # the server state (federation) the client trains from: 0 if shared, else its group
    federation_size: int = 1  # clients in that federation: K if shared, the group's size for `groupwise`
    steps: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ClientUpdate:
    """g_i = w_i - w for every floating-point state entry, with what aggregation needs."""

    client: int
    group: int
    delta: dict[str, torch.Tensor]
    num_samples: int
    steps: int
    state: int = 0  # the federation, as in ClientContext
    extra: dict[str, Any] = field(default_factory=dict)  # what an objective's `end` leaves for `before_aggregate`


class Objective:
    """FedAvg: plain cross-entropy. Subclasses override hooks; `params` are the method's
    hyper-parameters (unknown names are rejected), `model_args` those of them that configure
    the model rather than the loss (passed to `build_model`)."""

    params: dict[str, Any] = {}
    model_args: tuple[str, ...] = ()

    def __init__(self, **params: Any):
        self.hp = {**self.params, **params}

    def begin(self, ctx: ClientContext) -> None:
        """Before the first local step."""

    def loss(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(ctx.model(x), y)

    def after_backward(self, ctx: ClientContext) -> None:
        """Between backward and the optimizer step (gradient corrections)."""

    def after_step(self, ctx: ClientContext) -> None:
        """After the optimizer step (weight corrections)."""

    def end(self, ctx: ClientContext, update: ClientUpdate) -> ClientUpdate:
        """After local training; may transform the update before it is sent."""
        return update

    def before_aggregate(self, updates: list[ClientUpdate]) -> list[ClientUpdate]:
        """All of the round's updates, before the server rule averages them (e.g. FedNova's
        normalisation, which needs every sampled client's step count)."""
        return updates

    def server_round_end(self, updates: list[ClientUpdate], num_clients: int) -> None:
        """After aggregation (server-side method state)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""


def make_optimizer(
    params: list[nn.Parameter], name: str, lr: float, momentum: float, weight_decay: float
) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)


def local_train(
    ctx: ClientContext,
    objective: Objective,
    data: TensorSplit,
    indices: np.ndarray,
    *,
    epochs: int,
    batch_size: int,
    optimizer: torch.optim.Optimizer,
    gen: torch.Generator,
    autocast: bool = False,
) -> int:
    """E epochs of shuffled mini-batches over the client's samples; returns the step count.
    A trailing batch of one sample is skipped (BatchNorm cannot train on it)."""
    model = ctx.model
    model.train()
    objective.begin(ctx)
    idx = torch.from_numpy(indices)
    device_type = data.x.device.type
    for _ in range(epochs):
        for batch in idx[torch.randperm(len(idx), generator=gen)].split(batch_size):
            if len(batch) < 2:
                continue
            x, y = data.batch(batch, gen)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast):
                loss = objective.loss(ctx, x, y)
            loss.backward()
            objective.after_backward(ctx)
            optimizer.step()
            objective.after_step(ctx)
            ctx.steps += 1
    return ctx.steps


@torch.inference_mode()
def evaluate(model: nn.Module, data: TensorSplit, batch_size: int) -> tuple[float, float]:
    """(accuracy in percent, mean cross-entropy) on a whole split."""
    model.eval()
    correct, loss = 0, 0.0
    for batch in torch.arange(len(data)).split(batch_size):
        x, y = data.batch(batch)
        logits = model(x).float()
        loss += F.cross_entropy(logits, y, reduction="sum").item()
        correct += (logits.argmax(1) == y).sum().item()
    return 100.0 * correct / len(data), loss / len(data)
