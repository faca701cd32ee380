"""One client of a real federation, without Flower: the run's engine built on the node from
the config and that client's data alone (sitedata.py), used for its trainer, objective and
evaluation.

A planned round: the objective receives the server's broadcast (SCAFFOLD's c), then the
engine's client side (`Engine.client`) lays what this client keeps over the server's start
weights and trains exactly as the simulator does (the config's trainer, the method's objective,
the client's own batch stream). An evaluation scores the client's model (its group's global
weights with what it keeps) with the layout's own scoring (the held-out share, the test split).

What the client keeps across rounds (the engine's ClientStore: its kept entries, SCAFFOLD's
c_i, MOON's previous models) is saved on the node after every round it trains, one file per
round in `state_dir/<run key>/` (`NodeState`): a round starts from the client's state after the
last round before it, so a restarted server resuming from its checkpoint finds each client as
it was then, and the run goes on as if never stopped.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import torch

from incofl.atomic import atomic_path
from incofl.config import RunConfig
from incofl.federation.server import EvalJob
from incofl.federation.sitedata import load_site, test_sha256
from incofl.fl.contracts import ClientPlan, ClientUpdate, State
from incofl.fl.engine.engine import Engine, resolve_device
from incofl.fl.engine.fingerprint import state_sha256
from incofl.fl.stages.client import KEPT
from incofl.fl.stages.evaluation import Scores
from incofl.fl.stages.layout import ClientEval


class NodeState:
    """A client's states after the rounds it trained, for one run: `after-round-R.pt` files in
    `folder` (written atomically; read with weights_only, so no code runs)."""

    FILE = re.compile(r"after-round-(\d+)\.pt")

    def __init__(self, folder: Path, checkpoint_every: int):
        self.folder, self.every = folder, checkpoint_every
        folder.mkdir(parents=True, exist_ok=True)

    def rounds(self) -> list[int]:
        return sorted(int(m[1]) for p in self.folder.iterdir() if (m := self.FILE.fullmatch(p.name)))

    def at(self, round_: int) -> dict[str, Any] | None:
        """The state after round `round_` (1-based): the last one saved at or before it; None before any."""
        saved = [r for r in self.rounds() if r <= round_]
        if not saved:
            return None
        return torch.load(self.folder / f"after-round-{saved[-1]}.pt", map_location="cpu", weights_only=True)

    def save(self, round_: int, state: dict[str, Any]) -> None:
        """The state after round `round_`; states no checkpoint of the server can resume from are dropped:
        older than the last one at or before the server's last checkpoint."""
        with atomic_path(self.folder / f"after-round-{round_}.pt") as tmp:
            torch.save(state, tmp)
        checkpoint = (round_ - 1) // self.every * self.every
        needed = [r for r in self.rounds() if r <= checkpoint]
        for r in self.rounds():
            if needed and r < needed[-1]:
                (self.folder / f"after-round-{r}.pt").unlink(missing_ok=True)


def run_key(cfg: RunConfig) -> str:
    """The folder name of a run's node states: its config's hash (a resumed run's is the same)."""
    return hashlib.sha256(json.dumps(cfg.model_dump(), sort_keys=True).encode()).hexdigest()[:16]


class SiteClient:
    """Client `client` of the run `cfg`, with its data file and the folder its states are saved
    in (module docstring): the engine's client side and objective, on the node's data alone."""

    def __init__(self, cfg: RunConfig, client: int, data_path: str | Path, state_dir: str | Path):
        self.cfg, self.client = cfg, client
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        data, partition = load_site(data_path, cfg, client)
        self.test_sha256 = test_sha256(data)
        # the engine seeds the models' initialisation: the caller's random stream is left as it was
        with torch.random.fork_rng(devices=[]):
            self.engine = Engine(cfg, data, partition, resolve_device(cfg.device))
        self.states = NodeState(Path(state_dir) / run_key(cfg) / f"client{client}", cfg.checkpoint_every)
        self.fresh = self.engine.clients.state_dict()  # a client before its first round: it keeps nothing

    def restore(self, round_: int) -> None:
        """What the client kept after round `round_` (1-based; none before its first round)."""
        state = self.states.at(round_)
        self.engine.clients.load_state_dict(state if state is not None else self.fresh)

    def train(self, round_: int, plan: ClientPlan, start: State, broadcast: State) -> tuple[ClientUpdate, str]:
        """One planned round (0-based `round_`) from the server's start weights and its
        objective's broadcast: the update, and the hash of what the client keeps (never sent
        itself; '' if it keeps nothing)."""
        if plan.client != self.client:
            raise ValueError(f"a plan for client {plan.client} sent to client {self.client}'s node")
        engine = self.engine
        self.restore(round_)
        engine.objective.receive(plan.federation, broadcast)
        update = engine.client.train(round_, plan, start)
        self.states.save(round_ + 1, engine.clients.state_dict())
        kept = engine.clients.get(KEPT, self.client)
        return update, "" if kept is None else state_sha256(kept)

    def evaluate(self, round_: int, job: EvalJob) -> list[Scores]:
        """The client's model after round `round_` (1-based) scored on each of the job's splits."""
        if job.client != self.client:
            raise ValueError(f"an evaluation of client {job.client} sent to client {self.client}'s node")
        self.restore(round_)
        state = self.engine.client.overlay(self.client, job.start)
        return [self.engine.layout.score(ClientEval(self.client, job.group, split), state) for split in job.splits]
