"""State is declared, not remembered (fl/stages/component.py): a round of every registered
method changes no attribute of any of its components that the component does not declare as
`state` (checkpointed) or `scratch` (recomputed), so a component cannot keep state that a resume
would silently drop. docs/add-a-method.md's server momentum without its declaration fails it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import small_synthetic
from test_resume import momentum_example, settings

from incofl.data.partition import partition_for
from incofl.fl.contracts import Round
from incofl.fl.engine.engine import Engine
from incofl.fl.engine.simulator import simulator
from incofl.fl.stages.component import Stateful, restore, snapshot
from incofl.fl.stages.objective import ClientObjective, Objective
from incofl.registry import METHODS, Component, Method, register


def copied(value: Any) -> Any:
    """A value to compare later: containers and tensors copied, any other object by identity."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return {k: copied(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(copied(v) for v in value)
    if isinstance(value, set):
        return set(value)
    return value


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, str | int | float | bool | set | frozenset | type(None)):
        return type(a) is type(b) and (a == b or a != a and b != b)  # NaN equals NaN here
    return a is b  # models, data, the store: shared objects, not the component's own values


def attributes(component: Stateful) -> dict[str, Any]:
    return {name: copied(value) for name, value in vars(component).items()}


def undeclared_changes(engine: Engine, rounds: int) -> list[str]:
    """`role.attribute` of every undeclared attribute a round changed, over the first `rounds`."""
    changed = []
    for round_ in Round.upto(rounds):
        components = [*engine.server.components(), ("clients' objective", engine.transport.clients.runner.objective)]
        before = {role: attributes(c) for role, c in components}
        engine.observe(engine.run_round(round_))
        for role, component in components:
            declared = {*component.state, *component.scratch}
            now = vars(component)
            for name in sorted(set(before[role]) | set(now)):
                if name not in declared and not same(before[role].get(name), now.get(name)):
                    changed.append(f"{role}.{name} ({type(component).__name__})")
    return sorted(set(changed))


@pytest.fixture(scope="module")
def data():
    return small_synthetic(96)


def engine_for(name: str, data) -> Engine:
    from incofl.config import RunConfig

    cfg = RunConfig(**{**settings(name), "rounds": 2})
    return simulator(cfg, data, partition_for(cfg, data), torch.device("cpu"))


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_declares_the_state_a_round_changes(name, data):
    engine = engine_for(name, data)
    assert undeclared_changes(engine, 2) == []


def test_every_declared_state_round_trips_through_a_checkpoint(data):
    """What a component declares is saved as plain types and loaded back equal, in its own kinds."""
    engine = engine_for("FedLAG", data)
    for round_ in Round.upto(2):
        engine.observe(engine.run_round(round_))
    for role, component in engine.server.components():
        saved = component.state_dict()
        assert not any(isinstance(v, np.ndarray) for v in saved.values()), role
        before = attributes(component)
        component.load_state_dict(saved)
        assert all(same(before[k], getattr(component, k)) for k in component.state), role
    assert isinstance(restore(snapshot(np.arange(3)), np.zeros(1, np.int64)), np.ndarray)


def momentum_without_its_declaration() -> type:
    """The doc's server momentum with its `state = (...)` line taken out."""
    cls = momentum_example()
    doc = (Path(__file__).resolve().parents[1] / "docs" / "add-a-method.md").read_text()
    assert re.search(r'class ServerMomentum\(AverageTransform\):.*\n    state = \("buffers",\)', doc)
    return type("ServerMomentum", (cls,), {"state": ()})


@pytest.mark.parametrize("declared", [True, False])
def test_a_transform_that_forgets_to_declare_its_state_fails(declared, data):
    transform = momentum_example() if declared else momentum_without_its_declaration()
    register(Method("FedAvgM", post=(Component(transform),), source="server momentum (example)"))
    try:
        changes = undeclared_changes(engine_for("FedAvgM", data), 2)
    finally:
        METHODS.pop("FedAvgM")
    assert changes == ([] if declared else ["post.0.buffers (ServerMomentum)"])


class PeekingClient(ClientObjective):
    """The clients' half: its sessions read the server's `rounds_done` as it was delivered
    (kept in `seen`)."""

    scratch = ("rounds_done", "seen")

    def __init__(self, hp, setup):
        super().__init__(hp, setup)
        self.rounds_done, self.seen = torch.zeros(()), []

    def session(self, ctx):
        self.seen.append(int(self.rounds_done))
        return super().session(ctx)

    def receive(self, federation, state):
        if state:
            self.rounds_done = state["rounds_done"]


class Peeking(Objective):
    """A server state (`rounds_done`, moved at every round's end) sent to the clients only when
    `broadcasts`."""

    client = PeekingClient
    state = ("rounds_done",)
    broadcasts = False

    def __init__(self, hp, setup):
        super().__init__(hp, setup)
        self.rounds_done = torch.zeros(())

    def server_round_end(self):
        self.rounds_done += 1

    def broadcast(self, federation):
        return {"rounds_done": self.rounds_done} if self.broadcasts else {}


@pytest.mark.parametrize("broadcasts", [False, True])
def test_a_session_sees_server_state_only_as_delivered(broadcasts, data):
    """In the simulator as in a federation, a session reads the clients' objective, which holds
    what the server's broadcast delivered (a copy), never the server's objects."""
    objective = type("Peeking", (Peeking,), {"broadcasts": broadcasts})
    register(Method("Peeking", objective=Component(objective), source="boundary test"))
    try:
        engine = engine_for("Peeking", data)
        for round_ in Round.upto(2):
            engine.observe(engine.run_round(round_))
    finally:
        METHODS.pop("Peeking")
    assert (
        engine.transport.clients.runner.objective is not engine.server.objective
        and int(engine.server.objective.rounds_done) == 2
    )
    per_round = len(engine.server.schedule[0])
    assert engine.transport.clients.runner.objective.seen == [0] * per_round + [1 if broadcasts else 0] * per_round
