"""The client-side methods (METHODS.md section 3): FedProx, SCAFFOLD, FedNova, MOON and their
InCo versions, pinned to their definitions on tiny real problems."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from incofl.config import RunConfig
from incofl.data.dataset import ImageDataset
from incofl.data.partition import Partition, iid_partition
from incofl.data.sources import load_dataset
from incofl.data.tensors import TensorSplit
from incofl.fl.client import ClientContext, ClientUpdate, evaluate, local_train
from incofl.fl.methods import METHODS
from incofl.fl.objectives import FedNova, FedProx, Moon, Scaffold
from incofl.fl.objectives.fednova import normalizer
from incofl.fl.objectives.moon import moon_loss
from incofl.fl.server import heteroavg
from incofl.fl.simulation import Engine, train
from incofl.models.family import build_model, check_nested

TABLE2 = [
    "FedAvg",
    "FedProx",
    "SCAFFOLD",
    "FedNova",
    "MOON",
    "InCoAvg",
    "InCoProx",
    "InCoScaffold",
    "InCoNova",
    "InCoMOON",
]
TINY = {
    "dataset": "synthetic",
    "clients": 4,
    "ratio": 0.5,
    "models": ["resnet10", "resnet14"],
    "rounds": 3,
    "batch_size": 32,
    "partition": "iid",
    "progress": False,
    "threads": 1,
    "device": "cpu",
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """400 training and 200 test images of the synthetic set: enough to learn, quick to train."""
    torch.set_num_threads(1)  # as `threads: 1` does for `train`: the machine's two cores are shared
    full = load_dataset("synthetic", cache_dir=tmp_path_factory.mktemp("cache"))
    return ImageDataset("synthetic", full.x_train[:400], full.y_train[:400], full.x_test[:200], full.y_test[:200])


def _engine(data, method, **settings):
    cfg = RunConfig(**{**TINY, "method": method, **settings})
    parts = iid_partition(len(data.y_train), cfg.clients, seed=0)  # 400 / 4: 100 samples, 4 steps each
    return Engine(cfg, data, Partition(parts, np.zeros((cfg.clients, 0)), {}), torch.device("cpu"))


def _states_equal(a, b):
    return all(torch.equal(x[k], y[k]) for x, y in zip(a.states, b.states, strict=True) for k in x)


def _result(out):
    summary = {
        k: v for k, v in json.loads((out / "summary.json").read_text()).items() if k not in ("wall_s", "samples_per_s")
    }
    return summary, pd.read_csv(out / "metrics.csv").drop(columns="seconds")


# --- the registry and the models --------------------------------------------------------------


def test_registry_pairs_each_objective_with_both_server_rules():
    for base, inco, objective in [
        ("FedProx", "InCoProx", FedProx),
        ("SCAFFOLD", "InCoScaffold", Scaffold),
        ("FedNova", "InCoNova", FedNova),
        ("MOON", "InCoMOON", Moon),
    ]:
        assert (METHODS[base].objective, METHODS[base].server, METHODS[base].base) == (objective, "groupwise", None)
        assert (METHODS[inco].objective, METHODS[inco].server, METHODS[inco].base) == (objective, "inco", base)
    assert METHODS["FedNova"].split_args({})[2] and METHODS["InCoNova"].split_args({})[2]  # p_i = n_i / sum n
    assert not METHODS["SCAFFOLD"].split_args({})[2]
    assert METHODS["MOON"].model_kwargs({}) == {"projection_dim": 256}
    assert METHODS["MOON"].model_kwargs({"projection_dim": 32, "mu": 1}) == {"projection_dim": 32}
    assert METHODS["FedProx"].model_kwargs({"mu": 0.5}) == {}
    with pytest.raises(ValueError, match="temperature"):
        METHODS["FedProx"].split_args({"temperature": 0.5})


def test_projection_head_only_when_asked_and_nested():
    plain = build_model("resnet10", 10, 3)
    assert not any(k.startswith("proj.") for k in plain.state_dict()) and plain.fc.in_features == 512
    models = [build_model(n, 10, 3, projection_dim=256) for n in ("resnet10", "resnet14", "resnet26")]
    assert check_nested(models) == 2
    assert models[0].state_dict()["proj.2.weight"].shape == (256, 512) and models[0].fc.in_features == 256
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(models[0](x), models[0].classify(models[0].embed(x)))
    assert torch.equal(plain(x), plain.fc(plain.features(x)))


def test_method_args_reach_the_objective_and_the_model(data):
    engine = _engine(data, "MOON", method_args={"projection_dim": 32, "mu": 1.0})
    assert engine.objective.hp == {"mu": 1.0, "temperature": 0.5, "pool_size": 1, "projection_dim": 32}
    assert engine.models[0].proj[2].out_features == 32


# --- FedProx --------------------------------------------------------------------------------


def test_fedprox_gradient_is_that_of_the_proximal_term():
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    anchor = {k: v + 0.1 * torch.randn_like(v) for k, v in model.state_dict().items()}
    x, y, mu = torch.randn(8, 4), torch.randint(0, 3, (8,)), 0.3
    ctx = ClientContext(0, 0, 0, model, anchor, lr=0.1)
    objective = FedProx(mu=mu)
    objective.begin(ctx)
    F.cross_entropy(model(x), y).backward()
    objective.after_backward(ctx)
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    prox = sum((p - anchor[k]).pow(2).sum() for k, p in model.named_parameters())
    (F.cross_entropy(model(x), y) + mu / 2 * prox).backward()
    assert all(torch.allclose(g, p.grad, atol=1e-7) for g, p in zip(got, model.parameters(), strict=True))


def test_fedprox_with_mu_zero_is_fedavg_bit_for_bit(data):
    fedavg, fedprox = _engine(data, "FedAvg"), _engine(data, "FedProx", method_args={"mu": 0.0})
    for t in range(2):
        fedavg.run_round(t)
        fedprox.run_round(t)
    assert _states_equal(fedavg, fedprox)
    assert not _states_equal(fedavg, _engine(data, "FedAvg"))  # training changed the weights


# --- FedNova --------------------------------------------------------------------------------


@pytest.mark.parametrize("rho", [0.0, 0.9])
def test_fednova_normalizer_counts_the_gradients_momentum_sgd_accumulates(rho):
    for tau in (1, 3, 7):
        w = torch.zeros(1, requires_grad=True)
        optimizer = torch.optim.SGD([w], lr=0.1, momentum=rho)
        for _ in range(tau):
            w.grad = torch.ones(1)  # a constant gradient: the displacement / lr is the gradient count
            optimizer.step()
        assert math.isclose(normalizer(tau, rho), -w.item() / 0.1, rel_tol=1e-5)


def test_fednova_aggregate_is_tau_eff_times_weighted_normalised_updates():
    g = torch.Generator().manual_seed(0)
    spec = [(10, 2, 0), (30, 4, 0), (20, 3, 1), (40, 5, 1)]  # (n_i, tau_i, federation)
    updates = [
        ClientUpdate(i, s, {"w": torch.randn(5, generator=g)}, n, tau, state=s) for i, (n, tau, s) in enumerate(spec)
    ]
    ctx, objective, rho = ClientContext(0, 0, 0, nn.Identity(), {}, lr=0.1, momentum=0.5), FedNova(), 0.5
    originals = [u.delta["w"].clone() for u in updates]
    for u in updates:
        objective.end(ctx, u)
    objective.before_aggregate(updates)
    for s in (0, 1):
        members = [i for i, (_, _, fed) in enumerate(spec) if fed == s]
        n = sum(spec[i][0] for i in members)
        a = {i: (spec[i][1] - rho * (1 - rho ** spec[i][1]) / (1 - rho)) / (1 - rho) for i in members}
        tau_eff = sum(spec[i][0] / n * a[i] for i in members)
        expected = tau_eff * sum(spec[i][0] / n * originals[i] / a[i] for i in members)
        got = heteroavg([updates[i] for i in members], weighted=True)["w"]
        assert torch.allclose(got, expected, atol=1e-6)


def test_fednova_with_equal_steps_and_weights_is_fedavg(data):
    """100 samples per client, 4 steps each: the factor tau_eff / a_i is exactly 1."""
    fedavg, fednova = _engine(data, "FedAvg", ratio=1.0), _engine(data, "FedNova", ratio=1.0)
    weighted = _engine(data, "FedAvg", ratio=1.0, method_args={"weighted": True})
    fedavg.run_round(0)
    for t in range(2):
        fednova.run_round(t)
        weighted.run_round(t)
    assert _states_equal(fednova, weighted)  # the same sample-weighted mean, bit for bit
    fednova = _engine(data, "FedNova", ratio=1.0)
    fednova.run_round(0)
    for a, b in zip(fedavg.states, fednova.states, strict=True):  # and FedAvg's plain mean up to rounding
        assert all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-6) for k in a)


# --- SCAFFOLD -------------------------------------------------------------------------------


def test_scaffold_first_round_is_fedavg_and_variates_follow_option_ii(data):
    fedavg, scaffold = _engine(data, "FedAvg"), _engine(data, "SCAFFOLD")
    sampled = [int(c) for c in scaffold.schedule[0]]
    # FedAvg's local models from the same start: c_i+ = 0 - 0 + (w_global - w_i) / (tau_i * lr)
    expected = {}
    for client in sampled:
        update = fedavg.train_client(0, client)
        params = dict(fedavg.models[update.group].named_parameters())
        expected[client] = (update.group, {k: -update.delta[k] / (update.steps * 1e-3) for k in params})
    fedavg.run_round(0)
    scaffold.run_round(0)
    assert _states_equal(fedavg, scaffold)
    for client, (_group, c_i) in expected.items():
        assert c_i.keys() == scaffold.objective.c_local[client].keys()
        assert all(
            torch.allclose(scaffold.objective.c_local[client][k], v, rtol=1e-5, atol=1e-6) for k, v in c_i.items()
        )
    # groupwise: one c per group, c = (1/K_g) * sum over the group's sampled clients, K_g = 2 clients per group
    for group, c in scaffold.objective.c.items():
        members = [e for e in expected.values() if e[0] == group]
        assert members and c.keys() == members[0][1].keys()
        assert all(torch.allclose(v, sum(m[1][k] for m in members) / 2, rtol=1e-5, atol=1e-6) for k, v in c.items())


def test_inco_scaffold_keeps_one_c_on_the_server_names_over_all_clients(data):
    engine = _engine(data, "InCoScaffold")
    engine.run_round(0)
    ((state, c),) = engine.objective.c.items()
    held = set().union(*(engine.objective.c_local[int(i)].keys() for i in engine.schedule[0]))
    assert state == 0 and set(c) == held
    k = "fc.weight"
    assert torch.allclose(c[k], sum(engine.objective.c_local[int(i)][k] for i in engine.schedule[0]) / 4)


@pytest.mark.parametrize("correction", ["step", "gradient"])
def test_scaffold_corrects_each_sgd_step_by_c_minus_c_i(correction):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 3))
    x = torch.randint(0, 256, (4, 3, 4, 4), dtype=torch.uint8).numpy()
    split = TensorSplit(x, np.array([0, 1, 2, 0]), np.zeros(3), np.ones(3), torch.device("cpu"), 4)
    objective = Scaffold(correction=correction)
    names = [k for k, _ in model.named_parameters()]
    objective.c = {0: {k: torch.randn_like(p) for k, p in model.named_parameters()}}
    objective.c_local = {7: {k: torch.randn_like(p) for k, p in model.named_parameters()}}
    start = {k: v.clone() for k, v in model.state_dict().items()}
    lr = 0.1
    xb, yb = split.batch(torch.arange(4))
    grads = torch.autograd.grad(F.cross_entropy(model(xb), yb), list(model.parameters()))
    ctx = ClientContext(7, 0, 0, model, start, lr=lr)
    local_train(
        ctx,
        objective,
        split,
        np.arange(4),
        epochs=1,
        batch_size=4,
        optimizer=torch.optim.SGD(model.parameters(), lr=lr),
        gen=torch.Generator().manual_seed(0),
    )
    for k, g in zip(names, grads, strict=True):
        expected = start[k] - lr * (g + objective.c[0][k] - objective.c_local[7][k])
        assert torch.allclose(model.state_dict()[k], expected, atol=1e-6)


# --- MOON -----------------------------------------------------------------------------------


def test_moon_loss_is_the_formula():
    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(6, 10, generator=g), torch.randint(0, 10, (6,), generator=g)
    z, z_glob, z_prev = (torch.randn(6, 8, generator=g) for _ in range(3))
    mu, t = 5.0, 0.5
    pos, neg = F.cosine_similarity(z, z_glob) / t, F.cosine_similarity(z, z_prev) / t
    contrastive = -torch.log(torch.exp(pos) / (torch.exp(pos) + torch.exp(neg))).mean()
    expected = F.cross_entropy(logits, y) + mu * contrastive
    assert torch.allclose(moon_loss(logits, y, z, z_glob, [z_prev], mu, t), expected, atol=1e-6)


def test_moon_uses_the_global_model_until_a_client_has_a_previous_one():
    torch.manual_seed(0)
    model = build_model("resnet10", 10, 3, projection_dim=16)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    objective = Moon(mu=2.0)
    ctx = ClientContext(3, 0, 0, model, {k: v.clone() for k, v in model.state_dict().items()}, lr=1e-3)
    model.eval()  # same BN behaviour as the frozen copies: z equals z_glob
    objective.begin(ctx)
    loss = objective.loss(ctx, x, y)
    assert torch.allclose(loss, F.cross_entropy(model(x), y) + 2.0 * math.log(2), atol=1e-5)
    objective.end(ctx, ClientUpdate(3, 0, {}, 4, 1))
    (stored,) = objective.pool[3]
    assert stored.keys() == {k for k, v in model.state_dict().items() if v.is_floating_point()}
    with torch.no_grad():
        model.fc.weight.add_(1.0)
    assert not torch.equal(stored["fc.weight"], model.fc.weight)  # a copy, not the live weights
    objective.end(ctx, ClientUpdate(3, 0, {}, 4, 1))
    assert len(objective.pool[3]) == 1 and torch.equal(objective.pool[3][0]["fc.weight"], model.fc.weight)


# --- every method learns, resumes, and runs --------------------------------------------------


@pytest.mark.parametrize("method", ["FedProx", "SCAFFOLD", "FedNova", "MOON"])
def test_method_lowers_the_training_loss(data, method):
    engine = _engine(data, method, models=["resnet10"], ratio=1.0)

    def train_loss():
        engine.models[0].load_state_dict(engine.sub_state(0))
        return evaluate(engine.models[0], engine.train_data, 400)[1]

    before = train_loss()
    for t in range(3):  # later rounds use SCAFFOLD's variates and MOON's previous models
        engine.run_round(t)
    assert train_loss() < 0.7 * before


@pytest.mark.parametrize("method", ["SCAFFOLD", "MOON"])
def test_resumed_run_equals_uninterrupted_run(tmp_path, data, method):
    settings = {**TINY, "method": method, "checkpoint_every": 1, "keep_checkpoint": True}
    train(RunConfig(**{**settings, "rounds": 4}), tmp_path / "straight", data=data)
    train(RunConfig(**{**settings, "rounds": 2}), tmp_path / "resumed", data=data)
    assert (tmp_path / "resumed" / "ckpt.pt").exists()
    train(RunConfig(**{**settings, "rounds": 4}), tmp_path / "resumed", data=data)
    assert "resumed from" in (tmp_path / "resumed" / "train.log").read_text()
    straight, resumed = _result(tmp_path / "straight"), _result(tmp_path / "resumed")
    assert straight[0] == resumed[0]
    pd.testing.assert_frame_equal(straight[1], resumed[1])


@pytest.mark.parametrize("method", TABLE2)
def test_every_table2_method_runs_a_round(tmp_path, data, method):
    summary = train(RunConfig(**{**TINY, "rounds": 1}, method=method), tmp_path / method, data=data)
    assert summary["method"] == method and 0.0 <= summary["final_acc"] <= 100.0
    assert np.isfinite(summary["final_loss"])
