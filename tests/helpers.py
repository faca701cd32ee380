"""Builders the engine-level tests share (importable: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import os
from typing import Any, NoReturn

import pytest
import torch

from incofl.config import RunConfig
from incofl.data.dataset import ImageDataset
from incofl.data.partition import make_partition, partition_for
from incofl.data.sources import load_dataset
from incofl.fl.contracts import Round, State
from incofl.fl.engine.engine import Engine
from incofl.fl.engine.simulator import simulator
from incofl.fl.stages.client import KEPT


def small_synthetic(n_train: int, n_test: int = 32) -> ImageDataset:
    """The first images of the synthetic set, on one thread (the machine's cores are shared)."""
    torch.set_num_threads(1)
    full = load_dataset("synthetic", cache_dir=None)
    return ImageDataset(
        "synthetic", full.x_train[:n_train], full.y_train[:n_train], full.x_test[:n_test], full.y_test[:n_test]
    )


QUIET = {"dataset": "synthetic", "progress": False, "threads": 1, "device": "cpu"}


def engine_on(data: ImageDataset, **settings: Any) -> Engine:
    """A CPU engine over `data` with the partition its settings describe (partition seed 0)."""
    cfg = RunConfig(**{**QUIET, **settings})
    part = make_partition(
        data.y_train,
        kind=cfg.partition,
        num_clients=cfg.clients,
        alpha=cfg.alpha,
        seed=0,
        client_samples=cfg.client_samples,
        shard_classes=cfg.shard_classes,
    )
    return simulator(cfg, data, part, torch.device("cpu"))


def kept_by(engine: Engine) -> dict[int, State]:
    """What each client keeps (ClientPlan.keep), from the engine's client store."""
    return {
        client: engine.transport.clients.store.get(KEPT, client)
        for client in engine.transport.clients.store.clients(KEPT)
    }


def unavailable(reason: str) -> NoReturn:
    """A prerequisite (the SLURM cluster, real CIFAR-10) is missing: a skip, and a failure under
    CI=true, where .ci/run provides both, so that CI never passes with those tests unrun."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: CI must provide it)", pytrace=False)
    pytest.skip(reason)


def seen(data: ImageDataset, n_train: int | None = None, n_test: int | None = None) -> ImageDataset:
    """`data`'s first `n_train` training images (all by default), the first `n_test` of them also
    its test split: evaluate()'s loss is then a loss on data the clients train on, which a round
    must lower. The test loss need not fall in one tiny round (cnn20's FedAvg: 2.3023 -> 2.3066)."""
    x, y = data.x_train[:n_train], data.y_train[:n_train]
    return ImageDataset(data.name, x, y, x[:n_test], y[:n_test])


def learned(engine: Engine, rounds: int = 1) -> dict[str, float]:
    """Runs `rounds` rounds and checks that they trained (`assert_learned`); the last evaluation."""
    start, before = engine.fingerprint(), engine.evaluate(Round(0))["mean_loss"]
    for round_ in Round.upto(rounds):
        engine.observe(engine.run_round(round_))
    row = engine.evaluate(Round(rounds))
    assert_learned(start, engine.fingerprint(), before, row["mean_loss"])
    return row


def assert_trained(summary: dict[str, Any], cfg: RunConfig, data: ImageDataset) -> None:
    """A finished run (incofl.fl.engine.run.train's summary on `data`) against its untrained start."""
    start = simulator(cfg, data, partition_for(cfg, data), torch.device("cpu"))
    assert_learned(
        start.fingerprint(), summary["state_sha256"], start.evaluate(Round(0))["mean_loss"], summary["final_loss"]
    )


def assert_learned(start: str, end: str, before: float, after: float) -> None:
    """Training moved the weights (fingerprints) and lowered the evaluated loss: a no-op
    aggregator fails both. Score on `seen` data, so that the loss is a training loss."""
    assert end != start, "training left the weights as they were"
    assert after < before, f"training did not lower the loss: {before:.4f} -> {after:.4f}"


def client_model(engine: Engine, client: int, group: int) -> State:
    """The weights of a client's model: its group's global weights with what it keeps (the client side's)."""
    return engine.transport.clients.runner.overlay(client, engine.server.sub_state(group))
