"""The layout stage component: how a run's models are laid out over its clients. A layout builds
the models and the server model, gives each planned client the weights it trains from
(`start`), scores the server states (`evaluate`) and adds its own statistics to the run's
summary (`summary`). The registry picks it from the run's model (`registry.layout_of`); the
engine only calls it. A layout is a stage component (fl/stages/component.py) built from its
`LayoutInputs`: it makes the models the other components' `Setup` names.

`GroupLayout`, every model's but the width models': one whole model per model group (the
configured `models`, nested in one another), the server state the largest one's; a group's
model is scored on the global test set with its group's first client's kept entries (the
release evaluates client 0's model). With `holdout`, every client's model is also scored on
its held-out share of its data (the personal accuracy); with no global test set (`pool_test`)
that is the run's accuracy. Width models are laid out in width levels instead (fl/methods/width/).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn

from incofl.data.tensors import TensorSplit
from incofl.fl.contracts import ClientPlan, SideSettings, State
from incofl.fl.stages.component import Stateful
from incofl.fl.stages.evaluation import GroupEvaluator, PersonalEvaluator, Scores, personal_metrics
from incofl.fl.stages.plan import local_statistics
from incofl.fl.stages.sampling import group_of
from incofl.models.family import check_nested
from incofl.registry import METHODS

SubState = Callable[[int], State]  # group -> its global sub-state (the server's weights a group's model holds)
TEST, HELD_OUT = "test", "held_out"  # the splits a client's model is scored on


@dataclass(frozen=True)
class ClientEval:
    """One client model an evaluation scores: client `client`'s (its group's global weights with
    what it keeps) on `split`: the global test set, or the client's held-out share of its data."""

    client: int
    group: int
    split: str


def first_clients(groups: list[int]) -> list[int]:
    """Each model group's first client (`groups`: each client's group, every group held): where
    clients keep entries, its model is the one its group is scored with on the test set."""
    return [groups.index(g) for g in range(max(groups) + 1)]


def keeps(settings: SideSettings) -> bool:
    """Whether the run's clients keep entries of their models (personal layers, local BN
    statistics): a client's model is then not its group's global weights, and is scored where
    the client is."""
    return METHODS[settings.method].planner.personal or local_statistics(settings)


def tested_on_clients(settings: SideSettings, pooled: bool) -> list[int]:
    """The clients whose models are scored on the test split where the clients are (their sites
    need it: `incofl federation export --test`): each model group's first client's, where clients
    keep entries and the data set has a global test set (not `pooled`: GroupLayout.client_evals,
    Layout.on_client)."""
    if not keeps(settings) or pooled:
        return []
    return first_clients([group_of(c, settings.clients, settings.groups) for c in range(settings.clients)])


# Scores of client models, in order: those that need what only a client has scored where it is
# (`Layout.on_client`: the client side, through the run's transport), the others by the server
ClientScores = Callable[[list[ClientEval]], list[Scores]]


@dataclass(frozen=True)
class Training:
    """What a client side trains its clients on, and what only it can score: its training split
    (augmented) and, for each client it serves, its training indices and held-out indices (None
    without holdout). The server side has none (its layout's inputs: `training` None)."""

    train: TensorSplit
    parts: Mapping[int, np.ndarray]
    held_out: Mapping[int, np.ndarray] | None


@dataclass(frozen=True)
class LayoutInputs:
    """What a layout is built from: its side's settings, `build(name, **model_args)` (a model on
    the run's device), the models' input size, the test split on the device, each client's model
    group, whether clients keep entries (`keeps`), the clients that hold samples out (the facts'
    on the server side), the client side's `Training` (None on the server side) and, where both
    sides share a process (the simulator), the client side's layout (`client_side`: a step the
    server's evaluation asks of the client side's data, such as width's static BN statistics)."""

    settings: SideSettings
    build: Callable[..., nn.Module]
    size: int
    test: TensorSplit
    groups: list[int]
    keeps: bool = False
    held_out_clients: tuple[int, ...] = ()
    training: Training | None = None
    client_side: Layout | None = None


class Layout(Stateful):
    """The interface: `models` (one per model group), `server_model` (the server state's
    shapes), `start`, `evaluate` (with `client_evals` and `score`, the client models it scores,
    and `on_client`, which of them need what only their client has) and `summary`."""

    models: list[nn.Module]
    server_model: nn.Module
    keeps: bool = False  # clients keep entries of their models (the inputs' `keeps`)

    def on_client(self, job: ClientEval) -> bool:
        """Whether a listed client model is scored where its client is: on its held-out data, or
        with what it keeps; otherwise it is its group's global weights, which the server scores."""
        return job.split == HELD_OUT or self.keeps

    def start(self, plan: ClientPlan, weights: list[State], sub_state: SubState) -> State:
        """The server's weights a planned client trains from (the client adds what it keeps);
        `weights`: the global weights, one state per federation."""
        return sub_state(plan.group)

    def evaluate(self, weights: list[State], client_scores: ClientScores) -> dict[str, float]:
        """The metrics row of an evaluated round: mean_acc, mean_loss and acc_g{g} at least;
        `client_scores` scores the client models `client_evals` lists."""
        raise NotImplementedError

    def client_evals(self) -> list[ClientEval]:
        """The client models an evaluation scores (none: the layout scores the server states only)."""
        return []

    def score(self, job: ClientEval, state: State) -> Scores:
        """A listed client model's scores, `state` its weights (where the client's entries are)."""
        raise NotImplementedError

    def summary(self, rows: list[dict[str, float]]) -> dict[str, Any]:
        """The layout's own statistics of a finished run's metrics rows, for summary.json."""
        return {}


class GroupLayout(Layout):
    """One whole model per model group (module docstring)."""

    def __init__(self, inputs: LayoutInputs):
        run, self.keeps = inputs.settings, inputs.keeps
        self.models = [inputs.build(name) for name in run.models]
        self.server_model = self.models[check_nested(self.models)]
        self.evaluator = GroupEvaluator(self.models, inputs.test, run.eval_batch_size, run.drop_last)
        self.groups = inputs.groups
        self.first = first_clients(inputs.groups)
        self.held_out = list(inputs.held_out_clients)  # the server side's, from the facts
        self.holdout = run.holdout > 0
        training = inputs.training  # the client side's: it scores its clients' held-out shares
        self.personal = (
            None
            if training is None or training.held_out is None
            else PersonalEvaluator(self.models, training.train, training.held_out, inputs.groups, run.eval_batch_size)
        )
        self.pooled = len(inputs.test) == 0  # pool_test: no global test set

    def client_evals(self) -> list[ClientEval]:
        """With `holdout`, every client's model that holds data out on it; without `pool_test`,
        each model group's first client's model on the test set."""
        personal = self.held_out if self.holdout else []
        jobs = [ClientEval(client, self.groups[client], HELD_OUT) for client in personal]
        if not self.pooled:
            jobs += [ClientEval(client, group, TEST) for group, client in enumerate(self.first)]
        return jobs

    def score(self, job: ClientEval, state: State) -> Scores:
        if job.split == TEST:
            return self.evaluator.score_group(job.group, state)
        assert self.personal is not None, "held-out shares are scored on the client side"
        return self.personal.score_client(job.client, state)

    def evaluate(self, weights: list[State], client_scores: ClientScores) -> dict[str, float]:
        """mean_acc, mean_loss and acc_g{g}; with `holdout` also personal_acc(_std)."""
        jobs = self.client_evals()
        scores = dict(zip(jobs, client_scores(jobs), strict=True))
        held = {job.client: s for job, s in scores.items() if job.split == HELD_OUT}
        personal = personal_metrics(held, self.groups, len(self.models)) if self.holdout else {}
        shown = {k: personal[k] for k in ("personal_acc", "personal_acc_std") if k in personal}
        if self.pooled:  # the personal accuracy is the run's
            groups = {f"acc_g{g}": personal[f"personal_g{g}"] for g in range(len(self.models))}
            return {"mean_acc": personal["personal_acc"], "mean_loss": personal["personal_loss"], **groups, **shown}
        tested = [s for job, s in scores.items() if job.split == TEST]  # in group order
        return self.evaluator.combine(tested) | shown

    def summary(self, rows: list[dict[str, float]]) -> dict[str, Any]:
        """With `holdout`: the final personal accuracy, its std over clients, and the best (the release's)."""
        if "personal_acc" not in rows[-1]:
            return {}
        accs = [r["personal_acc"] for r in rows]
        return {
            "personal_acc": accs[-1],
            "personal_acc_std": rows[-1]["personal_acc_std"],
            "best_personal_acc": max(accs),
        }
