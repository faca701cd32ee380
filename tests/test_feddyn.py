"""FedDyn (src/incofl/fl/methods/feddyn/, docs/methods.md): a two-client round by hand on a
linear model through the engine's stages, the reduction to FedAvg's local step as alpha -> 0,
the server's correction per federation on parameters only, and its state through a checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import engine_on, small_synthetic
from torch import nn

from incofl.config import RunConfig
from incofl.data.tensors import TensorSplit
from incofl.fl.contracts import ClientPlan, Round, RoundContext, Setup
from incofl.fl.methods.feddyn.dyn import SPACE, DynClient, DynCorrection, DynObjective
from incofl.fl.methods.inco.step import InCoStep
from incofl.fl.stages.aggregate import GroupWise, Shared, apply_update
from incofl.fl.stages.client import ClientRunner
from incofl.fl.stages.clientstore import ClientStore
from incofl.registry import METHODS
from incofl.sides import ServerSettings

SMALL = {
    "clients": 4,
    "ratio": 0.5,
    "models": ["resnet10", "resnet14"],
    "model_scale": 0.25,
    "batch_size": 16,
    "optimizer": "sgd",
    "lr": 0.05,
}


@pytest.fixture(scope="module")
def data():
    return small_synthetic(96)


def test_the_registry_composes_feddyn_and_incodyn():
    """Plain means (`weighted` cannot be switched on), and InCo's step after FedDyn's correction."""
    dyn, inco = METHODS["FedDyn"], METHODS["InCoDyn"]
    stages = [[m.objective.cls, m.aggregator.cls, *(c.cls for c in m.post)] for m in (dyn, inco)]
    assert stages == [[DynObjective, GroupWise, DynCorrection], [DynObjective, Shared, DynCorrection, InCoStep]]
    assert inco.base == "FedDyn" and dyn.parse_args({}).alpha == 0.01 and not dyn.parse_args({}).weighted


# --- a two-client round by hand -------------------------------------------------------------

ALPHA, LR, M = 0.5, 0.1, 4  # alpha and lr large enough that every term moves the weights; m = 4 clients


def _by_hand(x, y, start, g):
    """Two full-batch SGD steps on CE(x W^T + b) - <g, theta> + (alpha/2) ||theta - start||^2."""
    theta = [t.clone() for t in start]
    for _ in range(2):
        params = [t.clone().requires_grad_() for t in theta]
        grads = torch.autograd.grad(F.cross_entropy(x @ params[0].T + params[1], y), params)
        theta = [t - LR * (d + ALPHA * (t - s) - gk) for t, d, s, gk in zip(theta, grads, start, g, strict=True)]
    return theta


def test_two_rounds_of_two_clients_equal_the_algorithm_by_hand():
    """Round 1: clients 0 and 1 (g = 0); round 2: clients 0 (its g from round 1) and 2 (g = 0),
    of m = 4 clients: the weights, each client's g_k and the server's h as Algorithm 1 gives them."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    cfg = RunConfig(clients=M, models=["resnet10"], optimizer="sgd", lr=LR, batch_size=4, local_epochs=2)
    x = torch.randint(0, 256, (4 * M, 3, 2, 2), dtype=torch.uint8)
    y = torch.randint(0, 3, (4 * M,))
    split = TensorSplit(x.numpy(), y.numpy(), np.zeros(3), np.ones(3), torch.device("cpu"), 2)
    parts = [np.arange(4 * k, 4 * k + 4) for k in range(M)]
    store = ClientStore()
    setup = Setup(
        ServerSettings.of(cfg), list(model.state_dict()), models=[model], federation=GroupWise.federation, store=store
    )
    hp = METHODS["FedDyn"].parse_args({"alpha": ALPHA})
    objective, aggregator, post = DynClient(hp, setup), GroupWise(hp, setup), DynCorrection(hp, setup)
    runner = ClientRunner(cfg, objective, [model], split, parts, store)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    features = x.flatten(1).float() / 255.0
    theta = [state["1.weight"].clone(), state["1.bias"].clone()]
    zero = [torch.zeros_like(t) for t in theta]
    g, h = {k: zero for k in range(M)}, zero
    for round_, clients in zip(Round.upto(2), [(0, 1), (0, 2)], strict=True):
        plans = [ClientPlan(k, 0, 0, M) for k in clients]
        updates = runner.train_round(round_, plans, lambda _: state)
        for federation, average in aggregator.aggregate(updates).items():
            apply_update(state, post(average, RoundContext.of(round_, federation, updates)))
        trained = {k: _by_hand(features[parts[k]], y[parts[k]], theta, g[k]) for k in clients}
        for k in clients:
            g[k] = [gk - ALPHA * (t - s) for gk, t, s in zip(g[k], trained[k], theta, strict=True)]
        h = [hi - ALPHA / M * sum(trained[k][i] - theta[i] for k in clients) for i, hi in enumerate(h)]
        theta = [sum(trained[k][i] for k in clients) / len(clients) - h[i] / ALPHA for i in range(2)]

        for i, name in enumerate(["1.weight", "1.bias"]):
            assert torch.allclose(state[name], theta[i], atol=1e-6)
            assert torch.allclose(post.h[0][name], h[i], atol=1e-7)
            for k in clients:
                assert torch.allclose(store.get(SPACE, k)[name], g[k][i], atol=1e-7)
    assert store.clients(SPACE) == [0, 1, 2]  # client 3 never trained: no state
    assert all(t.abs().max() > 1e-3 for t in [*h, *g[0]])  # the state is not negligible


# --- reductions on the engine ---------------------------------------------------------------


def _deltas_close(a, b, **tol):
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], **tol) for k in a)


def test_tiny_alpha_leaves_fedavgs_local_step_and_the_server_applies_1_plus_p_over_m(data):
    """alpha -> 0: every client's local step is FedAvg's (round 1: g_k = 0; round 2: g_k of order
    alpha), while the server's correction, alpha-free, applies (1 + |P|/m) x the mean of each
    group's updates to the parameters (one h per group, m = its 2 clients) and the plain mean to
    the BN statistics. With the default alpha the steps differ: the check has teeth."""
    dyn = engine_on(data, method="FedDyn", method_args={"alpha": 1e-9}, **SMALL)
    avg, real = engine_on(data, method="FedAvg", **SMALL), engine_on(data, method="FedDyn", **SMALL)
    initial = [{k: v.clone() for k, v in s.items()} for s in dyn.server.weights]
    for round_ in Round.upto(2):
        for plan in dyn.server.plan(round_):
            start = dyn.server.sub_state(plan.group)
            ours, theirs, far = (
                e.transport.clients.runner.trainer.train_client(round_, plan, start, e.transport.clients.objective)
                for e in (dyn, avg, real)
            )
            assert _deltas_close(ours.delta, theirs.delta, rtol=1e-4, atol=1e-7)
            assert not _deltas_close(far.delta, theirs.delta, rtol=1e-4, atol=1e-7)
        if round_ == Round(1):
            dyn.run_round(round_), avg.run_round(round_)
    sampled = [dyn.server.planner.plan(Round(1), int(c)).group for c in dyn.server.schedule[0]]
    for group, (ours, theirs, start) in enumerate(zip(dyn.server.weights, avg.server.weights, initial, strict=True)):
        params = {name for name, _ in dyn.server.models[group].named_parameters()}
        share = sampled.count(group) / 2  # |P| / m
        assert set(dyn.server.post[0].h.get(group, {})) == (params if share else set())
        for name, w in ours.items():
            expected = start[name] + (1 + share) * (theirs[name] - start[name]) if name in params else theirs[name]
            assert torch.allclose(w, expected, rtol=1e-4, atol=1e-6), name


def test_a_resumed_feddyn_equals_the_run_never_stopped(data):
    """The server's h (post.0, one per group) and the clients' g_k (the store) go through the
    engine's checkpoint: a fresh engine loaded after round 2 trains round 3 to the same weights."""
    straight = engine_on(data, method="FedDyn", **SMALL)
    for round_ in Round.upto(2):
        straight.run_round(round_)
    payload = straight.state_dict()
    assert sorted(payload["components"]["post.0"]["h"]) == [0, 1]
    assert {space for space, _ in payload["clients"]["states"]} == {SPACE}
    resumed = engine_on(data, method="FedDyn", **SMALL)
    resumed.load_state_dict(payload)
    straight.run_round(Round(3)), resumed.run_round(Round(3))
    assert straight.fingerprint() == resumed.fingerprint()
