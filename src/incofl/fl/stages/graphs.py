"""Local steps replayed as CUDA graphs (`cuda_graphs: true`).

A small ResNet's training step on 32x32 images in batches of 64 is hundreds of small kernels,
and on a GPU their launch cost, not their arithmetic, sets the time (docs/performance.md). A
CUDA graph records one step's kernels once and launches them all at once after. A graph
replays the same memory, so whatever a step reads or writes lives in static tensors: the batch
is copied into a static input, the weights are the group's model object (`load_state_dict`
copies into it in place) or, for the batched trainer, stacked buffers the round's starts are
copied into, and the optimizer's state is allocated once and zeroed in place for each client
instead of built anew (zero momentum, or Adam's zero moments and step, give the first step's
arithmetic). Only full batches replay; a client's shorter last batch of an epoch trains
eagerly on the same tensors, since padding it would let batch norm see the padding.

`GraphTrainer` is the serial trainer so captured (one graph per group, trainable set);
`GraphBatchedTrainer` the batched one (one graph per group, trainable set and number of
clients side by side: every client's row steps in each replay, and a mask keeps the rows of
clients without a full batch at that step as they were). Off CUDA the same code runs
eagerly (`capture=False`), which is how a CPU tests it against the trainers it replaces.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from incofl.data.tensors import TensorSplit
from incofl.fl.contracts import ClientPlan, ClientUpdate, Round, State
from incofl.fl.stages.batched import Batch, BatchedTrainer, Bucket, by_size
from incofl.fl.stages.local import make_optimizer
from incofl.fl.stages.objective import ClientObjective
from incofl.fl.stages.trainer import Parts, SerialTrainer, last_gradients, set_trainable

if TYPE_CHECKING:
    from incofl.sides import ClientSettings

WARMUP = 3  # eager steps on a side stream before a capture (PyTorch's recipe: cuDNN's autotuning, lazy allocations)


class Captured:
    """`step` recorded as a CUDA graph after WARMUP eager calls on a side stream and replayed
    after; every call is one real step. With `capture=False` every call runs `step` eagerly."""

    def __init__(self, step: Callable[[], None], capture: bool):
        self.step, self.capture, self.calls = step, capture, 0
        self.graph: torch.cuda.CUDAGraph | None = None

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        elif not self.capture:
            self.step()
        elif self.calls < WARMUP:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.step()
            torch.cuda.current_stream().wait_stream(side)
            self.calls += 1
        else:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.step()
            self.graph.replay()  # the capture only recorded this step


def primed(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """`optimizer` with its state allocated (zero), so its first step already takes the
    steady-state path a graph can replay: SGD's momentum buffer (0 * momentum + g = g, the
    first step's), Adam's moments and step count."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if isinstance(optimizer, torch.optim.SGD):
                if group["momentum"]:
                    optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p)
            else:
                # a double step count: on the device (capturable), 1 - 0.999**t in float32 is 1e-5 off, while
                # the eager Adam computes its bias corrections in Python's doubles
                step = torch.zeros((), dtype=torch.float64, device=p.device if group["capturable"] else "cpu")
                optimizer.state[p].update(step=step, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
    return optimizer


def zero_state(optimizer: torch.optim.Optimizer) -> None:
    """A fresh optimizer's state, in place (the memory a graph replays)."""
    for state in optimizer.state.values():
        for value in state.values():
            value.zero_()


class GraphStep:
    """One group model's step with one trainable set: a full batch replays the graph, a shorter
    one runs the same arithmetic eagerly. Gradients stay allocated (`zero_grad(set_to_none=False)`),
    so `p.grad` is the last step's either way."""

    def __init__(
        self, model: nn.Module, params: list[nn.Parameter], settings: ClientSettings, autocast: bool, capture: bool
    ):
        self.model, self.autocast = model, autocast
        optimizer = make_optimizer(
            params, settings.optimizer, settings.lr, settings.momentum, settings.weight_decay, capture
        )
        self.optimizer = primed(optimizer)
        self.x: torch.Tensor | None = None  # the static batch, allocated at the first full one
        self.y: torch.Tensor | None = None
        self.loss = torch.zeros((), device=params[0].device)
        self.replay = Captured(lambda: self.eager(self.x, self.y), capture)

    def eager(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=False)
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=self.autocast, cache_enabled=False):
            loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        self.loss.copy_(loss.detach())

    def train(self, batches: Iterator[Batch], batch_size: int) -> tuple[int, float]:
        """The client's steps from a fresh optimizer; returns (steps, mean loss)."""
        zero_state(self.optimizer)
        total, steps = torch.zeros((), device=self.loss.device), 0
        for x, y in batches:
            if len(y) == batch_size:
                if self.x is None:
                    self.x, self.y = torch.empty_like(x), torch.empty_like(y)
                self.x.copy_(x)
                self.y.copy_(y)
                self.replay()
            else:
                self.eager(x, y)
            total += self.loss
            steps += 1
        return steps, float(total) / steps if steps else float("nan")


class GraphTrainer(SerialTrainer):
    """The serial trainer with each client's full batches replayed from a graph (module docstring).
    Its objectives train plain cross-entropy (`ClientObjective.capturable`)."""

    def __init__(
        self, settings: ClientSettings, models: list[nn.Module], data: TensorSplit, parts: Parts, autocast: bool
    ):
        super().__init__(settings, models, data, parts, autocast)
        self.capture = data.x.device.type == "cuda"
        self.steps: dict[tuple, GraphStep] = {}

    def train_client(self, round_: Round, plan: ClientPlan, start: State, objective: ClientObjective) -> ClientUpdate:
        settings, model = self.settings, self.models[plan.group]
        model.load_state_dict(start)
        params = set_trainable(model, plan.trainable)
        key = (plan.group, plan.trainable)
        if key not in self.steps:
            self.steps[key] = GraphStep(model, params, settings, self.autocast, self.capture)
        model.train()
        steps, loss = self.steps[key].train(self.batches(round_, plan.client), settings.batch_size)
        names = {name for name, _ in model.named_parameters()}
        last_grad = last_gradients(model) if plan.last_grad else None
        return self.assemble(plan, start, model.state_dict(), names, steps, loss, last_grad)  # no session `end`


class GraphBucket(Bucket):
    """A bucket whose stacked tensors stay allocated from round to round (a graph replays them),
    and whose full-batch step is captured: every row computes, `mask` keeps the rows without a
    full batch at that step (BatchNorm statistics included) as they were."""

    def __init__(self, trainer: GraphBatchedTrainer, plans: list[ClientPlan], starts: list[State], objective):
        stacked = trainer.stacked(plans, starts)
        super().__init__(trainer, plans, *stacked, objective)
        device = self.losses.device
        self.mask = torch.zeros(len(plans), dtype=torch.bool, device=device)
        self.t = torch.zeros((), dtype=torch.float64, device=device)  # Adam's bias corrections in double, as in Python
        self.masks: dict[tuple[int, ...], torch.Tensor] = {}
        self.x: torch.Tensor | None = None
        self.y: torch.Tensor | None = None
        self.grads: State = {}
        self.batch_size = trainer.settings.batch_size
        self.replay = Captured(self.full_step, trainer.capture)

    def refill(self, plans: list[ClientPlan], starts: list[State]) -> None:
        """A round's clients of this group into the allocated tensors, from a fresh optimizer."""
        self.plans, self.steps, self.last_grads = plans, [0] * len(plans), {}
        for k, v in (self.weights | self.rest).items():
            v.copy_(torch.stack([s[k] for s in starts]))
        for slots in self.optimizer.state.values():
            for v in slots:
                v.zero_()
        self.losses.zero_()

    def full_step(self) -> None:
        saved = {k: v.clone() for k, v in self.rest.items()}
        grads, loss = self.step_grad(self.weights, self.rest, self.x, self.y)
        for k, v in self.rest.items():
            v.copy_(torch.where(self.mask.view(-1, *[1] * (v.dim() - 1)), v, saved[k]))
        self.optimizer.masked(self.weights, grads, self.mask, self.t)
        self.losses.add_(torch.where(self.mask, loss.detach(), 0))
        self.grads = {k: g.detach() for k, g in grads.items()}

    def step(self, drawn: dict[int, Batch], step: int) -> None:
        """Step t: the clients with a full batch through the graph, the others' shorter ones eagerly."""
        full = [i for i, (_, y) in drawn.items() if len(y) == self.batch_size]
        if full:
            self.step_full(full, drawn, step)
        short = {i: batch for i, batch in drawn.items() if i not in full}
        for size_rows in by_size(short):
            self.step_rows(size_rows, short, step, full=False)

    def step_full(self, rows: list[int], drawn: dict[int, Batch], step: int) -> None:
        """Step t of the clients in `rows`, each with a full batch, through the graph."""
        if self.x is None:
            x, y = drawn[rows[0]]
            self.x = x.new_zeros((len(self.plans), *x.shape))
            self.y = y.new_zeros((len(self.plans), *y.shape))
        for i in rows:
            self.x[i].copy_(drawn[i][0])
            self.y[i].copy_(drawn[i][1])
        key = tuple(rows)
        if key not in self.masks:
            self.masks[key] = torch.tensor([i in rows for i in range(len(self.plans))], device=self.mask.device)
        self.mask.copy_(self.masks[key])
        self.t.fill_(step)
        self.replay()
        self.count(rows, self.grads, stacked=True)


class GraphBatchedTrainer(BatchedTrainer):
    """The batched trainer with its full-batch steps replayed from a graph (module docstring)."""

    def __init__(
        self, settings: ClientSettings, models: list[nn.Module], data: TensorSplit, parts: Parts, autocast: bool
    ):
        super().__init__(settings, models, data, parts, autocast)
        self.capture = data.x.device.type == "cuda"
        self.buckets: dict[tuple, GraphBucket] = {}

    def bucket(self, plans: list[ClientPlan], starts: list[State], objective: ClientObjective) -> GraphBucket:
        key = (plans[0].group, plans[0].trainable, len(plans))
        if key not in self.buckets:
            self.buckets[key] = GraphBucket(self, plans, starts, objective)
        self.buckets[key].refill(plans, starts)
        return self.buckets[key]
