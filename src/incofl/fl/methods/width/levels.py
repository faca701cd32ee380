"""Width and depth splitting's levels: HeteroFL, FedRolex, ScaleFL.

One architecture (`preresnet18`, `resnet110`) at several levels: a level is a width rate
(and, for resnet110, a deepest exit), one model group each. The server holds the full model.

- plan (`WidthPlanner`): each sampled client's level (its fixed group, or a fresh draw every
  round under `rate_assignment: dynamic`) and its view of the global model, the leading
  channels (HeteroFL, ScaleFL) or FedRolex's rolling window after t rounds (`rolling`);
- layout (`WidthLayout`): the server's full model and one cut model per level; a client trains
  from its block of the global weights (slicing.extract) in its level's model;
- evaluate (`WidthEvaluator`): the full global model (the headline `mean_acc`) and each level's
  sub-model (leading channels) as `acc_g{g}`; BN statistics `static` (HeteroFL: gathered from
  training data before each evaluation) or `batch` (the test batch's); resnet110: every exit
  of the global model, the last as the headline, and the release's mean over exits.

The aggregation is aggregate.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from incofl.config import ConfigError
from incofl.data.tensors import TensorSplit
from incofl.fl.contracts import ClientPlan, Round, Setup, State, View
from incofl.fl.methods.width.slicing import extract, index_map
from incofl.fl.stages.evaluation import score
from incofl.fl.stages.layout import ClientScores, Layout, LayoutInputs, SubState
from incofl.fl.stages.plan import FullPlanner
from incofl.models.flops import forward_flops
from incofl.streams import Stream, generator

BN_STATISTICS = ("running_mean", "running_var", "num_batches_tracked")
# why static BN needs a client side that holds every client's training images (the simulator's)
STATIC_BN = (
    "gathers BN statistics from batches that mix every client's training images: a step of a client side "
    "that holds them all (the simulator's), which no federation's node does; set eval_bn: batch"
)


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

    def view(self, group: int, offset: int = 0) -> View:
        """A group's sub-model (its width level's) after `offset` rounds of rolling (0: leading channels)."""
        key = (group, offset)
        if key not in self.views:
            self.views = {k: v for k, v in self.views.items() if k[1] in (0, offset)}  # other rounds' rolled views
            self.views[key] = View(group, index_map(self.shapes, self.level_shapes[group], offset), self.costs[group])
        return self.views[key]


class WidthPlanner(FullPlanner):
    """Each sampled client's level and view (module docstring)."""

    def __init__(self, hp: Any, setup: Setup):
        super().__init__(hp, setup)
        self.widths, self.rolling, self.seed = setup.layout.widths, hp.rolling, setup.settings.seed
        self.dynamic = setup.settings.rate_assignment == "dynamic"

    def group_of(self, round_: Round, client: int, fixed: int) -> int:
        """The client's group (its width level) this round: its `fixed` one, or a fresh draw (dynamic)."""
        if not self.dynamic:
            return fixed
        return int(generator(self.seed, Stream.WIDTH_LEVEL, round_.index, client).integers(self.groups))

    def plan(self, round_: Round, client: int) -> ClientPlan:
        full = super().plan(round_, client)
        group = self.group_of(round_, client, full.group)
        view = self.widths.view(group, round_.index if self.rolling else 0)
        return ClientPlan(client, group, full.federation, full.federation_size, view=view)


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

    def __init__(
        self,
        widths: Widths,
        models: list[nn.Module],
        server: nn.Module,
        test: TensorSplit,
        batch_size: int,
        static: StaticBN | None,
    ):
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


def static_bn(inputs: LayoutInputs) -> StaticBN | None:
    """A client side's static BN (under `eval_bn: static`): its clients' training images, and level
    g's model with running statistics (-1: the full model)."""
    run, training, name = inputs.settings, inputs.training, inputs.settings.models[0]
    if run.bn_at_eval != "static" or training is None:
        return None
    levels = [*run.levels, (1.0, None)]  # [-1]: the full model
    indices = statistics_indices(list(training.parts.values()), run.static_bn_samples, run.seed)
    return StaticBN(
        training.train, indices, lambda g: inputs.build(name, rate=levels[g][0], exits=levels[g][1], track_stats=True)
    )


def lent_static_bn(inputs: LayoutInputs) -> StaticBN | None:
    """The static BN the server side's evaluation is lent by the client side's layout (None without
    `eval_bn: static`); refused in one line where no client side lends one (a federation's server)."""
    if inputs.settings.bn_at_eval != "static":
        return None
    static = getattr(inputs.client_side, "static", None)
    if static is None:
        raise ConfigError(f"eval_bn: static {STATIC_BN}")
    return static


class WidthLayout(Layout):
    """The server holds the full model; each model group is a width level with its cut model
    (`levels`: width rate and deepest exit). Clients train from their block of the global
    weights; the server side's evaluation scores the full model and each level's leading block
    (`WidthEvaluator`; static BN's statistics come from the client side's images: `static_bn`)."""

    def __init__(self, inputs: LayoutInputs):
        run, build, name = inputs.settings, inputs.build, inputs.settings.models[0]
        self.server_model = build(name)
        self.models = [build(name, rate=rate, exits=exits) for rate, exits in run.levels]
        self.widths = Widths(self.server_model, self.models, inputs.size)
        if inputs.training is not None:  # the client side: it scores no model of a width layout
            self.static = static_bn(inputs)
            return
        self.evaluator = WidthEvaluator(
            self.widths, self.models, self.server_model, inputs.test, run.eval_batch_size, lent_static_bn(inputs)
        )

    def start(self, plan: ClientPlan, weights: list[State], sub_state: SubState) -> State:
        """The client's block of the global model (its view); a whole-model method's client (its
        levels uncut) its group's global sub-state."""
        if plan.view is None:
            return sub_state(plan.group)
        return extract(weights[plan.federation], plan.view.index)

    def evaluate(self, weights: list[State], client_scores: ClientScores) -> dict[str, float]:
        return self.evaluator(weights[0])

    def summary(self, rows: list[dict[str, float]]) -> dict[str, Any]:
        """Models with early exits (ScaleFL): each exit's final accuracy, and the release's mean over them."""
        final = rows[-1]
        exits = sorted(k for k in final if k.startswith("acc_exit") and k[8:].isdigit())
        if not exits:
            return {}
        return {"exit_final_acc": [final[k] for k in exits], "final_exits_mean": final["acc_exits_mean"]}
