"""The round loop: one federated run's server states and the components of its round's stages.

A round is plan -> train -> transform -> aggregate (-> transform) -> apply -> observe, and
every few rounds evaluate. It is split where a real federation splits it: the server side
plans the round (`plan`), gives each planned client its start weights (`start`) and what its
objective broadcasts (`deliver`) and, given the clients' updates, does the rest (`conclude`);
the client side (`ClientRunner`, fl/stages/client.py, with an objective object of its own)
trains a planned client from what it was given to its update. The simulator calls both in one
process (`run_round`), keeping the boundary a deployment has; a Flower app calls them across a
network.
Every component's state is checkpointed by its role (`components`). The registry (registry.py)
names each stage's component for the run's method and the layout for its model; the engine
builds them in one downward pass (data, models, method) and calls them. It names no method,
model family or model: a test greps it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

from incofl.config import ConfigError, RunConfig
from incofl.data.augment import resolve_augment
from incofl.data.dataset import ImageDataset
from incofl.data.partition import Partition, holdout_split
from incofl.data.tensors import to_device
from incofl.fl.contracts import ClientPlan, ClientUpdate, RoundReport, Setup, Trained
from incofl.fl.engine.checkpoint import CheckpointMismatch
from incofl.fl.engine.fingerprint import run_fingerprint, state_sha256
from incofl.fl.engine.fold import RoundFold
from incofl.fl.stages.client import KEPT, ClientRunner
from incofl.fl.stages.clientstore import ClientStore
from incofl.fl.stages.component import Stateful
from incofl.fl.stages.evaluation import Scores
from incofl.fl.stages.layout import ClientEval, Layout, LayoutInputs
from incofl.fl.stages.observers import CostLog
from incofl.fl.stages.probes import analyses_for
from incofl.fl.stages.sampling import group_of, sample_schedule
from incofl.fl.stages.transforms import EpochScale, UpdateNoise
from incofl.models.family import build_model, input_size
from incofl.numerics import activate
from incofl.params import Params
from incofl.registry import METHODS, Component, Method, layout_of


def run_device(cfg: RunConfig) -> torch.device:
    """The device a run computes on, its numerics in effect: a portable run computes on the CPU
    with every pin checked (incofl.numerics), so `device: auto` means the CPU there."""
    activate(cfg.numerics)
    return resolve_device("cpu" if cfg.numerics == "portable" else cfg.device)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda, but this machine has no CUDA device (device: auto uses the CPU then)")
    return torch.device(name)


class Engine:
    """One federated run: the server states and the method's stage components around them."""

    def __init__(self, cfg: RunConfig, data: ImageDataset, partition: Partition, device: torch.device):
        """Built in one downward pass: the data, then the models (laid out as the run's model
        asks), then the method's stage components, the trainer and the server states."""
        self.cfg, self.device = cfg, device
        self._data(data, partition)
        torch.manual_seed(cfg.seed)  # the models' initialisation
        method = METHODS[cfg.method]
        hp = method.parse_args(cfg.method_args)
        self._models(data, layout_of(cfg), method.model_kwargs(hp))
        self._method(method, hp)

    def _data(self, data: ImageDataset, partition: Partition) -> None:
        """Each client's training indices (with `holdout`, less its held-out share) and the
        splits on the device, in the models' input size, with the augmentation they train with."""
        cfg, self.parts = self.cfg, partition.parts
        if len(self.parts) != cfg.clients:
            raise ValueError(f"partition has {len(self.parts)} clients, config has clients={cfg.clients}")
        self.held_out: list[np.ndarray] | None = None  # each client's held-out indices (holdout > 0)
        if cfg.holdout:
            self.parts, self.held_out = holdout_split(self.parts, data.y_train, cfg.holdout, cfg.partition_seed)
        self.size = input_size(cfg.models[0], cfg.resize or data.image_size)
        aug = resolve_augment(cfg.augment, cfg.dataset, model=cfg.models[0], cutout=cfg.cutout, pad_fill=cfg.pad_fill)
        self.train_data, self.test_data = to_device(data, self.device, self.size, aug, cfg.normalize)

    def _models(self, data: ImageDataset, layout: Component, model_kwargs: dict[str, Any]) -> None:
        """The models, laid out by their layout: built, started from and evaluated (fl/stages/layout.py)."""
        cfg, device = self.cfg, self.device

        def build(name: str, **model_args: Any) -> nn.Module:
            model = build_model(
                name,
                data.num_classes,
                data.channels,
                stem=cfg.stem,
                pretrained=cfg.pretrained,
                image_size=self.size,
                scale=cfg.model_scale,
                **model_args,
                **model_kwargs,
            ).to(device)
            return model.to(memory_format=torch.channels_last) if cfg.channels_last else model

        groups = [group_of(c, cfg.clients, cfg.groups) for c in range(cfg.clients)]
        inputs = LayoutInputs(cfg, build, self.size, self.train_data, self.test_data, self.parts, self.held_out, groups)
        self.layout: Layout = layout.cls(inputs)
        self.models, self.server_model = self.layout.models, self.layout.server_model
        self.names = [list(m.state_dict()) for m in self.models]

    def _method(self, method: Method, hp: Params) -> None:
        """The method's component of each stage, the client side, and the server states they start from."""
        cfg, server = self.cfg, self.server_model.state_dict()
        aggregator = method.aggregator.cls
        self.store = ClientStore(cfg.client_memory_mb)  # what each client keeps across rounds
        setup = Setup(cfg, list(server), self.layout, self.models, aggregator.federation, self.store)
        self.objective = method.objective.cls(hp, setup)  # the server's side (its state, broadcast, round end)
        client_objective = method.objective.cls(hp, setup)  # the clients' side: sessions, what is delivered
        self.aggregator = aggregator(hp, setup)
        noise = [UpdateNoise(hp, setup)] if cfg.update_noise else []  # robustness: before any other transform
        self.pre = [*noise, *(transform.cls(hp, setup) for transform in method.pre)]
        scale = [EpochScale(hp, setup)] if cfg.scales_epochs else []  # the release's, for every method: first
        self.post = [*scale, *(transform.cls(hp, setup) for transform in method.post)]
        self.costs = CostLog(hp, setup)  # every method's; its totals go into metrics.csv and summary.json
        self.observers = [self.costs, *(observer.cls(hp, setup) for observer in method.observers)]
        self.observers += analyses_for(cfg, self.models, self.test_data)  # none unless `analyses` lists rounds
        self.planner = method.planner.cls(hp, setup)
        self.runner = ClientRunner(cfg, client_objective, self.models, self.train_data, self.parts, self.store)
        if self.aggregator.shared:
            self.states = [{k: v.detach().clone() for k, v in server.items()}]
        else:
            self.states = [{k: server[k].detach().clone() for k in names} for names in self.names]
        self.schedule = sample_schedule(cfg.seed, cfg.clients, cfg.ratio, cfg.rounds)
        for objective in (self.objective, client_objective):  # read-only; an objective keeps a copy if it needs one
            objective.begin(server)

    def components(self) -> list[tuple[str, Stateful]]:
        """Every stage component by its role: what a checkpoint holds the state of."""
        listed = [("pre", self.pre), ("post", self.post)]
        return [
            ("objective", self.objective),
            ("aggregator", self.aggregator),
            *((f"{stage}.{i}", c) for stage, components in listed for i, c in enumerate(components)),
            ("planner", self.planner),
            *((f"observers.{i}", o) for i, o in enumerate(self.observers)),
            ("layout", self.layout),
        ]

    def sub_state(self, group: int) -> dict[str, torch.Tensor]:
        """The global weights a group's model trains from and is evaluated with."""
        state = self.states[self.aggregator.federation(group)]
        return {k: state[k] for k in self.names[group]}

    def client_state(self, client: int, group: int) -> dict[str, torch.Tensor]:
        """The weights of a client's model: its group's global sub-state with what it keeps."""
        return self.runner.overlay(client, self.sub_state(group))

    def plan(self, round_: int) -> list[ClientPlan]:
        """The round's sampled clients (the seeded schedule), each with its planner's plan."""
        return [self.planner.plan(round_, int(c)) for c in self.schedule[round_]]

    def start(self, plan: ClientPlan) -> dict[str, torch.Tensor]:
        """The server's weights a planned client trains from (the layout's choice); the client
        overlays what it keeps itself (ClientRunner.own_start)."""
        return self.layout.start(plan, self.states, self.sub_state)

    def deliver(self, plans: list[ClientPlan]) -> None:
        """What the server's objective sends the planned clients besides the weights (its
        `broadcast`), copied to the clients' side as a network would: a session reads server
        state only through what was delivered, in the simulator as in a real federation."""
        for federation in sorted({plan.federation for plan in plans}):
            sent = self.objective.broadcast(federation)
            self.runner.objective.receive(federation, {k: v.clone() for k, v in sent.items()})

    tick: Callable[[], object] | None = None  # called as each client's update is folded in (a progress bar)

    def run_round(self, round_: int) -> RoundReport:
        """plan -> deliver -> train (the client side) -> conclude (the server side), each client's
        update folded in as soon as it is trained; the round's report."""
        plans = self.plan(round_)
        self.deliver(plans)
        return self.conclude(round_, plans, self.runner.stream_round(round_, plans, self.start))

    def conclude(self, round_: int, plans: list[ClientPlan], updates: Iterable[ClientUpdate]) -> RoundReport:
        """The server side of a round, given its plans and their clients' updates (in any order:
        folded in the plans'; planned clients without one are left out), each as it comes: check ->
        planner.observe -> transform -> aggregate, then (-> transform) -> apply -> check -> the
        objective's server end (fl/engine/fold.py); the round's report. Analyses that want the
        round see its trained clients and averaged updates."""
        fold = RoundFold(self, round_, plans)
        for update in updates:
            fold.add(update)
        return fold.finish()

    def trained(self, plan: ClientPlan, update: ClientUpdate) -> Trained:
        """A client's model after this round's training (before the round is applied): its start,
        what it keeps, and its update."""
        start = self.start(plan)
        state = {**start, **update.kept, **{k: start[k] + d for k, d in update.delta.items()}}
        return Trained(plan.client, plan.group, state, update.delta, plan.view)

    def observe(self, report: RoundReport) -> None:
        for observer in self.observers:
            observer.observe(report)

    def evaluate(self) -> dict[str, float]:
        """The metrics of an evaluated round (the layout scores the server states and the client
        models it lists, which this engine holds: `score_clients`)."""
        return self.layout.evaluate(self.states, self.score_clients)

    def score_clients(self, jobs: list[ClientEval]) -> list[Scores]:
        """Each listed client model's scores, its weights its group's global weights with what it keeps."""
        return [self.layout.score(job, self.client_state(job.client, job.group)) for job in jobs]

    def fingerprint(self) -> str:
        """The run's weights as one SHA-256 (fingerprint.py): the server states and what clients keep."""
        return run_fingerprint(self.states, self.kept_sha256())

    def kept_sha256(self) -> dict[int, str]:
        """Each client that keeps entries -> their SHA-256."""
        return {c: state_sha256(self.store.get(KEPT, c)) for c in self.store.clients(KEPT)}

    def state_dict(self) -> dict[str, Any]:
        """The server states, every component's state by its role, and what clients keep."""
        return {
            "states": [{k: v.cpu() for k, v in s.items()} for s in self.states],
            "components": {role: c.state_dict() for role, c in self.components()},
            "kinds": self.kinds(),
            "clients": self.store.state_dict(),
        }

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        """Restore `state_dict`; a checkpoint of other components (another method or settings,
        or an older incofl's) is refused with one line naming the first role that differs."""
        ours, theirs = self.kinds(), payload.get("kinds", {})
        if theirs != ours:
            role = next(r for r in [*ours, *theirs] if ours.get(r) != theirs.get(r))
            had, have = theirs.get(role, "absent"), ours.get(role, "absent")
            raise CheckpointMismatch(
                f"components: the checkpoint's {role} is {had}, this run's {have}; "
                "delete the checkpoint or use another --out"
            )
        for state, saved in zip(self.states, payload["states"], strict=True):
            for k, v in saved.items():
                state[k].copy_(v)
        for role, component in self.components():
            component.load_state_dict(payload["components"][role])
        self.store.load_state_dict(payload["clients"])

    def kinds(self) -> dict[str, str]:
        """Each component's role -> its class's name."""
        return {role: type(component).__name__ for role, component in self.components()}
