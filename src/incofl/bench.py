"""`incofl bench`: the engine's overhead over a plain PyTorch loop, measured in one process.

Both paths train the same architecture from the same weights on the same batches (same
permutations and augmentation draws). The engine path is one full communication round of
InCoAvg (sampling every client, local training, deltas, heteroavg, InCo, server update);
the plain path is a bare loop of forward, backward and Adam steps.
"""

from __future__ import annotations

import platform
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from incofl.config import RunConfig
from incofl.data.partition import Partition, iid_partition
from incofl.data.sources import load_dataset
from incofl.data.tensors import TensorSplit
from incofl.fl.sampling import client_seed
from incofl.fl.simulation import Engine, resolve_device
from incofl.models.family import build_model


def plain_loop(
    model: torch.nn.Module, data: TensorSplit, parts: list, seed: int, epochs: int, batch_size: int, lr: float
) -> int:
    """Reference: the engine's local training with no federated machinery; returns samples seen."""
    samples = 0
    for client, indices in enumerate(parts):
        gen = torch.Generator().manual_seed(client_seed(seed, 0, client))
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        idx = torch.from_numpy(indices)
        model.train()
        for _ in range(epochs):
            for batch in idx[torch.randperm(len(idx), generator=gen)].split(batch_size):
                if len(batch) < 2:
                    continue
                x, y = data.batch(batch, gen)
                optimizer.zero_grad(set_to_none=True)
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                samples += len(batch)
    return samples


def benchmark(
    model: str = "resnet18",
    clients: int = 4,
    samples: int = 500,
    epochs: int = 2,
    batch_size: int = 64,
    threads: int | None = None,
    repeats: int = 2,
    seed: int = 0,
    device: str = "cpu",
) -> dict[str, Any]:
    """Alternate the two paths `repeats` times and keep each one's fastest run (the machine is noisy)."""
    if threads:
        torch.set_num_threads(threads)
    dev = resolve_device(device)
    data = load_dataset("synthetic", cache_dir=None)
    cfg = RunConfig(
        dataset="synthetic",
        method="InCoAvg",
        models=[model],
        clients=clients,
        ratio=1.0,
        rounds=1,
        local_epochs=epochs,
        batch_size=batch_size,
        seed=seed,
        progress=False,
        device=dev.type,
        augment="none",
    )
    parts = iid_partition(clients * samples, clients, seed)
    engine = Engine(cfg, data, Partition(parts, np.zeros((clients, 0)), {}), dev)
    aggregate, aggregate_s = engine.aggregator.aggregate, []

    def timed_aggregate(updates: list) -> dict:
        start = time.perf_counter()
        out = aggregate(updates)
        aggregate_s.append(time.perf_counter() - start)
        return out

    engine.aggregator.aggregate = timed_aggregate
    plain_model = build_model(model, data.num_classes, data.channels).to(dev)
    plain_model.load_state_dict(engine.states[0])
    plain_loop(plain_model, engine.train_data, [parts[0][: 2 * batch_size]], seed, 1, batch_size, cfg.lr)  # warm-up
    engine_s, plain_s = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        engine_samples = engine.run_round(0).samples
        engine_s.append(_finished(dev) - start)
        start = time.perf_counter()
        plain_samples = plain_loop(plain_model, engine.train_data, parts, seed, epochs, batch_size, cfg.lr)
        plain_s.append(_finished(dev) - start)
    best = int(np.argmin(engine_s))
    engine_sps, plain_sps = engine_samples / engine_s[best], plain_samples / min(plain_s)
    return {
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
        "model": model,
        "clients": clients,
        "samples_per_client": samples,
        "epochs": epochs,
        "batch_size": batch_size,
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "engine_samples_per_s": round(engine_sps, 1),
        "plain_samples_per_s": round(plain_sps, 1),
        "ratio": round(engine_sps / plain_sps, 3),
        "aggregation_share": round(aggregate_s[best] / engine_s[best], 4),
    }


def _finished(device: torch.device) -> float:
    """The time once the device's queued work is done (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def format_report(r: dict[str, Any]) -> str:
    return (
        f"{r['device']} ({r['device_name']}): {r['model']}, "
        f"{r['clients']} clients x {r['samples_per_client']} samples x {r['epochs']} epochs, "
        f"batch {r['batch_size']}, {r['threads']} threads\n"
        f"engine (full InCoAvg round): {r['engine_samples_per_s']:8.1f} samples/s\n"
        f"plain PyTorch loop:          {r['plain_samples_per_s']:8.1f} samples/s\n"
        f"ratio engine/plain:          {r['ratio']:8.3f}\n"
        f"aggregation + InCo share:    {100 * r['aggregation_share']:7.2f} % of round time"
    )
