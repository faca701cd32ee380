"""The server of a real federation, without Flower: the run's engine, whose clients train
elsewhere.

`FederatedEngine` is the simulator's `Engine` (the same planner, transforms, aggregation,
evaluation and checkpoint), whose round is `plan` -> the nodes -> `conclude`: a `RemoteTrainer`
sends the round's plans, the server's start weights and the objective's broadcast (SCAFFOLD's
c) through an `Exchange` (the Flower app's strategy and grid; Flower-free here), and the replies
come back as `ClientUpdate`s, each checked against its plan before the engine sees it. A reply
that is malformed, names another client, has other entries or shapes than planned, or holds a
NaN/Inf is refused and logged by node; a client without an accepted reply stops the run
(`MissingClients`, one line naming them) unless `allow_missing`, which goes on without it and
records it in rounds.csv (`missing`).

Evaluation is the simulator's too (the layout's): the server scores its own states on the
test set, and a client model (a group's global weights with what that client keeps) is scored
on the client's node (`RemoteTrainer.score`) when it needs what only the node has: the client's
kept entries (personal layers, local BN statistics: `keeps`) or its held-out data (`holdout`).
Evaluation needs every reply it asks for (a missing or malformed one stops the run by name).

What cannot run this way is refused before anything starts (`refusal`): HeteroFL's static BN
gathers its statistics from batches that mix every client's training images.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from incofl.config import ConfigError, RunConfig
from incofl.fl.contracts import ClientPlan, ClientUpdate, RoundReport, State
from incofl.fl.engine.engine import Engine
from incofl.fl.stages.evaluation import Scores
from incofl.fl.stages.layout import HELD_OUT, ClientEval
from incofl.fl.stages.local import Objective
from incofl.fl.stages.sampling import group_of
from incofl.registry import METHODS, layout_of
from incofl.spec import WIDTH_LAYOUT

log = logging.getLogger("incofl.federation")


class MissingClients(RuntimeError):
    """Planned clients without an accepted reply (the run stops unless allow_missing), or
    clients asked for scores (`evaluation`: an evaluation needs every one)."""

    def __init__(self, round_: int, clients: list[int], why: dict[int, str], evaluation: bool = False):
        self.round, self.clients = round_, clients
        reasons = "; ".join(f"client {c}: {why[c]}" for c in clients)
        stage, instead = (
            ("evaluation after ", "") if evaluation else ("", ", or set allow-missing=true to go on without them")
        )
        super().__init__(
            f"{stage}round {round_}: no accepted reply from client(s) {', '.join(map(str, clients))} "
            f"({reasons}); rerun to resume from the last checkpoint{instead}"
        )


@dataclass(frozen=True)
class TrainJob:
    """One planned client's round: its plan, the server's start weights, the objective's
    broadcast, and the hash of the client's state after its last accepted round ('' before any):
    the node checks the state it restores against it."""

    plan: ClientPlan
    start: State
    broadcast: State
    state_sha256: str = ""


@dataclass
class Reply:
    """What came back for one planned client: its update and the hashes of what it keeps and of
    its whole state after the round, or why there is none."""

    update: ClientUpdate | None = None
    kept_sha256: str = ""
    state_sha256: str = ""
    error: str = ""
    node: int = 0


@dataclass(frozen=True)
class EvalJob:
    """One client's models to score on its node: on `splits`, with its group's global weights
    (`state_sha256` as in TrainJob)."""

    client: int
    group: int
    splits: tuple[str, ...]
    start: State
    state_sha256: str = ""


@dataclass
class EvalReply:
    """A node's scores of one EvalJob (one per split, in order), or why there are none."""

    client: int = -1
    scores: list[Scores] = field(default_factory=list)
    error: str = ""
    node: int = 0


class Exchange(Protocol):
    def train(self, round_: int, jobs: list[TrainJob]) -> list[Reply]:
        """Send each job to its client's node; one Reply per job, in order."""
        ...

    def evaluate(self, round_: int, jobs: list[EvalJob]) -> list[EvalReply]:
        """Send each job to its client's node; one EvalReply per job, in order."""
        ...


def check_update(plan: ClientPlan, start: State, update: ClientUpdate) -> str:
    """Why a reply cannot be averaged in ('' if it can): it must be the planned client's, with
    exactly the planned uploaded entries in their shapes, and finite."""
    if (update.client, update.group, update.federation) != (plan.client, plan.group, plan.federation):
        return (
            f"reply for client {update.client} (group {update.group}, federation {update.federation}), "
            f"planned client {plan.client} (group {plan.group}, federation {plan.federation})"
        )
    expected = {k: v.shape for k, v in start.items() if v.is_floating_point() and plan.uploads(k)}
    got = {k: v.shape for k, v in update.delta.items()}
    if set(got) != set(expected):
        odd = sorted(set(got) ^ set(expected))
        return f"entries other than planned: {', '.join(odd[:3])}{' ...' if len(odd) > 3 else ''}"
    wrong = [k for k, shape in got.items() if shape != expected[k] or not update.delta[k].is_floating_point()]
    if wrong:
        return f"{wrong[0]} has shape {tuple(got[wrong[0]])}, planned {tuple(expected[wrong[0]])}"
    states = {"delta": update.delta, **{f"extra {k}": v for k, v in update.extra.items()}}
    for what, state in states.items():
        bad = next((k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()), None)
        if bad is not None:
            return f"{what} {bad} holds NaN or Inf"
    if update.num_samples < 0 or update.steps < 0 or not math.isfinite(update.loss) and update.steps > 0:
        return f"counts out of range (samples {update.num_samples}, steps {update.steps}, loss {update.loss})"
    return ""


def check_scores(job: EvalJob, reply: EvalReply) -> str:
    """Why a node's scores cannot be used ('' if they can)."""
    if reply.error:
        return reply.error
    if reply.client != job.client or len(reply.scores) != len(job.splits):
        asked = f"client {job.client} on {len(job.splits)}"
        return f"scores of client {reply.client} on {len(reply.scores)} split(s), asked: {asked}"
    for split, s in zip(job.splits, reply.scores, strict=True):
        if not s.n or not all(0 <= c <= s.n for c in s.correct) or not all(math.isfinite(x) for x in s.loss):
            return f"{split} scores out of range (correct {s.correct}, loss {s.loss}, samples {s.n})"
    return ""


@dataclass
class RemoteTrainer:
    """The train stage of a federated run: every planned client trains on its node."""

    exchange: Exchange
    allow_missing: bool = False
    missing: list[int] = field(default_factory=list)  # this round's planned clients without an accepted reply
    kept: dict[int, str] = field(default_factory=dict)  # client -> hash of what it keeps (its last reply's; '' none)
    states: dict[int, str] = field(default_factory=dict)  # client -> hash of its whole state (its last reply's)

    def train(
        self, round_: int, plans: list[ClientPlan], start_of: Callable[[ClientPlan], State], objective: Objective
    ) -> list[ClientUpdate]:
        """The accepted updates of the round's planned clients, in the plans' order."""
        jobs = [
            TrainJob(plan, start_of(plan), objective.broadcast(plan.federation), self.states.get(plan.client, ""))
            for plan in plans
        ]
        replies = self.exchange.train(round_, jobs)
        updates, why = [], {}
        for job, reply in zip(jobs, replies, strict=True):
            plan = job.plan
            if reply.update is None:
                problem = reply.error or "no reply"
            else:
                self.states[plan.client] = reply.state_sha256  # the node saved it, whether or not it is averaged
                problem = reply.error or check_update(plan, job.start, reply.update)
            if problem:
                log.warning("round %d: node %d, client %d: refused: %s", round_ + 1, reply.node, plan.client, problem)
                why[plan.client] = problem
                continue
            assert reply.update is not None
            reply.update.view = plan.view  # the server's own plan says where a sub-model sits
            updates.append(reply.update)
            self.kept[plan.client] = reply.kept_sha256
        self.missing = sorted(why)
        if self.missing and not self.allow_missing:
            raise MissingClients(round_ + 1, self.missing, why)
        return updates

    def score(self, round_: int, jobs: list[EvalJob]) -> list[list[Scores]]:
        """Each job's scores from its client's node; stops naming the clients without valid ones."""
        replies = self.exchange.evaluate(round_, jobs)
        why = {}
        for job, reply in zip(jobs, replies, strict=True):
            problem = check_scores(job, reply)
            if problem:
                log.warning(
                    "evaluation after round %d: node %d, client %d: refused: %s",
                    round_,
                    reply.node,
                    job.client,
                    problem,
                )
                why[job.client] = problem
        if why:
            raise MissingClients(round_, sorted(why), why, evaluation=True)
        return [reply.scores for reply in replies]


def keeps(cfg: RunConfig) -> bool:
    """Whether the run's clients keep entries of their models (personal layers, local BN statistics)."""
    return METHODS[cfg.method].planner.personal or cfg.bn_stats == "local"


class FederatedEngine(Engine):
    """The run's engine whose clients train on the nodes (module docstring); `remote` is set
    before the first round (`federate`)."""

    remote: RemoteTrainer
    round: int = 0

    def federate(self, remote: RemoteTrainer) -> None:
        self.remote = remote

    def run_round(self, round_: int) -> RoundReport:
        self.round = round_ + 1  # the round an evaluation follows
        plans = self.plan(round_)
        updates = self.remote.train(round_, plans, self.start, self.objective)
        accepted = {u.client for u in updates}
        return self.conclude(round_, [p for p in plans if p.client in accepted], updates)

    def observe(self, report: RoundReport) -> None:
        """The simulator's observers; rounds.csv also names the clients left out (allow-missing)."""
        super().observe(report)
        self.costs.rows[-1]["missing"] = " ".join(map(str, self.remote.missing))

    def kept_sha256(self) -> dict[int, str]:
        """The hashes the nodes reported of what their clients keep (the run's fingerprint hashes them)."""
        return {client: sha for client, sha in self.remote.kept.items() if sha}

    def state_dict(self) -> dict[str, Any]:
        remote = self.remote
        return {**super().state_dict(), "kept_sha256": dict(remote.kept), "client_sha256": dict(remote.states)}

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        super().load_state_dict(payload)
        self.remote.kept, self.remote.states = dict(payload["kept_sha256"]), dict(payload["client_sha256"])

    def score_clients(self, jobs: list[ClientEval]) -> list[Scores]:
        """Client models scored where what they need is (module docstring): on their nodes, one
        message a client with its group's global weights; here, models of clients that keep nothing."""
        remote = [job for job in jobs if job.split == HELD_OUT or keeps(self.cfg)]
        by_client: dict[int, list[ClientEval]] = {}
        for job in remote:
            by_client.setdefault(job.client, []).append(job)
        asked = [
            EvalJob(
                client,
                group[0].group,
                tuple(j.split for j in group),
                self.sub_state(group[0].group),
                self.remote.states.get(client, ""),
            )
            for client, group in by_client.items()
        ]
        scored = {
            (job.client, split): s
            for job, scores in zip(asked, self.remote.score(self.round, asked), strict=True)
            for split, s in zip(job.splits, scores, strict=True)
        }
        local = [job for job in jobs if job not in remote]
        scored |= {(job.client, job.split): s for job, s in zip(local, super().score_clients(local), strict=True)}
        return [scored[job.client, job.split] for job in jobs]


def refusal(cfg: RunConfig) -> str:
    """Why `cfg` cannot run as a real federation ('' if it can)."""
    if layout_of(cfg) is WIDTH_LAYOUT and cfg.bn_at_eval == "static":
        return (
            "eval_bn: static gathers BN statistics on the server from batches that mix every client's training "
            "images; set eval_bn: batch"
        )
    return ""


def test_clients(cfg: RunConfig) -> list[int]:
    """The clients whose nodes score their models on the test set (each model group's first
    client, where clients keep entries and the data set has a global test set)."""
    if not keeps(cfg) or cfg.pool_test:
        return []
    groups = [group_of(c, cfg.clients, cfg.groups) for c in range(cfg.clients)]
    return sorted({groups.index(g) for g in range(cfg.groups)})


def check_federated(cfg: RunConfig) -> None:
    """Refuse, in one line naming the method, what cannot run as a real federation."""
    why = refusal(cfg)
    if why:
        raise ConfigError(f"method {cfg.method} cannot run as a real federation with this config: {why}")
