"""The batched trainer (`trainer: batched`, fl/stages/batched.py) gives the serial trainer's updates.

In float32 the two differ by reassociation (a vmapped convolution sums in another order), and
a few local steps on small BatchNorm batches amplify that (a client's 3-sample last batch
turns 1e-16 into 1e-9 within 8 steps, still in float64). So the comparisons run in float64
and ask for agreement to 1e-6, orders of magnitude below what a different batch, step or
optimizer state gives: the same batches, optimizer arithmetic, BatchNorm statistics, kept
entries and last gradients.
"""

from __future__ import annotations

import pytest
import torch
from helpers import engine_on, small_synthetic

from incofl.config import RunConfig
from incofl.data.tensors import TensorSplit
from incofl.fl.contracts import Round

# 4 Dirichlet clients of 26-68 samples: full batches side by side, shorter last batches alone,
# clients that run out of batches before the others
BASE = {
    "clients": 4,
    "ratio": 1.0,
    "models": ["resnet10", "resnet14"],
    "model_scale": 0.25,  # a quarter of the channels: the equivalences do not depend on width
    "batch_size": 16,
    "alpha": 0.5,
    "min_size": 2,
    "optimizer": "sgd",
    "lr": 0.01,
    "momentum": 0.5,
    "weight_decay": 5e-4,
    "local_epochs": 2,
    "augment": "crop_flip",
}


@pytest.fixture
def float64(monkeypatch):
    """Models and batches in float64 for the duration of a test."""
    batch = TensorSplit.batch
    monkeypatch.setattr(TensorSplit, "batch", lambda self, idx, gen=None: _double(batch(self, idx, gen)))
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


def _double(xy: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return xy[0].double(), xy[1]


@pytest.fixture(scope="module")
def data():
    return small_synthetic(200)


def round_updates(data, trainer: str, **settings):
    engine = engine_on(data, **{**BASE, **settings, "trainer": trainer})
    return engine.transport.clients.runner.train_round(Round(1), engine.server.plan(Round(1)), engine.server.start)


def assert_same_updates(serial, batched):
    assert [u.client for u in serial] == [u.client for u in batched]
    assert len({u.steps for u in serial}) > 1  # clients with different numbers of steps
    for u, v in zip(serial, batched, strict=True):
        assert (u.group, u.steps, u.num_samples, u.full, u.upload_params) == (
            v.group,
            v.steps,
            v.num_samples,
            v.full,
            v.upload_params,
        )
        assert u.loss == pytest.approx(v.loss, rel=1e-6)
        for mine, theirs in ((u.delta, v.delta), (u.kept, v.kept), *((u.extra[k], v.extra[k]) for k in u.extra)):
            assert mine.keys() == theirs.keys()
            for k in mine:
                torch.testing.assert_close(theirs[k], mine[k], rtol=1e-6, atol=1e-6, msg=f"client {u.client}: {k}")
        assert u.extra.keys() == v.extra.keys()


@pytest.mark.slow
@pytest.mark.parametrize(
    "settings",
    [
        {"method": "FedAvg"},
        {"method": "FedAvg", "optimizer": "adam", "lr": 1e-3},
        {"method": "FedAvg", "drop_last": True, "bn_stats": "local"},
        {"method": "FedProx", "method_args": {"mu": 0.5}},
        {"method": "FedProx", "method_args": {"mu": 0.5, "anchor": "initial"}},
        {"method": "FedPart", "models": ["resnet10"], "method_args": {"warmup": 0}},
        {"method": "FedLAG", "holdout": 0.25},
        {"method": "InCoAvg"},
    ],
    ids=["sgd", "adam", "drop_last-local_bn", "prox", "prox-initial", "part", "lag", "inco"],
)
def test_batched_updates_equal_serial_updates(float64, data, settings):
    assert_same_updates(round_updates(data, "serial", **settings), round_updates(data, "batched", **settings))


@pytest.mark.slow
def test_a_partial_round_trains_only_its_group_side_by_side(float64, data):
    settings = {"method": "FedPart", "models": ["resnet10"], "method_args": {"warmup": 0}}
    part, full = round_updates(data, "batched", **settings), round_updates(data, "batched", models=["resnet10"])
    assert not part[0].full and 0 < part[0].upload_params < full[0].upload_params
    assert part[0].delta.keys() < full[0].delta.keys()


@pytest.mark.slow
def test_float32_batched_training_is_deterministic(data):
    first, again = round_updates(data, "batched"), round_updates(data, "batched")
    for u, v in zip(first, again, strict=True):
        assert all(torch.equal(u.delta[k], v.delta[k]) for k in u.delta)


@pytest.mark.parametrize("method", ["SCAFFOLD", "MOON", "InCoMOON", "FedPartMOON"])
def test_objectives_with_session_hooks_are_refused_before_training(method):
    with pytest.raises(ValueError, match=rf"trainer: batched cannot train {method} \(its \w+ objective"):
        RunConfig(method=method, trainer="batched", models=["resnet10"])


def test_the_batchable_objectives_are_those_without_hooks_or_with_a_batched_correction():
    from incofl.registry import METHODS

    batchable = {name for name, m in METHODS.items() if m.objective.cls.client.batchable()}
    assert {"FedAvg", "FedProx", "FedNova", "HeteroAvg", "InCoAvg", "FedPart", "FedLAG"} <= batchable
    assert not {"SCAFFOLD", "MOON", "InCoScaffold", "InCoMOON"} & batchable


@pytest.mark.slow
def test_bf16_autocast_trains_side_by_side_as_the_serial_trainer_does(data):
    """vmap's batch_norm refused a bf16 input with float32 weights (first seen on an H200).
    One step per client; the engine turns autocast on only on a GPU, so it is switched on here."""

    def flat_deltas(trainer: str, autocast: bool) -> list[torch.Tensor]:
        settings = {"trainer": trainer, "local_epochs": 1, "batch_size": 128, "ratio": 0.5}  # 2 clients side by side
        engine = engine_on(data, **{**BASE, **settings})
        engine.transport.clients.runner.trainer.autocast = autocast
        updates = engine.transport.clients.runner.train_round(
            Round(1), engine.server.plan(Round(1)), engine.server.start
        )
        return [torch.cat([d.flatten() for _, d in sorted(u.delta.items()) if d.is_floating_point()]) for u in updates]

    fp32, serial, batched = flat_deltas("serial", False), flat_deltas("serial", True), flat_deltas("batched", True)
    for exact, s, b in zip(fp32, serial, batched, strict=True):
        assert (s - exact).norm() > 1e-3 * exact.norm()  # autocast is on: bf16 rounding shows
        assert (b - s).norm() < 0.03 * exact.norm()  # measured 0.4-1.0%; bf16's own error is 0.6-1.2%
