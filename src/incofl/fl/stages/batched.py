"""The train stage with the clients of one model group side by side (`trainer: batched`).

`BatchedTrainer` stacks the start states of the round's clients that train the same model
with the same trainable parameters and takes their local steps together: one `torch.func`
`vmap` of forward and backward over the stacked weights instead of one model per client, so
a GPU runs one kernel where the serial trainer launches one per client. Each client still
draws its batches and augmentation from its own generator (the serial trainer's data,
exactly). In step t every client that has a t-th batch steps; clients whose batches have the
same size go through one vmap (a shorter last batch goes with others of its size), and a
client with fewer batches drops out once it has had them. The optimizer is torch.optim's SGD
(momentum, weight decay) and Adam arithmetic on the rows of the stacked tensors; BatchNorm
running statistics are stacked buffers updated in place, as in the serial trainer.

The updates equal SerialTrainer's up to floating-point reassociation (tests/test_batched.py
pins the tolerance); dropout would draw differently. Only objectives without session hooks of
their own, or whose hook is a gradient correction they also give in batched form
(`ClientObjective.batched_correction`: FedProx), can be batched (`ClientObjective.batchable`); SCAFFOLD
and MOON are refused at config time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from incofl.fl.contracts import ClientPlan, ClientUpdate, Round, State
from incofl.fl.stages.objective import ClientObjective
from incofl.fl.stages.trainer import Trainer

if TYPE_CHECKING:
    from incofl.sides import ClientSettings

Batch = tuple[torch.Tensor, torch.Tensor]


class RowOptimizer:
    """torch.optim's SGD and Adam (defaults as `make_optimizer` builds them) on chosen rows of
    stacked weights. Every client steps from its first batch on, so the rows stepping
    together always have the same step count. Its state starts at zero, so SGD's first step
    (0 * momentum + d) is torch's (d), and weights and state change in place."""

    def __init__(self, settings: ClientSettings, weights: State):
        self.settings = settings
        slots = 2 if settings.optimizer == "adam" else int(settings.momentum > 0)
        self.state = {k: [torch.zeros_like(w) for _ in range(slots)] for k, w in weights.items()}

    def step(self, weights: State, grads: State, rows: torch.Tensor | None, step: int) -> None:
        """Update `weights[k][rows]` (all rows if None) with `grads[k]` (one row per updated row)."""
        for k, g in grads.items():
            slots = self.state[k]
            p = weights[k] if rows is None else weights[k][rows]
            s = slots if rows is None else [v[rows] for v in slots]
            new, s = self.rule(p, g, s, step)
            for old, value in zip([weights[k], *slots], [new, *s], strict=True):
                if rows is None:
                    old.copy_(value)
                else:
                    old[rows] = value

    def masked(self, weights: State, grads: State, mask: torch.Tensor, step: torch.Tensor) -> None:
        """Update every row where `mask` holds (the others keep theirs): a shape a CUDA graph replays."""
        for k, g in grads.items():
            slots = self.state[k]
            new, s = self.rule(weights[k], g, slots, step)
            keep = mask.view(-1, *[1] * (g.dim() - 1))
            for old, value in zip([weights[k], *slots], [new, *s], strict=True):
                old.copy_(torch.where(keep, value, old))

    def rule(self, p: torch.Tensor, g: torch.Tensor, s: list, step: int | torch.Tensor) -> tuple[torch.Tensor, list]:
        return (self._adam if self.settings.optimizer == "adam" else self._sgd)(p, g, s, step)

    def _sgd(self, p: torch.Tensor, g: torch.Tensor, s: list[torch.Tensor], step: int) -> tuple[torch.Tensor, list]:
        settings = self.settings
        d = g + settings.weight_decay * p if settings.weight_decay else g
        if settings.momentum:
            d = s[0] * settings.momentum + d
            s = [d]
        return p - settings.lr * d, s

    def _adam(
        self, p: torch.Tensor, g: torch.Tensor, s: list[torch.Tensor], step: int | torch.Tensor
    ) -> tuple[torch.Tensor, list]:
        (beta1, beta2), eps, t = (0.9, 0.999), 1e-8, step + 1
        g = g + self.settings.weight_decay * p if self.settings.weight_decay else g
        avg = s[0].lerp(g, 1 - beta1)
        sq = s[1] * beta2 + (1 - beta2) * g * g
        denom = sq.sqrt() / (1 - beta2**t) ** 0.5 + eps
        return p - (self.settings.lr / (1 - beta1**t)) * avg / denom, [avg, sq]


class Bucket:
    """The stacked state of one bucket's clients while they train, and each step's arithmetic."""

    def __init__(self, trainer: BatchedTrainer, plans: list[ClientPlan], weights: State, rest: State, objective):
        self.plans, self.weights, self.rest, self.objective = plans, weights, rest, objective
        model = trainer.models[plans[0].group]
        self.step_grad = vmap(grad_and_value(trainer._loss(model)), randomness="different")
        self.anchors = {k: v.clone() for k, v in weights.items()} if objective.corrects() else {}
        self.optimizer = RowOptimizer(trainer.settings, weights)
        device = next(iter(weights.values())).device
        self.losses, self.steps = torch.zeros(len(plans), device=device), [0] * len(plans)
        self.last_grads: dict[int, State] = {}
        self.indices: dict[tuple[int, ...], torch.Tensor] = {}  # each subset of rows copied to the device once

    def step(self, drawn: dict[int, Batch], step: int) -> None:
        """Step t of every client with a t-th batch, one vmap per batch size."""
        for size_rows in by_size(drawn):
            self.step_rows(size_rows, drawn, step, full=len(size_rows) == len(self.plans))

    def step_rows(self, size_rows: list[int], drawn: dict[int, Batch], step: int, full: bool) -> None:
        """Step t of the clients in `size_rows` (one batch size); `full`: every row of the bucket."""
        key = tuple(size_rows)
        if key not in self.indices:
            self.indices[key] = torch.tensor(size_rows, device=self.losses.device)
        index = self.indices[key]
        rows = None if full else index
        w = self.weights if rows is None else {k: v[rows] for k, v in self.weights.items()}
        r = self.rest if rows is None else {k: v[rows] for k, v in self.rest.items()}
        x = torch.stack([drawn[i][0] for i in size_rows])
        y = torch.stack([drawn[i][1] for i in size_rows])
        grads, loss = self.step_grad(w, r, x, y)
        if self.anchors:
            start = self.anchors if rows is None else {k: v[rows] for k, v in self.anchors.items()}
            correction = self.objective.batched_correction(w, start)
            grads = {k: g + correction[k] for k, g in grads.items()}
        self.optimizer.step(self.weights, grads, rows, step)
        if rows is not None:
            for k, v in r.items():
                self.rest[k][rows] = v
        self.losses.index_add_(0, index, loss.detach())
        self.count(size_rows, {k: g.detach() for k, g in grads.items()})

    def count(self, rows: list[int], grads: State, stacked: bool = False) -> None:
        """`rows` took a step whose gradients are `grads`: row n of each the n-th of `rows`, or
        (`stacked`, every row of the bucket) row i client i's, copied, since a graph rewrites them."""
        for n, i in enumerate(rows):
            self.steps[i] += 1
            if self.plans[i].last_grad:
                self.last_grads[i] = {k: g[i].clone() if stacked else g[n] for k, g in grads.items()}


class BatchedTrainer(Trainer):
    def train(
        self,
        round_: Round,
        plans: list[ClientPlan],
        start_of: Callable[[ClientPlan], State],
        objective: ClientObjective,
    ) -> list[ClientUpdate]:
        """The round's updates in the plans' order (the serial trainer's: aggregation sums in it)."""
        buckets: dict[tuple, list[ClientPlan]] = defaultdict(list)
        for plan in plans:
            buckets[plan.group, plan.trainable].append(plan)
        updates: dict[int, ClientUpdate] = {}
        for bucket in buckets.values():
            with _batch_norm_inputs_cast(self.models[bucket[0].group], self.autocast):
                trained = self.train_bucket(round_, bucket, [start_of(plan) for plan in bucket], objective)
            updates |= {plan.client: update for plan, update in zip(bucket, trained, strict=True)}
        return [updates[plan.client] for plan in plans]

    def train_bucket(
        self, round_: Round, plans: list[ClientPlan], starts: list[State], objective: ClientObjective
    ) -> list[ClientUpdate]:
        """Clients of one model with the same trainable parameters, side by side."""
        model = self.models[plans[0].group]
        model.train()
        bucket = self.bucket(plans, starts, objective)
        batches = [self.batches(round_, plan.client) for plan in plans]
        for step, drawn in enumerate(_steps(batches)):
            bucket.step(drawn, step)
        totals = bucket.losses.tolist()  # the bucket's one host sync
        params = {name for name, _ in model.named_parameters()}
        updates = []
        for i, plan in enumerate(plans):
            final = {k: (bucket.weights[k] if k in bucket.weights else bucket.rest[k])[i] for k in starts[i]}
            last_grad = None  # a last_grad plan's last gradients: zero for a client that took no step
            if plan.last_grad:
                last_grad = bucket.last_grads.get(i) or {k: torch.zeros_like(w[i]) for k, w in bucket.weights.items()}
            steps = bucket.steps[i]
            loss = totals[i] / steps if steps else float("nan")
            updates.append(self.assemble(plan, starts[i], final, params, steps, loss, last_grad))
        return updates

    def bucket(self, plans: list[ClientPlan], starts: list[State], objective: ClientObjective) -> Bucket:
        return Bucket(self, plans, *self.stacked(plans, starts), objective)

    def stacked(self, plans: list[ClientPlan], starts: list[State]) -> tuple[State, State]:
        """The clients' start states stacked: trained weights, and the rest (frozen parameters,
        buffers: BatchNorm statistics move in place)."""
        model, trainable = self.models[plans[0].group], plans[0].trainable
        stacked = {k: torch.stack([s[k] for s in starts]) for k in starts[0]}
        params = {name for name, _ in model.named_parameters()}
        weights = {k: stacked.pop(k) for k in list(stacked) if k in params and (trainable is None or k in trainable)}
        return weights, stacked

    def _loss(self, model: nn.Module) -> Callable[[State, State, torch.Tensor, torch.Tensor], torch.Tensor]:
        def loss(w: State, r: State, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=self.autocast, cache_enabled=False):
                return F.cross_entropy(functional_call(model, {**w, **r}, (x,)), y)

        return loss


@contextmanager
def _batch_norm_inputs_cast(model: nn.Module, autocast: bool) -> Iterator[None]:
    """Under bf16 autocast a convolution hands a bf16 input to a float32 batch norm; eager
    cuDNN normalises that in float32, but vmap's batch_norm rule refuses the mix ("expected
    scalar type BFloat16 but found Float"). While training with autocast, each batch norm of
    `model` gets its input cast to its weights' dtype first; without autocast nothing is hooked."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)] if autocast else []
    handles = [m.register_forward_pre_hook(_input_in_weight_dtype) for m in norms]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _input_in_weight_dtype(module: nn.Module, args: tuple) -> tuple:
    ref = module.weight if module.weight is not None else module.running_mean
    return args if ref is None else (args[0].to(ref.dtype), *args[1:])


def _steps(batches: list[Iterator[Batch]]) -> Iterator[dict[int, Batch]]:
    """Step t: the t-th batch of every client that has one."""
    active = list(range(len(batches)))
    while True:
        drawn = {i: b for i in active if (b := next(batches[i], None)) is not None}
        if not drawn:
            return
        active = list(drawn)
        yield drawn


def by_size(drawn: dict[int, Batch]) -> list[list[int]]:
    """The stepping clients grouped by batch size, each group in client order."""
    sizes: dict[int, list[int]] = defaultdict(list)
    for i, (_, y) in drawn.items():
        sizes[len(y)].append(i)
    return list(sizes.values())
