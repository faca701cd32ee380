"""The server of a real federation, without Flower: the run's engine, whose clients train
elsewhere.

`FederatedEngine` is the simulator's `Engine` (the same planner, transforms, aggregation,
evaluation and checkpoint), whose round is `plan` -> the nodes -> `conclude`: a `RemoteTrainer`
sends the round's plans, the server's start weights and the objective's broadcast (SCAFFOLD's
c) through an `Exchange` (the Flower app's strategy and grid; Flower-free here), and the replies
come back as `ClientUpdate`s, each checked against what the server would accept of that client
(`ExpectedUpdate`: derived from the plan, the start weights, the partition, the schedule's
epochs and batches, and what the run's components declare their clients send) before the engine
sees it: the codec checks a reply's form (records, names, shapes, dtypes, bytes) before it
decodes an array, `check_update` its values. Each accepted update is folded into the round as
it arrives (fl/engine/fold.py: the round holds no more updates than the simulator's). A refused
reply is logged by node and client; a client without an accepted reply stops the run
(`MissingClients`, one line naming them) unless `allow_missing`, which goes on without it and
records it in rounds.csv (`missing`).

Evaluation is the simulator's too (the layout's): the server scores its own states on the
test set, and a client model (a group's global weights with what that client keeps) is scored
on the client's node (`RemoteTrainer.score`) when it needs what only the node has: the client's
kept entries (personal layers, local BN statistics: `keeps`) or its held-out data (`holdout`).
Scores are checked against the split sizes and the model's exits (`ExpectedScores`). Evaluation
needs every reply it asks for (a missing or refused one stops the run by name).

What cannot run this way is refused before anything starts (`refusal`): HeteroFL's static BN
gathers its statistics from batches that mix every client's training images.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from incofl.config import ConfigError, RunConfig
from incofl.fl.contracts import ClientPlan, ClientUpdate, RoundReport, State
from incofl.fl.engine.divergence import first_nonfinite
from incofl.fl.engine.engine import Engine
from incofl.fl.engine.fold import RoundFold
from incofl.fl.stages.component import Expected, expected_extra
from incofl.fl.stages.evaluation import Scores, scored_samples
from incofl.fl.stages.layout import HELD_OUT, ClientEval, first_clients
from incofl.fl.stages.local import Objective, local_steps
from incofl.fl.stages.plan import local_statistics
from incofl.fl.stages.sampling import group_of
from incofl.models.family import exit_logits
from incofl.registry import METHODS, layout_of
from incofl.spec import WIDTH_LAYOUT

log = logging.getLogger("incofl.deploy")
SHA256 = re.compile(r"([0-9a-f]{64})?")  # a reply's hashes: hex SHA-256 digests, or '' (nothing kept)


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


@dataclass(frozen=True)
class ExpectedUpdate:
    """What the server accepts from a planned client: the plan's client, group, federation and
    `full`, the delta of exactly the uploaded entries (each its start entry's shape and dtype),
    exactly the `extra` states the run's components declare for it (key -> entries), the client's
    share size and local steps, the parameters uploaded and the classes it holds."""

    plan: ClientPlan
    delta: Expected
    extra: dict[str, Expected]
    num_samples: int
    steps: int
    upload_params: int
    classes: torch.Tensor

    def classes_entry(self) -> Expected:
        return {"classes": (tuple(self.classes.shape), self.classes.dtype)}

    def states(self) -> list[Expected]:
        """Every state a reply may hold (the delta, each extra, the classes): the message's byte budget."""
        return [self.delta, *self.extra.values(), self.classes_entry()]


@dataclass
class Reply:
    """What came back for one planned client: its update and the hashes of what it keeps and of
    its whole state, or why there is none."""

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


@dataclass(frozen=True)
class ExpectedScores:
    """What the server accepts of an EvalJob's scores: per split the samples scored, and one
    count and one summed loss per exit of the client's model."""

    client: int
    samples: tuple[int, ...]  # one per split of the job
    exits: int


@dataclass
class EvalReply:
    """A node's scores of one EvalJob (one per split, in order), or why there are none."""

    client: int = -1
    scores: list[Scores] = field(default_factory=list)
    error: str = ""
    node: int = 0


class Exchange(Protocol):
    def train(self, round_: int, jobs: list[TrainJob], expected: list[ExpectedUpdate]) -> Iterator[tuple[int, Reply]]:
        """Send each job to its client's node; (job index, Reply) for each as it arrives, read and
        checked against its expected update (`error` says why it is refused), then for each job
        without a reply (why: none came)."""
        ...

    def evaluate(self, round_: int, jobs: list[EvalJob], expected: list[ExpectedScores]) -> list[EvalReply]:
        """Send each job to its client's node; one EvalReply per job, in order, read and checked."""
        ...


def check_update(expected: ExpectedUpdate, update: ClientUpdate) -> str:
    """Why a decoded reply's values cannot be averaged in ('' if they can): its ids, counts and
    classes must be the expected ones, its loss finite after a local step, its tensors finite.
    (Its form, names, shapes and dtypes included, is the codec's to check before decoding.)"""
    plan = expected.plan
    got = (update.client, update.group, update.federation, update.full)
    if got != (plan.client, plan.group, plan.federation, plan.full):
        return (
            f"reply for client {update.client} (group {update.group}, federation {update.federation}, "
            f"full {update.full}), planned client {plan.client} (group {plan.group}, federation "
            f"{plan.federation}, full {plan.full})"
        )
    counts = (update.num_samples, update.steps, update.upload_params)
    if counts != (expected.num_samples, expected.steps, expected.upload_params):
        return (
            f"samples, steps, uploaded parameters {counts}; the client's share, schedule and plan give "
            f"{(expected.num_samples, expected.steps, expected.upload_params)}"
        )
    if math.isnan(update.loss) != (update.steps == 0) or math.isinf(update.loss):
        return f"loss {update.loss} after {update.steps} local step(s)"
    classes = update.classes
    if classes is None or classes.dtype != expected.classes.dtype or not torch.equal(classes, expected.classes):
        return "classes other than those the client holds"
    states = {"delta": update.delta, **{f"extra {k}": v for k, v in update.extra.items()}}
    for what, state in states.items():
        bad = first_nonfinite(state)
        if bad is not None:
            return f"{what} {bad} holds NaN or Inf"
        bad = first_too_large(state)
        if bad is not None:
            return f"{what} {bad} holds values so large that the round's sums would overflow"
    return ""


def first_too_large(state: State) -> str | None:
    """The first floating-point tensor whose squares sum past a quarter of its dtype's largest
    value (in float64): each entry then stays below half the square root of that value (9.2e18
    in float32), so that neither the round's sample-weighted sums (up to 3.7e19 samples) nor a
    norm of it (InCo's step takes them) overflow; an honest update is many orders below."""
    for name, t in state.items():
        if t.is_floating_point():
            squares = torch.linalg.vector_norm(t, dtype=torch.float64) ** 2
            if not bool(squares <= torch.finfo(t.dtype).max / 4):
                return name
    return None


def check_hashes(kept_sha256: str, state_sha256: str) -> str:
    """Why a reply's hashes are not well-formed ('' if they are)."""
    bad = [h for h in (kept_sha256, state_sha256) if not SHA256.fullmatch(h)]
    return f"hash {bad[0][:70]!r} is not a SHA-256 hex digest" if bad else ""


def check_scores(expected: ExpectedScores, client: int, scores: list[Scores]) -> str:
    """Why a node's scores cannot be used ('' if they can): the asked client's, one per split,
    each of the split's samples, one count in 0..n and one finite summed loss per exit."""
    if client != expected.client or len(scores) != len(expected.samples):
        asked = f"client {expected.client} on {len(expected.samples)}"
        return f"scores of client {client} on {len(scores)} split(s), asked: {asked}"
    for i, (s, n) in enumerate(zip(scores, expected.samples, strict=True)):
        exits = len(s.correct) == len(s.loss) == expected.exits
        if s.n != n or not exits or not all(0 <= c <= n for c in s.correct):
            return f"split {i}: scores out of range (correct {s.correct[:8]}, samples {s.n} of {n})"
        if not all(math.isfinite(x) and x >= 0 for x in s.loss):
            return f"split {i}: losses out of range ({s.loss[:8]})"
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
        self,
        round_: int,
        plans: list[ClientPlan],
        start_of: Callable[[ClientPlan], State],
        objective: Objective,
        expect: Callable[[ClientPlan, State], ExpectedUpdate],
        fold: RoundFold,
    ) -> None:
        """The round's planned clients trained on their nodes: each accepted update folded into
        the round (`fold`) as it arrives, each client without one dropped from it; `expect`: what
        the server accepts of a planned client given its start weights."""
        jobs = [
            TrainJob(plan, start_of(plan), objective.broadcast(plan.federation), self.states.get(plan.client, ""))
            for plan in plans
        ]
        why = {}
        for i, reply in self.exchange.train(round_, jobs, [expect(job.plan, job.start) for job in jobs]):
            plan = jobs[i].plan
            if reply.state_sha256:
                self.states[plan.client] = reply.state_sha256  # the node saved it, whether or not it is averaged
            if reply.error or reply.update is None:
                problem = reply.error or "no reply"
                log.warning("round %d: node %d, client %d: refused: %s", round_ + 1, reply.node, plan.client, problem)
                why[plan.client] = problem
                fold.drop(plan.client)
                continue
            reply.update.view = plan.view  # the server's own plan says where a sub-model sits
            self.kept[plan.client] = reply.kept_sha256
            fold.add(reply.update)
        self.missing = sorted(why)
        if self.missing and not self.allow_missing:
            raise MissingClients(round_ + 1, self.missing, why)

    def score(self, round_: int, jobs: list[EvalJob], expected: list[ExpectedScores]) -> list[list[Scores]]:
        """Each job's scores from its client's node; stops naming the clients without valid ones."""
        replies = self.exchange.evaluate(round_, jobs, expected)
        why = {}
        for job, reply in zip(jobs, replies, strict=True):
            if reply.error:
                log.warning(
                    "evaluation after round %d: node %d, client %d: refused: %s",
                    round_,
                    reply.node,
                    job.client,
                    reply.error,
                )
                why[job.client] = reply.error
        if why:
            raise MissingClients(round_, sorted(why), why, evaluation=True)
        return [reply.scores for reply in replies]


def keeps(cfg: RunConfig) -> bool:
    """Whether the run's clients keep entries of their models (personal layers, local BN statistics)."""
    return METHODS[cfg.method].planner.personal or local_statistics(cfg)


class FederatedEngine(Engine):
    """The run's engine whose clients train on the nodes (module docstring); `remote` is set
    before the first round (`federate`)."""

    remote: RemoteTrainer
    round: int = 0

    def federate(self, remote: RemoteTrainer) -> None:
        self.remote = remote
        self.exits: dict[int, int] = {}  # model group -> its model's exits (scores have one entry each)

    def run_round(self, round_: int) -> RoundReport:
        self.round = round_ + 1  # the round an evaluation follows
        plans = self.plan(round_)
        fold = RoundFold(self, round_, plans)
        self.remote.train(round_, plans, self.start, self.objective, self.expect, fold)
        return fold.finish()

    def expect(self, plan: ClientPlan, start: State) -> ExpectedUpdate:
        """What the server accepts from a planned client that trains from `start` (ExpectedUpdate):
        the trainer's rules (the plan's uploads, the partition's share, the batches of its
        schedule), the components' declarations of what their clients send."""
        cfg = self.cfg
        params = [name for name, _ in self.models[plan.group].named_parameters()]
        samples = len(self.parts[plan.client])
        steps = local_steps(samples, cfg.local_epochs, cfg.batch_size, cfg.drop_last)
        return ExpectedUpdate(
            plan,
            {k: (tuple(start[k].shape), start[k].dtype) for k in plan.uploaded(start)},
            expected_extra([c for _, c in self.components()], plan, start, params, steps),
            samples,
            steps,
            plan.upload_params(start, params),
            self.runner.trainer.classes(plan.client).cpu(),
        )

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
        expected = [self.expect_scores(job) for job in asked]
        scored = {
            (job.client, split): s
            for job, scores in zip(asked, self.remote.score(self.round, asked, expected), strict=True)
            for split, s in zip(job.splits, scores, strict=True)
        }
        local = [job for job in jobs if job not in remote]
        scored |= {(job.client, job.split): s for job, s in zip(local, super().score_clients(local), strict=True)}
        return [scored[job.client, job.split] for job in jobs]

    def expect_scores(self, job: EvalJob) -> ExpectedScores:
        """The samples each split of `job` scores (the held-out share, the test set as the
        evaluator batches it) and the exits of the client's model."""
        cfg, held_out = self.cfg, self.held_out
        samples = tuple(
            len(held_out[job.client])
            if split == HELD_OUT and held_out is not None
            else scored_samples(len(self.test_data), cfg.eval_batch_size, cfg.drop_last)
            for split in job.splits
        )
        return ExpectedScores(job.client, samples, self.exits_of(job.group))

    @torch.inference_mode()
    def exits_of(self, group: int) -> int:
        """How many exits (outputs scored) the group's model has: counted once, on two training images."""
        if group not in self.exits:
            model = self.models[group]
            model.eval()
            self.exits[group] = len(exit_logits(model(self.train_data.batch(torch.arange(2))[0])))
        return self.exits[group]


def refusal(cfg: RunConfig) -> str:
    """Why `cfg` cannot run as a real federation ('' if it can)."""
    if layout_of(cfg) is WIDTH_LAYOUT and cfg.bn_at_eval == "static":
        return (
            "eval_bn: static gathers BN statistics on the server from batches that mix every client's training "
            "images; set eval_bn: batch"
        )
    return ""


def tested_on_nodes(cfg: RunConfig) -> list[int]:
    """The clients whose nodes score their models on the test set: each model group's first
    client (the layout's), where clients keep entries and the data set has a global test set."""
    if not keeps(cfg) or cfg.pool_test:
        return []
    return first_clients([group_of(c, cfg.clients, cfg.groups) for c in range(cfg.clients)])


def check_federated(cfg: RunConfig) -> None:
    """Refuse, in one line naming the method, what cannot run as a real federation."""
    why = refusal(cfg)
    if why:
        raise ConfigError(f"method {cfg.method} cannot run as a real federation with this config: {why}")
