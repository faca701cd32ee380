"""Local training: E epochs of shuffled (augmented) mini-batches of a client's samples, a step of
its objective's `Session` (fl/stages/objective.py) on each, with a fresh optimizer.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

from incofl.data.tensors import TensorSplit
from incofl.fl.stages.objective import Session
from incofl.fl.stages.sampling import trains_on


def make_optimizer(
    params: list[nn.Parameter], name: str, lr: float, momentum: float, weight_decay: float, capturable: bool = False
) -> torch.optim.Optimizer:
    """`capturable`: Adam's step count on the device, so a CUDA graph can replay its steps."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, capturable=capturable)


def client_batches(
    data: TensorSplit,
    indices: np.ndarray,
    epochs: int,
    batch_size: int,
    gen: torch.Generator,
    drop_last: bool = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """E epochs of shuffled (augmented) mini-batches over the client's samples, those it trains on (`trains_on`)."""
    idx = torch.from_numpy(indices)
    for _ in range(epochs):
        for batch in idx[torch.randperm(len(idx), generator=gen)].split(batch_size):
            if trains_on(len(batch), batch_size, drop_last):
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
