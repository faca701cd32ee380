"""`incofl bench`: the engine's overhead over a plain PyTorch loop, measured in one process.

Every path trains the same architecture from the same weights on the same batches (same
permutations and augmentation draws). An engine path is one full communication round of
InCoAvg (sampling every client, local training, deltas, mean_over_holders, InCo, server update) with
the serial or the batched trainer, in fp32 and (on a GPU) bf16 autocast, eager and (on a GPU)
replayed as CUDA graphs (`cuda_graphs`), and the serial one with
the analyses (CKA, update histograms, t-SNE) asked for a later round (idle: what they cost when
not probing) and for this round (probing); the plain path is a
bare loop of forward, backward and Adam steps, one client after the other. The achieved
fraction of the device's peak FLOP/s comes from a per-sample count of training FLOPs.

`per_client` (`incofl bench --per-client`) measures what a client costs beyond its samples:
a round of many clients with few samples each against one loop over the same samples.
"""

from __future__ import annotations

import platform
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from incofl.config import RunConfig
from incofl.data.partition import Partition, iid_draw_partition, iid_partition
from incofl.data.sources import load_dataset
from incofl.data.tensors import TensorSplit
from incofl.fl.contracts import Round
from incofl.fl.engine.device import resolve_device
from incofl.fl.engine.engine import Engine
from incofl.fl.engine.estimate import training_flops
from incofl.fl.engine.simulator import simulator
from incofl.fl.stages.aggregate import Fold
from incofl.fl.stages.sampling import client_seed
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


PEAK_TFLOPS = {  # dense tensor-core peaks from NVIDIA's data sheets; fp32 convolutions run in TF32 (cuDNN's default)
    "H100 PCIe": {"fp32": 378.0, "bf16": 756.0},
    "H100": {"fp32": 494.7, "bf16": 989.4},  # SXM
    "H200": {"fp32": 494.7, "bf16": 989.4},
    "A100": {"fp32": 156.0, "bf16": 312.0},
}


def peak_flops(device_name: str, precision: str) -> float | None:
    """The device's peak FLOP/s for `precision`, None where the table does not know it (CPUs)."""
    for key, peaks in PEAK_TFLOPS.items():  # the more specific names first
        if key in device_name:
            return peaks[precision] * 1e12
    return None


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
    """Every engine path (serial and batched trainer; fp32, and bf16 on a GPU) and the plain loop,
    alternated `repeats` times; each keeps its fastest run (the machine is noisy)."""
    if threads:
        torch.set_num_threads(threads)
    dev = resolve_device(device)
    data = load_dataset("synthetic", cache_dir=None)
    parts = iid_partition(clients * samples, clients, seed)
    precisions = ["fp32", "bf16"] if dev.type == "cuda" else ["fp32"]
    graphs = [False, True] if dev.type == "cuda" else [False]
    paths = {
        f"{t}_{p}{'_graphs' * g}": _engine(data, parts, dev, model, epochs, batch_size, seed, t, p, cuda_graphs=g)
        for g in graphs
        for p in precisions
        for t in ("serial", "batched")
    }
    for state, round_ in (("idle", 2), ("probing", 1)):  # analyses asked for a later round, and for this one
        analyses = {"cka_rounds": [round_], "gradient_rounds": [round_], "tsne_rounds": [round_], "tsne_groups": [0]}
        paths[f"serial_fp32_analyses-{state}"] = _engine(
            data, parts, dev, model, epochs, batch_size, seed, "serial", "fp32", analyses
        )
    first = next(iter(paths.values()))[0]
    plain_model = build_model(model, data.num_classes, data.channels).to(dev)
    plain_model.load_state_dict(first.server.weights[0])
    train, lr = first.transport.clients.training.train, first.server.settings.lr
    x, y = train.batch(torch.from_numpy(parts[0][:batch_size]))
    flops = training_flops(plain_model, x, y)
    warm_up = [parts[0][: 2 * batch_size]]
    plain_loop(plain_model, train, warm_up, seed, 1, batch_size, lr)
    seconds: dict[str, list[float]] = {name: [] for name in [*paths, "plain"]}
    for _ in range(repeats):
        for name, (engine, _) in paths.items():
            start = time.perf_counter()
            trained = engine.run_round(Round(1)).samples
            seconds[name].append(_finished(dev) - start)
        start = time.perf_counter()
        plain_samples = plain_loop(plain_model, train, parts, seed, epochs, batch_size, lr)
        seconds["plain"].append(_finished(dev) - start)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu"
    plain_sps = plain_samples / min(seconds["plain"])

    def measured(sps: float, precision: str) -> dict[str, Any]:
        peak = peak_flops(name, precision)
        return {"samples_per_s": round(sps, 1), "peak_fraction": None if peak is None else round(sps * flops / peak, 4)}

    results = {}
    for path, (_, aggregate_s) in paths.items():
        best = int(np.argmin(seconds[path]))
        sps = trained / seconds[path][best]
        results[path] = measured(sps, path.split("_")[1]) | {
            "ratio": round(sps / plain_sps, 3),
            "aggregation_share": round(aggregate_s[best] / seconds[path][best], 4),
        }
    return {
        "device": str(dev),
        "device_name": name,
        "model": model,
        "clients": clients,
        "samples_per_client": samples,
        "epochs": epochs,
        "batch_size": batch_size,
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "train_flops_per_sample": round(flops),
        "samples": trained,  # a round's sample passes, every path's
        "plain_samples": plain_samples,
        "plain": measured(plain_sps, "fp32"),
        "paths": results,
        "engine_samples_per_s": results["serial_fp32"]["samples_per_s"],
        "plain_samples_per_s": round(plain_sps, 1),
        "ratio": results["serial_fp32"]["ratio"],
    }


def _engine(
    data: Any,
    parts: list,
    dev: torch.device,
    model: str,
    epochs: int,
    batch_size: int,
    seed: int,
    trainer: str,
    precision: str,
    analyses: dict[str, Any] | None = None,
    method: str = "InCoAvg",
    cuda_graphs: bool = False,
) -> tuple[Engine, list[float]]:
    """An engine of `method` with every client sampled (and `analyses`), and the seconds of each
    round's aggregation (its fold's `add`s and `averages`)."""
    cfg = RunConfig(
        dataset="synthetic",
        method=method,
        models=[model],
        clients=len(parts),
        ratio=1.0,
        rounds=2,
        local_epochs=epochs,
        batch_size=batch_size,
        seed=seed,
        progress=False,
        device=dev.type,
        augment="none",
        trainer=trainer,
        bf16=precision == "bf16",
        cuda_graphs=cuda_graphs,
        analyses=analyses or {},
    )
    engine = simulator(cfg, data, Partition(parts, np.zeros((len(parts), 0)), {}), dev)
    fold_of, aggregate_s = engine.server.aggregator.fold, []

    def timed_fold() -> Fold:
        fold, spent = fold_of(), [0.0]
        add, averages = fold.add, fold.averages

        def timed_add(update: Any) -> None:
            start = time.perf_counter()
            add(update)
            spent[0] += time.perf_counter() - start

        def timed_averages() -> dict:
            start = time.perf_counter()
            out = averages()
            aggregate_s.append(spent[0] + time.perf_counter() - start)
            return out

        fold.add, fold.averages = timed_add, timed_averages
        return fold

    engine.server.aggregator.fold = timed_fold
    return engine, aggregate_s


def per_client(
    model: str = "cnn20",
    clients: int = 1000,
    samples: int = 10,
    epochs: int = 1,
    batch_size: int = 10,
    threads: int | None = None,
    repeats: int = 2,
    seed: int = 0,
    device: str = "cpu",
    method: str = "FedAvg",
) -> dict[str, Any]:
    """What a client costs beyond its samples: one engine round of `clients` clients of `samples`
    distinct images each (drawn as `partition: iid_draw` does; every client sampled, the serial
    trainer) against one plain loop over the same images as one client, alternated `repeats`
    times, each keeping its fastest run. `ratio` is the round's seconds over the loop's;
    `per_client_ms` the difference per client."""
    if threads:
        torch.set_num_threads(threads)
    dev = resolve_device(device)
    data = load_dataset("synthetic", cache_dir=None)
    parts = iid_draw_partition(len(data.y_train), clients, samples, seed)
    engine, _ = _engine(data, parts, dev, model, epochs, batch_size, seed, "serial", "fp32", method=method)
    plain_model = build_model(model, data.num_classes, data.channels).to(dev)
    plain_model.load_state_dict(engine.server.weights[0])
    one = [np.concatenate(parts)]  # every client's images, one client
    warm_up = [one[0][: 2 * batch_size]]
    train, lr = engine.transport.clients.training.train, engine.server.settings.lr
    plain_loop(plain_model, train, warm_up, seed, 1, batch_size, lr)
    seconds: dict[str, list[float]] = {"round": [], "one_loop": []}
    for _ in range(repeats):
        start = time.perf_counter()
        trained = engine.run_round(Round(1)).samples
        seconds["round"].append(_finished(dev) - start)
        start = time.perf_counter()
        looped = plain_loop(plain_model, train, one, seed, epochs, batch_size, lr)
        seconds["one_loop"].append(_finished(dev) - start)
    round_s, loop_s = min(seconds["round"]), min(seconds["one_loop"])
    return {
        "device": str(dev),
        "model": model,
        "method": method,
        "clients": clients,
        "samples_per_client": samples,
        "epochs": epochs,
        "batch_size": batch_size,
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "samples": trained,
        "one_loop_samples": looped,
        "round_s": round(round_s, 3),
        "one_loop_s": round(loop_s, 3),
        "ratio": round(round_s / loop_s, 3),
        "per_client_ms": round(1000 * (round_s - loop_s) / clients, 3),
    }


def _finished(device: torch.device) -> float:
    """The time once the device's queued work is done (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def format_per_client(r: dict[str, Any]) -> str:
    return (
        f"{r['device']}: {r['model']} {r['method']}, {r['clients']} clients x {r['samples_per_client']} samples "
        f"x {r['epochs']} epochs, batch {r['batch_size']}, {r['threads']} threads\n"
        f"one round: {r['round_s']:.3f} s; one loop over the same samples: {r['one_loop_s']:.3f} s; "
        f"ratio {r['ratio']:.3f}, {r['per_client_ms']:.2f} ms a client"
    )


def format_report(r: dict[str, Any]) -> str:
    def peak(m: dict[str, Any]) -> str:
        return "" if m["peak_fraction"] is None else f"  {100 * m['peak_fraction']:5.1f} % of peak"

    lines = [
        f"{r['device']} ({r['device_name']}): {r['model']}, "
        f"{r['clients']} clients x {r['samples_per_client']} samples x {r['epochs']} epochs, "
        f"batch {r['batch_size']}, {r['threads']} threads, {r['train_flops_per_sample'] / 1e6:.1f} MFLOP a sample",
        f"plain PyTorch loop (fp32):  {r['plain']['samples_per_s']:9.1f} samples/s{peak(r['plain'])}",
    ]
    for path, m in r["paths"].items():
        lines.append(
            f"engine {path:<28} {m['samples_per_s']:9.1f} samples/s  x{m['ratio']:.3f} of plain, "
            f"aggregation + InCo {100 * m['aggregation_share']:.2f} %{peak(m)}"
        )
    return "\n".join(lines)
