"""Width and depth splitting as stage components: HeteroFL, FedRolex, ScaleFL (METHODS.md 5.3, 5.4).

One architecture (`preresnet18`, `resnet110`) at several levels: a level is a width rate
(and, for resnet110, a deepest exit), one model group each. The server holds the full model.

- plan (`WidthPlanner`): each sampled client's level (its fixed group, or a fresh draw every
  round under `rate_assignment: dynamic`) and its view of the global model, the leading
  channels (HeteroFL, ScaleFL) or FedRolex's rolling window after t rounds (`rolling`);
- train: the client's block of the global weights (slicing.extract) in its level's model;
- aggregate (`SlicedMean`): every element's unweighted mean over the sampled clients that
  held it, classifier rows only from clients holding the class (`class_rows`: HeteroFL,
  FedRolex); elements nobody held keep their value. FedRolex's `RolexMean` is that mean, or
  with `weighting: released` its release's count weighting. The averaged update carries which
  elements were held, so the InCo step touches only slices both target and reference cover;
- layout (`WidthLayout`): the server's full model and one cut model per level; a client trains
  from its block of the global weights;
- evaluate (`WidthEvaluator`): the full global model (the headline `mean_acc`) and each level's
  sub-model (leading channels) as `acc_g{g}`; BN statistics `static` (HeteroFL: gathered from
  training data before each evaluation) or `batch` (the test batch's); resnet110: every exit
  of the global model, the last as the headline, and the release's mean over exits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from incofl.data.tensors import TensorSplit
from incofl.fl.contracts import Average, ClientPlan, ClientUpdate, Index, State, View
from incofl.fl.evaluation import score
from incofl.fl.layout import ClientState, Layout, LayoutInputs
from incofl.fl.plan import FullPlanner
from incofl.fl.server import Shared
from incofl.fl.slicing import Weigh, extract, index_map, scatter_add, sliced_mean, take
from incofl.models.flops import forward_flops
from incofl.streams import Stream, generator

BN_STATISTICS = ("running_mean", "running_var", "num_batches_tracked")
CLASSIFIER = frozenset({"fc.weight", "fc.bias"})  # the width models' class rows


def _shapes(model: nn.Module) -> dict[str, torch.Size]:
    return {k: v.shape for k, v in model.state_dict().items()}


class Widths:
    """The server model's entry shapes, and per level its sub-model's shapes and cost (forward
    FLOPs per sample over the server model's, exits included); the views of the current round's
    offset and the leading ones (offset 0: HeteroFL, evaluation), cached."""

    def __init__(self, server: nn.Module, levels: Sequence[nn.Module], image_size: int):
        self.shapes = _shapes(server)
        self.level_shapes = [_shapes(m) for m in levels]
        full = forward_flops(server, image_size)
        self.costs = [forward_flops(m, image_size) / full for m in levels]
        self.views: dict[tuple[int, int], View] = {}

    def view(self, level: int, offset: int = 0) -> View:
        """A level's sub-model after `offset` rounds of rolling (0: leading channels)."""
        key = (level, offset)
        if key not in self.views:
            self.views = {k: v for k, v in self.views.items() if k[1] in (0, offset)}  # other rounds' rolled views
            self.views[key] = View(level, index_map(self.shapes, self.level_shapes[level], offset), self.costs[level])
        return self.views[key]


class HeldAverage(dict):
    """An averaged update in the server's shapes, with per entry which elements a client held."""

    def __init__(self, mean: State, held: State):
        super().__init__(mean)
        self.held = held


class WidthPlanner(FullPlanner):
    """Each sampled client's level and view (module docstring)."""

    def __init__(self, hp: Any, setup: Any, models: list[nn.Module], federation_of: Callable[[int], int]):
        super().__init__(hp, setup, models, federation_of)
        self.widths, self.rolling, self.seed = setup.layout.widths, hp.rolling, setup.cfg.seed
        self.dynamic = setup.cfg.rate_assignment == "dynamic"

    def level(self, round_: int, client: int, fixed: int) -> int:
        if not self.dynamic:
            return fixed
        return int(generator(self.seed, Stream.WIDTH_LEVEL, round_, client).integers(self.groups))

    def plan(self, round_: int, client: int) -> ClientPlan:
        full = super().plan(round_, client)
        level = self.level(round_, client, full.group)
        view = self.widths.view(level, round_ if self.rolling else 0)
        return ClientPlan(client, level, full.federation, full.federation_size, view=view)


class SlicedMean(Shared):
    """Per-element mean over the clients that held each element (module docstring)."""

    def __init__(self, hp: Any, setup: Any = None):  # unweighted (HeteroFL's release): no `weighted`
        self.shapes, self.class_rows = setup.layout.widths.shapes, hp.class_rows
        self.weigh: Weigh | None = None

    def aggregate(self, updates: Sequence[ClientUpdate]) -> dict[int, Average]:
        blocks = [(u.delta, u.view.index) for u in updates]
        rows = [(CLASSIFIER, u.classes) for u in updates] if self.class_rows else ()
        mean, held = sliced_mean(self.shapes, blocks, rows, self.weigh)
        return {0: HeldAverage(mean, held)}


class RolexMean(SlicedMean):
    """FedRolex's aggregation. `weighting: mean` (default) is SlicedMean: the paper's selective
    average, each element over the clients whose sub-model holds it, every holder once. It is
    the default because it is the algorithm the paper states; the counts below appear only in
    the code. `released` is the release's server (`combine`): convolution weights as that mean,
    every other entry (BN weight and bias, the classifier) weighted by `tmp_counts`, 1 + how
    often each element was held before, over all rounds, with this round's earlier clients
    already counted. The counts persist across rounds: this aggregator's checkpointed state."""

    def __init__(self, hp: Any, setup: Any = None):
        super().__init__(hp, setup)
        self.times: State = {}  # per weighted entry: the release's tmp_counts (1 + times held)
        if hp.weighting == "released":
            self.weigh = self.times_held

    def times_held(self, name: str, index: Index, delta: torch.Tensor) -> torch.Tensor | None:
        """A client's weights on its block (asked in client order), then its hold counted: the
        m-th holder of an element in a round weighs 1 + earlier holds + (m - 1). The release's
        first entry reads the counts of the round's start; its and incofl's first entry is
        `conv1.weight`, which is unweighted, so that never matters."""
        if delta.dim() > 1 and name not in CLASSIFIER:  # a convolution weight: the release's K = 1
            return None
        times = self.times.get(name)
        if times is None:
            times = torch.ones(self.shapes[name], dtype=delta.dtype)
        self.times[name] = times = times.to(delta.device)
        weight = take(times, index).clone()  # take may return a view of `times`
        scatter_add(times, index, torch.ones_like(delta))
        return weight

    def state_dict(self) -> dict[str, Any]:
        return {"times": {name: t.cpu() for name, t in self.times.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.times = {name: t.clone() for name, t in state.get("times", {}).items()}


@torch.no_grad()
def gather_statistics(model: nn.Module, data: TensorSplit, indices: torch.Tensor, batch_size: int) -> None:
    """HeteroFL's static BN: fresh cumulative running statistics from `indices` of the training
    split (no augmentation), passed in train mode without gradients."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
    model.train()
    for batch in indices.split(batch_size):
        model(data.batch(batch)[0])


def statistics_indices(parts: list[np.ndarray], samples: int | None, seed: int) -> torch.Tensor:
    """The training images static BN gathers statistics from: every client's, or `samples` of
    them, in an order drawn once from the run seed (the same at every evaluation). Shuffled, not
    sorted: the cumulative running variance averages per-batch variances, and sorted indices of
    a class-ordered training set give one-class batches, whose variance is the within-class one."""
    pooled = np.sort(np.concatenate(parts))
    rng = generator(seed, Stream.STATIC_BN)
    if samples is not None and samples < len(pooled):
        return torch.from_numpy(rng.choice(pooled, samples, replace=False))
    return torch.from_numpy(rng.permutation(pooled))


@dataclass(frozen=True)
class StaticBN:
    """HeteroFL's static BN: the training images statistics are gathered from, and `build(g)`,
    level g's model with running statistics (-1: the full model)."""

    data: TensorSplit
    indices: torch.Tensor
    build: Callable[[int], nn.Module]


class WidthEvaluator:
    """The global model and every level's sub-model on the test set (module docstring); with
    `static`, each in a copy with running statistics, gathered before each evaluation."""

    def __init__(self, widths: Widths, models: list[nn.Module], server: nn.Module, test: TensorSplit,
                 batch_size: int, static: StaticBN | None):  # fmt: skip
        self.widths, self.models, self.server, self.test, self.batch_size = widths, models, server, test, batch_size
        self.static = static
        if static is not None:
            self.models, self.server = [static.build(g) for g in range(len(models))], static.build(-1)

    def score(self, model: nn.Module, state: State) -> list[tuple[float, float]]:
        missing = model.load_state_dict(state, strict=self.static is None).missing_keys
        if self.static is not None:  # every missing entry a BN statistic, gathered here
            assert all(k.rsplit(".", 1)[1] in BN_STATISTICS for k in missing), missing
            gather_statistics(model, self.static.data, self.static.indices, self.batch_size)
        scores = score(model, self.test, self.batch_size)
        return [(scores.accuracy(j), scores.mean_loss(j)) for j in range(len(scores.correct))]

    def __call__(self, state: State) -> dict[str, float]:
        exits = self.score(self.server, state)
        levels = [self.score(m, extract(state, self.widths.view(g).index))[-1] for g, m in enumerate(self.models)]
        row = {"mean_acc": exits[-1][0], "mean_loss": exits[-1][1]}
        row |= {f"acc_g{g}": acc for g, (acc, _) in enumerate(levels)}
        if len(exits) > 1:  # ScaleFL: each exit, and the release's statistic (one meter over every exit)
            row |= {f"acc_exit{j + 1}": a for j, (a, _) in enumerate(exits)}
            row["acc_exits_mean"] = float(np.mean([a for a, _ in exits]))
        return row


class WidthLayout(Layout):
    """The server holds the full model; each model group is a width level with its cut model
    (`levels`: width rate and deepest exit). Clients train from their block of the global
    weights; evaluation scores the full model and each level's leading block (`WidthEvaluator`,
    with static BN models built here)."""

    def __init__(self, inputs: LayoutInputs):
        cfg, build, name = inputs.cfg, inputs.build, inputs.cfg.models[0]
        self.server_model = build(name)
        self.models = [build(name, rate=rate, exits=exits) for rate, exits in cfg.levels]
        self.widths = Widths(self.server_model, self.models, inputs.size)
        static = None
        if cfg.bn_at_eval == "static":
            levels = [*cfg.levels, (1.0, None)]  # [-1]: the full model
            indices = statistics_indices(inputs.parts, cfg.static_bn_samples, cfg.seed)
            static = StaticBN(inputs.train, indices, lambda g: build(name, rate=levels[g][0], exits=levels[g][1],
                                                                     track_stats=True))  # fmt: skip
        self.evaluator = WidthEvaluator(self.widths, self.models, self.server_model, inputs.test,
                                        cfg.eval_batch_size, static)  # fmt: skip

    def start(self, plan: ClientPlan, states: list[State], client_state: ClientState) -> State:
        """The client's block of the global model (its view); a whole-model method's client (its
        levels uncut) its group's global sub-state with what it keeps."""
        if plan.view is None:
            return client_state(plan.client, plan.group)
        return extract(states[plan.federation], plan.view.index)

    def evaluate(self, states: list[State], client_state: ClientState) -> dict[str, float]:
        return self.evaluator(states[0])

    def summary(self, rows: list[dict[str, float]]) -> dict[str, Any]:
        """Models with early exits (ScaleFL): each exit's final accuracy, and the release's mean over them."""
        final = rows[-1]
        exits = sorted(k for k in final if k.startswith("acc_exit") and k[8:].isdigit())
        if not exits:
            return {}
        return {"exit_final_acc": [final[k] for k in exits], "final_exits_mean": final["acc_exits_mean"]}
