"""The exchange between a run's two sides: what the server sends its planned clients and what
comes back, and the `Transport` that carries it.

A round goes out as each planned client's `TrainJob` (its plan, the server's start weights,
what the server's objective broadcasts) and comes back as one `Reply` per planned client: its
`ClientUpdate`, or why there is none. An evaluation that must score a client's model where the
client is (what it keeps, its held-out data: `Layout.on_client`) goes out as `EvalJob`s and
comes back as their `Scores`. A job carries a `Round`: the round it trains (`TrainJob.round`), or
the round after which a model is scored (`EvalJob.round`; Round(0): before any); a federation's
messages carry its number (from 1).

Two transports carry it: the simulator's, in process (fl/engine/clients.py: the client side
called directly, nothing copied but what a network would copy), and a Flower federation's
(incofl.deploy.server.transport: messages to SuperNodes). What the server accepts of a client that
trains or scores elsewhere is derived from what it knows (`ExpectedUpdate`, `ExpectedScores`)
and checked before an update is averaged (`check_update`, `check_scores`); the in-process
transport, whose client side is the server's own code, is not checked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from incofl.fl.contracts import ClientPlan, ClientUpdate, Round, State
from incofl.fl.engine.divergence import first_nonfinite
from incofl.fl.stages.component import Expected
from incofl.fl.stages.evaluation import Scores
from incofl.fl.stages.layout import ClientEval

SHA256 = re.compile(r"([0-9a-f]{64})?")  # a reply's hashes: hex SHA-256 digests, or '' (nothing kept)


@dataclass(frozen=True)
class TrainJob:
    """One planned client's round `round`: its plan, the server's start weights, the
    objective's broadcast, and the hash of the client's state after its last accepted round ('' before
    any, or where the client side is the server's own: in process): the client checks the state it
    restores against it."""

    round: Round
    plan: ClientPlan
    start: State
    broadcast: State
    state_sha256: str = ""

    @property
    def client(self) -> int:
        return self.plan.client


@dataclass(frozen=True)
class EvalJob:
    """One client's model scored on `splits` after round `round` (Round(0): before any), with its group's global
    weights (`start`; the client lays what it keeps over them; `state_sha256` as in TrainJob)."""

    round: Round
    client: int
    group: int
    splits: tuple[str, ...]
    start: State
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


@dataclass(frozen=True)
class ExpectedScores:
    """What the server accepts of an EvalJob's scores: per split the samples scored, and one
    count and one summed loss per exit of the client's model."""

    client: int
    samples: tuple[int, ...]  # one per split of the job
    exits: int


@dataclass
class Reply:
    """What came back for planned client `client`: its update (and, from another process, the
    hashes of what it keeps and of its whole state), or why there is none (`error`)."""

    client: int
    update: ClientUpdate | None = None
    kept_sha256: str = ""
    state_sha256: str = ""
    error: str = ""
    node: int = 0


@dataclass
class EvalReply:
    """A client's scores of one EvalJob (one per split, in order), or why there are none."""

    client: int = -1
    scores: list[Scores] = field(default_factory=list)
    error: str = ""
    node: int = 0


class MissingClients(RuntimeError):
    """Planned clients without an accepted reply (the run stops unless allow_missing), or
    clients asked for scores (`evaluation`: an evaluation needs every one)."""

    def __init__(self, round_: Round, clients: list[int], why: dict[int, str], evaluation: bool = False):
        self.round, self.clients = round_, clients
        reasons = "; ".join(f"client {c}: {why[c]}" for c in clients)
        stage, instead = (
            ("evaluation after ", "") if evaluation else ("", ", or set allow-missing=true to go on without them")
        )
        super().__init__(
            f"{stage}round {round_.number}: no accepted reply from client(s) {', '.join(map(str, clients))} "
            f"({reasons}); rerun to resume from the last checkpoint{instead}"
        )


class Transport(Protocol):
    """How a round's jobs reach the client side and their replies come back (module docstring)."""

    lossy: bool  # whether a planned client can be left without a reply (rounds.csv then names them)

    def train(
        self, round_: Round, plans: list[ClientPlan], start: Callable[[ClientPlan], State], broadcasts: dict[int, State]
    ) -> Iterator[Reply]:
        """Round `round_` of the planned clients, each from `start(plan)` and its
        federation's broadcast: one Reply per plan, each as it arrives (any order)."""
        ...

    def score(self, round_: Round, jobs: list[ClientEval], start: Callable[[int], State]) -> list[Scores]:
        """Each listed client model's scores after round `round_` (Round(0): before any), where the client is:
        its group's global weights `start(group)` with what it keeps; stops (MissingClients) naming
        the clients without valid ones."""
        ...

    def kept_sha256(self) -> dict[int, str]:
        """Each client that keeps entries of its model -> their SHA-256 (the run's fingerprint)."""
        ...

    def attach(self, folder: Path) -> None:
        """The run directory's folder for what the client side keeps beyond memory (if it is here)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds of the client side (its store here; its hashes elsewhere)."""
        ...

    def load_state_dict(self, payload: dict[str, Any]) -> None: ...


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
    """Why a client's scores cannot be used ('' if they can): the asked client's, one per split,
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


def by_client(jobs: list[ClientEval]) -> dict[int, list[ClientEval]]:
    """An evaluation's client models grouped by client (one message, one model each), in order."""
    grouped: dict[int, list[ClientEval]] = {}
    for job in jobs:
        grouped.setdefault(job.client, []).append(job)
    return grouped
