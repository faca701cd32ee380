"""The round split: the client side trains a planned client from the server's start weights
with nothing of the server's (a federation's node holds only its own data), and the server
side concludes the round from the updates; the two together are the simulator's round."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from helpers import engine_on, small_synthetic

from incofl.data.tensors import TensorSplit
from incofl.fl.contracts import Round, Setup
from incofl.fl.engine.fold import RoundFold
from incofl.fl.stages.client import KEPT, ClientRunner
from incofl.fl.stages.clientstore import ClientStore
from incofl.registry import METHODS

SETTINGS = {
    "clients": 4,
    "ratio": 0.5,
    "rounds": 3,
    "batch_size": 16,
    "models": ["resnet10", "resnet14"],
    "model_scale": 0.25,
    "bn_stats": "local",
}


@pytest.fixture(scope="module")
def data():
    return small_synthetic(64)


def node_of(engine, client: int) -> ClientRunner:
    """A client side built as a node builds it: the config, a fresh objective, its own copies of
    the group models and only this client's training samples."""
    cfg, train = engine.transport.clients.runner.trainer.settings, engine.transport.clients.training.train
    own = torch.from_numpy(engine.transport.clients.training.parts[client])
    split = TensorSplit(
        train.x[own].numpy(),
        train.y[own].numpy(),
        train.mean.flatten().numpy(),
        train.std.flatten().numpy(),
        train.x.device,
        train.input_size,
        train.augmenter,
    )
    method, store = METHODS[cfg.method], ClientStore()  # the node's own store: what its client keeps
    objective = method.objective.cls.client(method.parse_args(cfg.method_args), Setup(cfg, [], store=store))
    return ClientRunner(
        cfg, objective, copy.deepcopy(engine.server.models), split, {client: np.arange(len(own))}, store
    )


@pytest.mark.slow
def test_a_node_trains_its_client_as_the_simulator_does(data):
    """Each round the node trains its client from the server's start weights (overlaying the BN
    statistics it kept from its last round itself): the same update, bit for bit."""
    engine = engine_on(data, method="FedAvg", **SETTINGS)
    sampled = [int(c) for t in range(engine.server.settings.rounds) for c in engine.server.schedule[t]]
    client = max(set(sampled), key=sampled.count)  # sampled in two rounds at least: it starts from what it kept
    node, trained = node_of(engine, client), 0
    for t in Round.upto(engine.server.settings.rounds):
        plans, server = engine.server.plan(t), engine.server
        starts = {plan.client: server.start(plan) for plan in plans}
        fold = RoundFold(server, t, plans)
        for plan, reply in zip(
            plans, engine.transport.train(t, plans, server.start, server.broadcasts(plans)), strict=True
        ):
            update = reply.update
            if plan.client == client:
                mine = node.train(t, plan, starts[client])
                assert mine.delta.keys() == update.delta.keys() and mine.kept.keys() == update.kept.keys()
                assert all(torch.equal(mine.delta[k], v) for k, v in update.delta.items())
                assert all(torch.equal(mine.kept[k], v) for k, v in update.kept.items())
                trained += 1
            fold.add(update)
        fold.finish()
    assert trained >= 2 and node.store.clients(KEPT) == [client]
