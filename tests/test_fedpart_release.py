"""FedPart's released data setting (docs/methods.md, FedPart): clients drawing their images independently
(`partition: iid_draw`) and BatchNorm statistics kept by each client (`bn_stats: local`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import QUIET, client_model, engine_on, kept_by, small_synthetic

from incofl.config import ConfigError, RunConfig, load_run_config
from incofl.data.partition import PartitionError, check_provenance, iid_draw_partition, make_partition
from incofl.fl.contracts import Round
from incofl.fl.stages.evaluation import score
from incofl.fl.stages.plan import bn_statistics
from incofl.models.family import build_model

TINY = {
    "clients": 4,
    "ratio": 0.5,
    "models": ["resnet8"],
    "batch_size": 16,
    "partition": "iid_draw",
    "client_samples": 24,
    "bn_stats": "local",
}


@pytest.fixture(scope="module")
def data():
    return small_synthetic(64)


def _engine(data, method="FedAvg", **settings):
    return engine_on(data, **{**TINY, "method": method, **settings})


# --- partition: iid_draw -------------------------------------------------------------------------


def test_each_client_draws_distinct_images_independently_of_the_others():
    parts = iid_draw_partition(100, 40, 30, seed=1)
    assert len(parts) == 40 and all(len(p) == 30 == len(set(p.tolist())) for p in parts)
    assert all(p.min() >= 0 and p.max() < 100 for p in parts)
    shared = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(parts, parts[1:], strict=False))
    assert shared > 0  # 40 x 30 draws from 100 images: clients share images (a split would not)
    assert all(np.array_equal(a, b) for a, b in zip(parts, iid_draw_partition(100, 40, 30, seed=1), strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(parts, iid_draw_partition(100, 40, 30, seed=2), strict=True))


def test_a_draw_larger_than_the_training_set_is_refused():
    with pytest.raises(PartitionError, match="client_samples: 101 exceeds the 100 training images"):
        iid_draw_partition(100, 2, 101, seed=0)


@pytest.mark.parametrize(
    "settings,message",
    [
        ({"partition": "iid_draw"}, "client_samples: set it exactly when partition is iid_draw"),
        ({"client_samples": 500}, "client_samples: set it exactly when partition is iid_draw"),
        ({"partition": "iid_draw", "client_samples": 0}, "client_samples: Input should be greater than or equal to 1"),
        ({"bn_stats": "client"}, "bn_stats: Input should be 'averaged' or 'local'"),
    ],
)
def test_release_setting_keys_are_validated(tmp_path, settings, message):
    path = tmp_path / "c.yaml"
    path.write_text("\n".join(f"{k}: {v}" for k, v in settings.items()))
    with pytest.raises(ConfigError, match=message):
        load_run_config(path)


def test_the_artifact_records_the_draw_size_and_refuses_another(data):
    cfg = RunConfig(**{**QUIET, **TINY, "method": "FedAvg"})
    part = make_partition(
        data.y_train, kind="iid_draw", num_clients=4, alpha=cfg.alpha, seed=0, client_samples=24, dataset="synthetic"
    )
    assert part.meta["client_samples"] == 24 and all(len(p) == 24 for p in part.parts)
    check_provenance(part, cfg, data.y_train, "p.npz")
    with pytest.raises(PartitionError, match="made for client_samples=24, this run has client_samples=32"):
        check_provenance(part, cfg.model_copy(update={"client_samples": 32}), data.y_train, "p.npz")


# --- bn_stats: local -----------------------------------------------------------------------------


def test_bn_statistics_are_every_batchnorm_buffer():
    stats = bn_statistics(build_model("resnet8", 10, 3))
    assert "bn1.running_mean" in stats and "layer3.0.downsample.1.num_batches_tracked" in stats
    assert len(stats) == 3 * 9  # the stem, 2 a block and 2 downsamples: 9 BatchNorm layers, 3 buffers each
    assert bn_statistics(build_model("vit_d8", 10, 3, image_size=32)) == frozenset()


@pytest.mark.parametrize("method", ["FedAvg", "FedPart"])
def test_local_statistics_never_reach_the_server_and_return_to_their_client(data, method):
    engine = _engine(data, method, method_args={"warmup": 1} if method == "FedPart" else {})
    stats = bn_statistics(engine.server.models[0])
    initial = {k: engine.server.weights[0][k].clone() for k in stats}
    for t in Round.upto(3):
        engine.run_round(t)
    assert all(torch.equal(engine.server.weights[0][k], v) for k, v in initial.items())  # the server's never move
    trained = {int(c) for t in range(3) for c in engine.server.schedule[t]}
    assert set(kept_by(engine)) == trained and all(set(kept) == stats for kept in kept_by(engine).values())
    client = int(engine.server.schedule[3][0])
    plan = engine.server.planner.plan(Round(4), client)
    assert not any(plan.uploads(k) for k in stats)
    start = client_model(engine, client, 0)
    expected = kept_by(engine).get(client, initial)
    assert all(torch.equal(start[k], expected[k]) for k in stats)  # its next round starts from its own
    assert all(torch.equal(start[k], engine.server.weights[0][k]) for k in start if k not in stats)


def test_evaluation_uses_the_first_clients_statistics(data):
    engine = _engine(data, ratio=1.0)
    engine.run_round(Round(1))
    model = engine.server.models[0]
    model.load_state_dict({**engine.server.weights[0], **kept_by(engine)[0]})
    ours = score(model, engine.server.test, 1000)
    assert engine.evaluate(Round(1))["acc_g0"] == ours.accuracy()
    model.load_state_dict({**engine.server.weights[0], **kept_by(engine)[1]})
    assert score(model, engine.server.test, 1000).mean_loss() != ours.mean_loss()  # client 1's statistics differ


def test_averaged_statistics_keep_nothing(data):
    engine = _engine(data, bn_stats="averaged")
    before = engine.server.weights[0]["bn1.running_mean"].clone()
    engine.run_round(Round(1))
    assert kept_by(engine) == {} and engine.server.planner.plan(Round(1), 0).keep == frozenset()
    assert not torch.equal(engine.server.weights[0]["bn1.running_mean"], before)  # averaged into the server's


def test_resume_restores_what_clients_keep(data):
    straight = _engine(data, "FedPart", method_args={"warmup": 1, "rounds_per_group": 1})
    for t in Round.upto(4):
        straight.run_round(t)
    first = _engine(data, "FedPart", method_args={"warmup": 1, "rounds_per_group": 1})
    for t in Round.upto(2):
        first.run_round(t)
    resumed = _engine(data, "FedPart", method_args={"warmup": 1, "rounds_per_group": 1})
    resumed.load_state_dict(first.state_dict())
    for t in Round.upto(4)[2:]:
        resumed.run_round(t)
    assert kept_by(straight).keys() == kept_by(resumed).keys() and straight.fingerprint() == resumed.fingerprint()
    assert straight.fingerprint() != _engine(data, "FedPart").fingerprint()
