"""FedLAG and the personalised baselines (docs/methods.md, FedLAG): the conflict score on hand-made
gradients, the top-K choice, personal tensors never uploaded or overwritten, reductions to
FedAvg, resume, the released variant, Local and FedPer, and personal evaluation."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import client_model, engine_on, kept_by, small_synthetic

from incofl.cli import run
from incofl.data.dataset import ImageDataset
from incofl.data.partition import holdout_split, iid_partition
from incofl.fl.contracts import Round
from incofl.fl.methods.personal import plan as personal_module
from incofl.fl.methods.personal.plan import conflict_counts
from incofl.fl.stages.evaluation import score

TINY = {
    "clients": 4,
    "ratio": 1.0,
    "models": ["resnet10"],
    "model_scale": 0.25,  # a quarter of the channels: conflicts, top-K and personal layers are counted by entry
    "batch_size": 16,
    "partition": "iid",
    "holdout": 0.25,
    "rounds": 6,
}


@pytest.fixture(scope="module")
def data():
    return small_synthetic(128)


def _engine(data, method, **settings):
    return engine_on(data, **{**TINY, "method": method, **settings})


def _run(engine, rounds):
    for t in Round.upto(rounds):
        engine.observe(engine.run_round(t))
    return engine


# --- the conflict score and the choice -----------------------------------------------------------


def test_conflicts_count_pairs_below_xi_and_a_zero_vector_has_cosine_zero():
    g = [
        {"a": torch.tensor([1.0, 0.0]), "b": torch.tensor([1.0, 1.0])},
        {"a": torch.tensor([-1.0, 0.0]), "b": torch.tensor([2.0, 2.0])},
        {"a": torch.tensor([0.0, 0.0]), "b": torch.tensor([3.0, 3.1])},
    ]
    assert conflict_counts(g, ["a", "b"], 0.0).tolist() == [1, 0]  # only (1, 2): cos -1; the zero vector: 0, not < 0
    assert conflict_counts(g, ["a", "b"], 0.5).tolist() == [3, 0]  # cos 0 < 0.5 counts
    assert conflict_counts(g, ["a", "b"], -1.0).tolist() == [0, 0]  # strict: cos -1 is not < -1
    assert conflict_counts(g[:1], ["a"], 0.0).tolist() == [0]  # one client, no pair
    assert conflict_counts([g[0], {"b": g[1]["b"]}], ["a", "b"], 0.0).tolist() == [0, 0]  # pairs among holders


@pytest.mark.slow
def test_top_k_are_the_most_conflicting_entries_ties_in_model_order(data, monkeypatch):
    engine = _engine(data, "FedLAG", method_args={"top_k": 3, "warmup": 2})
    planner = engine.server.planner
    scores = np.zeros(len(planner.entries), dtype=np.int64)
    scores[[7, 2, 5, 9]] = [4, 6, 6, 1]
    rounds = iter([scores // 2, scores - scores // 2])  # the counts of the two warm-up rounds add up
    monkeypatch.setattr(personal_module, "conflict_counts", lambda *args: next(rounds))
    _run(engine, 2)
    assert planner.personal == [planner.entries[i] for i in (2, 5, 7)]  # 6, 6 (tie: model order), 4
    assert planner.summary()["personal_layers"] == planner.personal


def test_warmup_defaults_to_half_the_rounds_up_to_30_plus_one(data):
    assert _engine(data, "FedLAG").server.planner.warmup == 4  # 6 // 2 + 1
    assert _engine(data, "FedLAG", rounds=800).server.planner.warmup == 31


# --- personal tensors ----------------------------------------------------------------------------


@pytest.mark.slow
def test_personal_tensors_are_never_uploaded_or_overwritten(data):
    engine = _run(_engine(data, "FedLAG", method_args={"warmup": 2, "top_k": 2}), 2)
    personal = engine.server.planner.personal
    assert (
        len(personal) == 2 and engine.server.planner.scores.sum() > 0 and kept_by(engine) == {}
    )  # warm-up: nothing kept
    server = {k: engine.server.weights[0][k].clone() for k in personal}
    report = engine.run_round(Round(3))
    assert all(torch.equal(engine.server.weights[0][k], v) for k, v in server.items())  # the server's never move
    uploaded = sum(p.numel() for n, p in engine.server.models[0].named_parameters() if n not in personal)
    assert report.upload_bytes == 4 * 4 * uploaded  # 4 clients x fp32 x the shared parameters
    for c in range(4):  # each keeps its own, and starts its next round from it
        assert set(personal) <= set(kept_by(engine)[c])
        start = client_model(engine, c, 0)
        assert all(torch.equal(start[k], kept_by(engine)[c][k]) for k in personal)
        assert not all(torch.equal(kept_by(engine)[c][k], server[k]) for k in personal)
    assert not any(torch.equal(kept_by(engine)[0][k], kept_by(engine)[1][k]) for k in personal)


@pytest.mark.slow
def test_top_k_zero_is_weighted_fedavg_with_personal_evaluation(data):
    lag = _run(_engine(data, "FedLAG", method_args={"top_k": 0, "warmup": 2}), 4)
    avg = _run(_engine(data, "FedAvg", method_args={"weighted": True}), 4)
    assert lag.fingerprint() == avg.fingerprint() and lag.evaluate(Round(4)) == avg.evaluate(Round(4))


@pytest.mark.slow
def test_resume_restores_personal_state_and_the_choice(data):
    args = {"warmup": 2, "top_k": 2}
    straight = _run(_engine(data, "FedLAG", method_args=args), 4)
    first = _run(_engine(data, "FedLAG", method_args=args), 3)
    resumed = _engine(data, "FedLAG", method_args=args)
    resumed.load_state_dict(first.state_dict())
    resumed.observe(resumed.run_round(Round(4)))
    assert resumed.server.planner.personal == straight.server.planner.personal
    assert resumed.fingerprint() == straight.fingerprint() and resumed.evaluate(Round(4)) == straight.evaluate(Round(4))


@pytest.mark.slow
def test_released_variant_trains_locally_after_warmup(data):
    engine = _run(_engine(data, "FedLAG", method_args={"warmup": 2, "broadcast": False}), 2)
    server = {k: v.clone() for k, v in engine.server.weights[0].items()}
    report = engine.run_round(Round(3))
    assert report.upload_bytes == 0 and all(torch.equal(engine.server.weights[0][k], v) for k, v in server.items())
    assert set(kept_by(engine)[0]) == set(engine.server.models[0].state_dict())


@pytest.mark.slow
def test_local_never_uploads_and_fedper_keeps_the_head(data):
    local = _engine(data, "Local")
    server = {k: v.clone() for k, v in local.server.weights[0].items()}
    assert local.run_round(Round(1)).upload_bytes == 0 and all(
        torch.equal(local.server.weights[0][k], v) for k, v in server.items()
    )
    fedper = _engine(data, "FedPer")
    fedper.run_round(Round(1))
    assert set(kept_by(fedper)[0]) == {"fc.weight", "fc.bias"}
    assert not torch.equal(kept_by(fedper)[0]["fc.weight"], kept_by(fedper)[1]["fc.weight"])


# --- personal evaluation -------------------------------------------------------------------------


def test_holdout_is_a_seeded_stratified_quarter_of_each_client():
    labels = np.repeat(np.arange(4), 25)
    parts = iid_partition(100, 2, seed=0)
    train, held = holdout_split(parts, labels, 0.25, seed=3)
    for part, a, b in zip(parts, train, held, strict=True):
        assert sorted([*a, *b]) == sorted(part) and not set(a) & set(b)
        assert len(b) == int(np.ceil(0.25 * len(part)))
    assert all(np.array_equal(x, y) for x, y in zip(held, holdout_split(parts, labels, 0.25, seed=3)[1], strict=True))
    strat = holdout_split([np.arange(100)], labels, 0.24, seed=0)[1][0]
    assert np.bincount(labels[strat]).tolist() == [6, 6, 6, 6]  # stratified by label
    assert holdout_split([np.array([5])], labels, 0.25, seed=0)[1][0].size == 0  # one sample: nothing held out


@pytest.mark.slow
def test_personal_accuracy_is_micro_averaged_over_each_clients_model(data):
    engine = _run(_engine(data, "FedPer"), 2)
    correct, total, accs = 0.0, 0, []
    for c in range(4):
        model = engine.server.models[0]
        model.load_state_dict(client_model(engine, c, 0))
        acc = score(
            model,
            engine.transport.clients.training.train,
            1000,
            indices=torch.from_numpy(engine.transport.clients.training.held_out[c]),
        ).accuracy()
        correct += acc * len(engine.transport.clients.training.held_out[c]) / 100
        total += len(engine.transport.clients.training.held_out[c])
        accs.append(acc)
    scores = engine.evaluate(Round(1))
    assert scores["personal_acc"] == pytest.approx(100 * correct / total)
    assert scores["personal_acc_std"] == pytest.approx(np.std(accs))
    assert sum(len(h) for h in engine.transport.clients.training.held_out.values()) == 32 and all(
        len(p) == 24 for p in engine.transport.clients.training.parts.values()
    )  # 32 a client, 8 out


def test_without_a_test_set_the_personal_accuracy_is_the_runs(data):
    empty = ImageDataset("synthetic", data.x_train, data.y_train, data.x_test[:0], data.y_test[:0])
    engine = _engine(empty, "FedAvg")
    scores = engine.evaluate(Round(0))
    assert scores["mean_acc"] == scores["personal_acc"] == scores["acc_g0"]


@pytest.mark.slow
def test_the_cli_writes_personal_layers_and_personal_accuracy(tmp_path):
    out = tmp_path / "run"
    args = [
        "train",
        "--out",
        str(out),
        "--set",
        "dataset=digits",
        "method=FedLAG",
        "models=[resnet10]",
        "model_scale=0.25",
        "clients=4",
        "ratio=1.0",
        "rounds=3",
        "holdout=0.25",
        "partition=iid",
        "threads=1",
        "progress=false",
        f"cache_dir={tmp_path / 'cache'}",
    ]
    assert run(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["personal_layers"]) == 2 and summary["warmup_rounds"] == 2
    assert set(summary["personal_layers"]) <= set(summary["conflict_scores"])
    metrics = pd.read_csv(out / "metrics.csv")
    assert {"personal_acc", "personal_acc_std"} <= set(metrics.columns)
    assert summary["personal_acc"] == metrics["personal_acc"].iloc[-1]
