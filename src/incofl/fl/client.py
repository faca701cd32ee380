"""Local training, parameterised by a local objective.

An `Objective` holds what a method keeps across rounds (SCAFFOLD's control variates, MOON's
previous models) and opens one `Session` per client and round: the session holds what one
client's training needs (its anchors, its corrections, its frozen models), so two clients can
train side by side. FedAvg is the base pair (plain cross-entropy); a method overrides a hook
or two. The methods live in `incofl.fl.objectives`, one module each.

Order for one client: `objective.session(ctx)`, then per step `loss`, `after_backward` and
`after_step`, then `end(update)`; once the round's updates are aggregated and applied,
`objective.server_round_end(updates)`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from incofl.data.tensors import TensorSplit
from incofl.fl.slicing import View
from incofl.models.family import exit_logits
from incofl.params import Params
from incofl.streams import EVAL_ORDER_SEED


@dataclass
class ClientContext:
    """What one client's local training sees."""

    client: int
    group: int
    round: int
    model: nn.Module
    global_state: dict[str, torch.Tensor]  # the model's sub-state of the global weights (read-only)
    lr: float
    state: int = 0  # the server state (federation) the client trains from: 0 if shared, else its group
    federation_size: int = 1  # clients in that federation: K if shared, the group's size for `groupwise`
    steps: int = 0
    rounds: int = 0  # rounds of the run (schedules inside a loss: ScaleFL's distillation start)
    classes: torch.Tensor | None = None  # the classes the client holds samples of (masked cross-entropy)


@dataclass
class ClientUpdate:
    """g_i = w_i - w for every uploaded floating-point state entry, with what aggregation needs."""

    client: int
    group: int
    delta: dict[str, torch.Tensor]
    num_samples: int
    steps: int
    state: int = 0  # the federation, as in ClientContext
    extra: dict[str, Any] = field(default_factory=dict)  # what a session's `end` leaves for the server
    loss: float = float("nan")  # mean training loss over the local steps
    full: bool = True  # every parameter trained (compute: 3 units a sample; partial rounds 2)
    upload_params: int = 0  # parameters (not buffers) uploaded
    kept: dict[str, torch.Tensor] = field(default_factory=dict)  # entries the client keeps (bn_stats: local)
    view: View | None = None  # width splitting: where the (sub-shaped) deltas sit in the global model
    classes: torch.Tensor | None = None  # the classes the client holds (HeteroFL's classifier rows)


class Session:
    """One client's local training under FedAvg's objective: plain cross-entropy."""

    def __init__(self, objective: Objective, ctx: ClientContext):
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


class Objective:
    """FedAvg. `session_type` is the per-client part; `model_args` name the parameters that
    configure the model rather than the loss (MOON's projection head, for `build_model`)."""

    session_type: ClassVar[type[Session]] = Session
    model_args: ClassVar[tuple[str, ...]] = ()

    def __init__(self, hp: Params):
        self.hp = hp

    def begin(self, initial: dict[str, torch.Tensor]) -> None:
        """Once before training (again on resume): the server model's initial weights (read-only)."""

    def session(self, ctx: ClientContext) -> Session:
        return self.session_type(self, ctx)

    def server_round_end(self, updates: list[ClientUpdate]) -> None:
        """After aggregation (server-side method state)."""

    def batched_correction(self, weights: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> dict:
        """The batched trainer's form of a session whose one hook adds a correction to the
        gradients: the correction of each trained entry, for stacked weights (one row per client)
        and their stacked start values. An objective that defines it `corrects()`."""
        raise NotImplementedError(f"{type(self).__name__} has no batched gradient correction")

    @classmethod
    def corrects(cls) -> bool:
        return cls.batched_correction is not Objective.batched_correction

    @classmethod
    def batchable(cls) -> bool:
        """The batched trainer can train it: plain cross-entropy sessions, or a gradient
        correction it also gives in batched form, and no `end` of its own."""
        return cls.session_type.end is Session.end and (cls.session_type is Session or cls.corrects())

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


def client_batches(
    data: TensorSplit,
    indices: np.ndarray,
    epochs: int,
    batch_size: int,
    gen: torch.Generator,
    drop_last: bool = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """E epochs of shuffled (augmented) mini-batches over the client's samples. A trailing
    batch of one sample is skipped (BatchNorm cannot train on it); with `drop_last` every
    incomplete batch is (the release's loaders: a client with fewer samples than a batch
    does not train)."""
    idx = torch.from_numpy(indices)
    smallest = batch_size if drop_last else 2
    for _ in range(epochs):
        for batch in idx[torch.randperm(len(idx), generator=gen)].split(batch_size):
            if len(batch) >= smallest:
                yield data.batch(batch, gen)


def train_step(
    session: Session, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, autocast: bool = False
) -> torch.Tensor:
    """One local step; returns the (detached) loss without a host sync."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
        loss = session.loss(x, y)
    loss.backward()
    session.after_backward()
    optimizer.step()
    session.after_step()
    session.ctx.steps += 1
    return loss.detach()


def local_train(
    session: Session,
    optimizer: torch.optim.Optimizer,
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
    autocast: bool = False,
) -> float:
    """Every batch one step; returns the mean training loss (one host sync, at the end)."""
    total = None
    for x, y in batches:
        loss = train_step(session, optimizer, x, y, autocast)
        total = loss if total is None else total + loss
    return float(total) / session.ctx.steps if total is not None else float("nan")


@torch.inference_mode()
def evaluate(
    model: nn.Module, data: TensorSplit, batch_size: int, drop_last: bool = False, indices: torch.Tensor | None = None
) -> tuple[float, float]:
    """(accuracy in percent, mean cross-entropy) on a split, or on `indices` of it; with
    `drop_last` on its full batches only (as released: 9,728 of CIFAR-10's 10,000 test images
    in batches of 512)."""
    correct, loss, n = count_correct(model, data, batch_size, drop_last, indices)
    return 100.0 * correct / n, loss / n


@torch.inference_mode()
def count_correct(
    model: nn.Module, data: TensorSplit, batch_size: int, drop_last: bool = False, indices: torch.Tensor | None = None
) -> tuple[int, float, int]:
    """(correct predictions, summed cross-entropy, samples scored) of the model's (last) output."""
    correct, loss, n = exit_counts(model, data, batch_size, drop_last, indices)
    return correct[-1], loss[-1], n


def batch_statistics(model: nn.Module) -> bool:
    """Whether the model's BN layers normalise with the batch's statistics at evaluation too
    (no running statistics: ScaleFL's ResNet-110, width models without static BN)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is None for m in model.modules())


def mixed_order(order: torch.Tensor) -> torch.Tensor:
    """`order` shuffled by a fixed seed, the same for every run and evaluation: all methods score
    the same batches. With batch statistics a prediction depends on the rest of its batch, and
    data sets read from class folders (the CIFAR-10 archive here) list each class together:
    scored in that order, every batch is one class and its statistics erase what tells classes
    apart (ScaleFL stayed near chance). torchvision's CIFAR-10 test set is mixed alike."""
    return order[torch.randperm(len(order), generator=torch.Generator().manual_seed(EVAL_ORDER_SEED))]


@torch.inference_mode()
def exit_counts(
    model: nn.Module, data: TensorSplit, batch_size: int, drop_last: bool = False, indices: torch.Tensor | None = None
) -> tuple[list[int], list[float], int]:
    """Per exit (one for a model without early exits): correct predictions and summed
    cross-entropy; and the samples scored. A model that normalises with each batch's own
    statistics scores the samples in a fixed shuffled order (`mixed_order`)."""
    model.eval()
    order = torch.arange(len(data)) if indices is None else indices
    if batch_statistics(model):
        order = mixed_order(order)
    n = len(order) // batch_size * batch_size if drop_last and len(order) >= batch_size else len(order)
    correct: list[int] = []
    loss: list[float] = []
    for batch in order[:n].split(batch_size):
        x, y = data.batch(batch)
        outs = [z.float() for z in exit_logits(model(x))]
        correct, loss = correct or [0] * len(outs), loss or [0.0] * len(outs)
        for j, logits in enumerate(outs):
            loss[j] += F.cross_entropy(logits, y, reduction="sum").item()
            correct[j] += int((logits.argmax(1) == y).sum().item())
    return correct or [0], loss or [0.0], n
