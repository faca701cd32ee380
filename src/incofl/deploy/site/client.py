"""One client of a real federation, without Flower: the run's client side (fl/engine/clients.py)
built on the node by the client side's builder (`build_clients`) from the schedule it was told
(wire/schedule.py: its record of the run's settings, no `RunConfig`) and that client's data alone
(sitedata.py, owndata.py).

A job (fl/engine/exchange.py) is answered by the function the simulator's in-process transport
answers with (`Clients.train`, `Clients.score`): a TrainJob's broadcast (SCAFFOLD's c) is
received, then the client side lays what this client keeps over the server's start weights and
trains exactly as the simulator does (the config's trainer, the method's objective, the
client's own batch stream); an EvalJob scores the client's model (its group's global weights
with what it keeps) with the layout's own scoring (the held-out share, the test split).

What the client keeps across rounds (its ClientStore: its kept entries, SCAFFOLD's c_i, MOON's
previous models) is saved on the node after every round it trains, one file per round in
`state_dir/<run key>/` (`SavedStores`): a round starts from the client's store after the last
round before it, so a restarted server resuming from its checkpoint finds each client as it was
then, and the run goes on as if never stopped. A node's disk holds what a resume needs, no more:
of a client's stores the last and the one the server's last checkpoint resumes from, of the run
folders the current run's and the one used before it (`keep_recent_runs`). The node reports
the hash of that store (never the store) and the server sends it back with the client's next
job: a node whose restored store is another (its files moved or deleted) refuses to go on
(`StaleState`) rather than train from a fresh one.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from incofl.atomic import save_tensors
from incofl.data.shares import Holdings
from incofl.deploy.site.owndata import load_own
from incofl.deploy.site.sitedata import load_site
from incofl.deploy.wire.exported import test_sha256
from incofl.deploy.wire.schedule import RUN_FOLDER, Schedule
from incofl.fl.contracts import ClientUpdate, Round
from incofl.fl.engine.checkpoint import last_checkpoint
from incofl.fl.engine.clients import build_clients
from incofl.fl.engine.device import side_device
from incofl.fl.engine.exchange import EvalJob, TrainJob
from incofl.fl.engine.fingerprint import state_sha256
from incofl.fl.stages.evaluation import Scores
from incofl.fl.stages.layout import ClientEval


class SavedStores:
    """A client's stores after the rounds it trained, for one run: `after-round-R.pt` files in
    `folder` (written atomically; read with weights_only, so no code runs)."""

    FILE = re.compile(r"after-round-(\d+)\.pt")

    def __init__(self, folder: Path, every: int):
        self.folder, self.every = folder, every  # every: the run's checkpoint_every

    def rounds(self) -> list[int]:
        if not self.folder.is_dir():  # none saved (or the folder deleted: the caller's hash check tells)
            return []
        return sorted(int(m[1]) for p in self.folder.iterdir() if (m := self.FILE.fullmatch(p.name)))

    def path(self, round_: int) -> Path:
        return self.folder / f"after-round-{round_}.pt"

    def at(self, round_: int) -> dict[str, Any] | None:
        """The state after round number `round_`: the last one saved at or before it; None before any."""
        saved = [r for r in self.rounds() if r <= round_]
        if not saved:
            return None
        from incofl.deploy.wire.credentials import check_private  # a folder others may enter: refused, naming it

        check_private(self.folder)
        return torch.load(self.path(saved[-1]), map_location="cpu", weights_only=True)

    def save(self, round_: int, state: dict[str, Any]) -> None:
        """The store after round `round_`, and of the others only the one a resume needs: the last at
        or before the server's last checkpoint before this round (a run that stops from now on resumes
        from that checkpoint, or a later one, after which this store is the last). Stores between the
        two, and those after this round (a stopped run's, which the resumed run trains again), go."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # 0700: its states are its owner's only
        save_tensors(self.path(round_), state)  # a full disk: one line naming the file
        checkpoint = last_checkpoint(round_, self.every)
        saved = self.rounds()
        keep = {round_, *[r for r in saved if r <= checkpoint][-1:]}
        for r in saved:
            if r not in keep:
                self.path(r).unlink(missing_ok=True)


KEEP_RUNS = 2  # run folders a node keeps: the current run's and the last before it (which may resume)


def keep_recent_runs(state_dir: Path, current: str) -> None:
    """Mark run `current`'s folder in `state_dir` as used now, and remove the run folders but the
    KEEP_RUNS used last: a node's disk holds the stores of the runs it may still resume, not every
    config it ever ran (a run resumed after an older one was removed refuses by name: StaleState)."""
    folder = state_dir / current
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.utime(folder)
    runs = [p for p in state_dir.iterdir() if RUN_FOLDER.fullmatch(p.name) and p.is_dir() and not p.is_symlink()]
    runs.sort(key=lambda p: (p == folder, p.stat().st_mtime), reverse=True)
    for old in runs[KEEP_RUNS:]:
        shutil.rmtree(old)


def store_sha256(state: dict[str, Any]) -> str:
    """SHA-256 of a client store's `state_dict` (its states in memory: a node spills none), by key."""
    digest = hashlib.sha256()
    for key in sorted(state["states"], key=str):
        digest.update(f"{key} {state_sha256(state['states'][key])}".encode())
    return digest.hexdigest()


class StaleState(RuntimeError):
    """The state a node restored is not the one its client last reported to the server."""


class SiteClient:
    """Client `client` of the run whose schedule the node was told, with its data file (an exported
    share; with `own`, the node config key of the site's own data: owndata.py) and the folder its
    stores are saved in (module docstring): the run's client side, on the node's data alone."""

    def __init__(
        self,
        told: Schedule,
        client: int,
        data_path: str | Path,
        state_dir: str | Path,
        pretrained: str | None = None,
        own: str = "",
    ):
        settings = told.settings
        self.settings, self.client, self.pretrained = settings, client, pretrained
        self.device = side_device(settings)  # and its threads
        if own:  # the site's own data under node config key `own` (owndata.py): all of it its client's
            data = load_own(own, str(data_path), settings.dataset, told.data)
            part = np.arange(len(data.y_train), dtype=np.int64)
        else:
            data, part = load_site(data_path, settings.dataset, client, told.partition)
        holdings = Holdings.of(data, {client: part}, settings.holdout, settings.partition_seed)
        self.test_sha256 = test_sha256(data.x_test, data.y_test)
        # the builder seeds the models' initialisation: the caller's random stream is left as it was
        with torch.random.fork_rng(devices=[]):
            # pretrained: the node's own file of the weights (None where the run starts from none)
            self.clients = build_clients(settings, holdings, self.device, pretrained)
        # what a site serving its own data declares at identify (an exported share's facts are the server's)
        self.declared = holdings.facts(client) if own else None
        keep_recent_runs(Path(state_dir), told.run)
        self.saved = SavedStores(Path(state_dir) / told.run / f"client{client}", settings.checkpoint_every)
        self.fresh = self.clients.store.state_dict()  # a client before its first round: it keeps nothing

    def restore(self, after: Round, expected: str) -> None:
        """The client's store after round `after` (Round(0): before any; none before its first round),
        which must be the one whose hash it last reported (`expected`; '' before any)."""
        state = self.saved.at(after.number)
        state = state if state is not None else self.fresh
        if expected and store_sha256(state) != expected:
            raise StaleState(
                f"client {self.client}: its state after round {after.number} in {self.saved.folder} is not the one "
                "it reported to the server (the node's state-dir moved, deleted or another node's?)"
            )
        self.clients.store.load_state_dict(state)

    def train(self, job: TrainJob) -> tuple[ClientUpdate, str, str]:
        """The job's round from the server's start weights and its objective's broadcast: the
        update, the hash of what the client keeps ('' if nothing) and of its whole store, saved
        (neither is ever sent)."""
        plan, clients, round_ = job.plan, self.clients, job.round
        if plan.client != self.client:
            raise ValueError(f"a plan for client {plan.client} sent to client {self.client}'s node")
        self.restore(round_.previous, job.state_sha256)  # its store after the rounds before this one
        [update] = clients.train(round_, [plan], lambda _: job.start, {plan.federation: job.broadcast})
        state = clients.store.state_dict()
        self.saved.save(round_.number, state)
        kept = clients.kept(self.client)
        return update, "" if kept is None else state_sha256(kept), store_sha256(state)

    def evaluate(self, job: EvalJob) -> list[Scores]:
        """The client's model after the job's round scored on each of its splits."""
        if job.client != self.client:
            raise ValueError(f"an evaluation of client {job.client} sent to client {self.client}'s node")
        self.restore(job.round, job.state_sha256)
        return [self.clients.score(ClientEval(self.client, job.group, split), job.start) for split in job.splits]
