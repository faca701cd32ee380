"""A run in one process, as `incofl train` runs it: the server side and the client side, each
built by its own builder from its side's record of the run's settings (incofl.sides), joined by
the in-process transport (clients.InProcess). The client side holds every client's share of the
data set; the server side the run's facts derived from those shares and the test split, as a
federation's server reads them from its facts file (deploy/server/serverdata.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from incofl.config import RunConfig
from incofl.data.dataset import ImageDataset
from incofl.data.facts import TestSplit
from incofl.data.partition import Partition, partition_for
from incofl.data.shares import shares
from incofl.fl.engine.clients import InProcess, build_clients
from incofl.fl.engine.device import run_device
from incofl.fl.engine.engine import Engine
from incofl.fl.engine.run import Run
from incofl.fl.engine.rundir import claimed
from incofl.fl.engine.server import build_server
from incofl.sides import ClientSettings, ServerSettings


def simulator(cfg: RunConfig, data: ImageDataset, partition: Partition, device: torch.device) -> Engine:
    """The run's two sides (module docstring) on `device`: the client side built first, so that the
    server side's models are the last the run's seed initialises (as they always were)."""
    if len(partition.parts) != cfg.clients:
        raise ValueError(f"partition has {len(partition.parts)} clients, config has clients={cfg.clients}")
    holdings, facts = shares(data, partition, cfg.holdout, cfg.partition_seed, cfg.normalize)
    clients = build_clients(ClientSettings.of(cfg), holdings, device, cfg.pretrained)
    test = TestSplit(data.x_test, data.y_test)
    server = build_server(ServerSettings.of(cfg), facts, test, device, clients.layout)
    return Engine(server, InProcess(clients))


def simulated(cfg: RunConfig, data: ImageDataset | None = None) -> Engine:
    """A run as `incofl train` builds it: the config's threads, its data set (unless given), its
    partition and device; every input is checked before an output is touched."""
    from incofl.data.sources import dataset_for

    device = run_device(cfg)  # and its threads
    data = data or dataset_for(cfg)
    return simulator(cfg, data, partition_for(cfg, data), device)


def train(cfg: RunConfig, out_dir: str | Path, data: ImageDataset | None = None) -> dict[str, Any]:
    """Run (or resume) one configured training run in the simulator and return its summary."""
    engine = simulated(cfg, data)
    with claimed(Path(out_dir)):
        return Run(cfg, engine, Path(out_dir)).execute()
