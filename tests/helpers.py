"""Builders the engine-level tests share (importable: pytest puts tests/ on sys.path)."""

from __future__ import annotations

from typing import Any

import torch

from incofl.config import RunConfig
from incofl.data.dataset import ImageDataset
from incofl.data.partition import make_partition
from incofl.data.sources import load_dataset
from incofl.fl.contracts import State
from incofl.fl.engine.engine import KEPT, Engine


def small_synthetic(n_train: int, n_test: int = 32) -> ImageDataset:
    """The first images of the synthetic set, on one thread (the machine's cores are shared)."""
    torch.set_num_threads(1)
    full = load_dataset("synthetic", cache_dir=None)
    return ImageDataset("synthetic", full.x_train[:n_train], full.y_train[:n_train], full.x_test[:n_test],
                        full.y_test[:n_test])  # fmt: skip


QUIET = {"dataset": "synthetic", "progress": False, "threads": 1, "device": "cpu"}


def engine_on(data: ImageDataset, **settings: Any) -> Engine:
    """A CPU engine over `data` with the partition its settings describe (partition seed 0)."""
    cfg = RunConfig(**{**QUIET, **settings})
    part = make_partition(data.y_train, kind=cfg.partition, num_clients=cfg.clients, alpha=cfg.alpha, seed=0,
                          client_samples=cfg.client_samples, shard_classes=cfg.shard_classes)  # fmt: skip
    return Engine(cfg, data, part, torch.device("cpu"))


def kept_by(engine: Engine) -> dict[int, State]:
    """What each client keeps (ClientPlan.keep), from the engine's client store."""
    return {client: engine.clients.get(KEPT, client) for client in engine.clients.clients(KEPT)}
