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

What cannot run this way is refused before anything starts (`refusal`): evaluation that
scores client models with what the clients keep, or gathers BN statistics from every client's
training images, needs data the server does not have.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from incofl.config import ConfigError, RunConfig
from incofl.fl.contracts import ClientPlan, ClientUpdate, RoundReport, State
from incofl.fl.engine.engine import Engine
from incofl.fl.stages.local import Objective
from incofl.registry import METHODS, layout_of
from incofl.spec import WIDTH_LAYOUT

log = logging.getLogger("incofl.federation")


class MissingClients(RuntimeError):
    """Planned clients without an accepted reply (the run stops unless allow_missing)."""

    def __init__(self, round_: int, clients: list[int], why: dict[int, str]):
        self.round, self.clients = round_, clients
        reasons = "; ".join(f"client {c}: {why[c]}" for c in clients)
        super().__init__(
            f"round {round_}: no accepted reply from client(s) {', '.join(map(str, clients))} "
            f"({reasons}); rerun to resume from the last checkpoint, or set allow-missing=true "
            "to go on without them"
        )


@dataclass
class Reply:
    """What came back for one planned client: its update, or why there is none."""

    update: ClientUpdate | None = None
    kept_sha256: str = ""
    error: str = ""
    node: int = 0


class Exchange(Protocol):
    def __call__(self, round_: int, jobs: list[tuple[ClientPlan, State, State]]) -> list[Reply]:
        """Send each (plan, start, broadcast) to its client's node; one Reply per job, in order."""
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


@dataclass
class RemoteTrainer:
    """The train stage of a federated run: every planned client trains on its node."""

    exchange: Exchange
    allow_missing: bool = False
    missing: list[int] = field(default_factory=list)  # this round's planned clients without an accepted reply
    kept: dict[int, str] = field(default_factory=dict)  # client -> hash of what it keeps (its last reply's)

    def train(
        self, round_: int, plans: list[ClientPlan], start_of: Callable[[ClientPlan], State], objective: Objective
    ) -> list[ClientUpdate]:
        """The accepted updates of the round's planned clients, in the plans' order."""
        jobs = [(plan, start_of(plan), objective.broadcast(plan.federation)) for plan in plans]
        replies = self.exchange(round_, jobs)
        updates, why = [], {}
        for (plan, start, _), reply in zip(jobs, replies, strict=True):
            if reply.update is None:
                problem = reply.error or "no reply"
            else:
                problem = reply.error or check_update(plan, start, reply.update)
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


class FederatedEngine(Engine):
    """The run's engine whose clients train on the nodes (module docstring); `remote` is set
    before the first round (`federate`)."""

    remote: RemoteTrainer

    def federate(self, remote: RemoteTrainer) -> None:
        self.remote = remote

    def run_round(self, round_: int) -> RoundReport:
        plans = self.plan(round_)
        updates = self.remote.train(round_, plans, self.start, self.objective)
        accepted = {u.client for u in updates}
        return self.conclude(round_, [p for p in plans if p.client in accepted], updates)

    def observe(self, report: RoundReport) -> None:
        """The simulator's observers; rounds.csv also names the clients left out (allow-missing)."""
        super().observe(report)
        self.costs.rows[-1]["missing"] = " ".join(map(str, self.remote.missing))


def refusal(cfg: RunConfig) -> str:
    """Why `cfg` cannot run as a real federation ('' if it can)."""
    if layout_of(cfg) is WIDTH_LAYOUT and cfg.bn_at_eval == "static":
        return (
            "eval_bn: static gathers BN statistics from every client's training images on the server; "
            "set eval_bn: batch"
        )
    if METHODS[cfg.method].planner.personal:
        return "its evaluation scores every client's model with the entries the client keeps for itself"
    if cfg.holdout:
        return "holdout: the personal accuracy scores every client's model on its held-out data on the server"
    if cfg.bn_stats == "local":
        return "bn_stats: local: evaluation scores each group's model with its first client's BN statistics"
    return ""


def check_federated(cfg: RunConfig) -> None:
    """Refuse, in one line naming the method, what cannot run as a real federation."""
    why = refusal(cfg)
    if why:
        raise ConfigError(f"method {cfg.method} cannot run as a real federation with this config: {why}")
