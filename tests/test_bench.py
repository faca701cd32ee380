"""`incofl bench`: both paths measured on the asked device, with the device named in the JSON."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from incofl.bench import benchmark, peak_flops, per_client
from incofl.fl.contracts import Round
from incofl.fl.engine.estimate import training_flops
from incofl.models.family import build_model

SMALL = {"model": "resnet10", "clients": 2, "samples": 32, "epochs": 1, "batch_size": 16, "repeats": 1, "threads": 1}


@pytest.mark.slow
def test_cpu_bench_names_its_device_and_measures_every_path():
    result = benchmark(**SMALL)
    assert result["device"] == "cpu" and result["device_name"]
    # bf16 autocast only on a GPU; the serial trainer also with the analyses idle and probing
    assert set(result["paths"]) == {
        "serial_fp32",
        "batched_fp32",
        "serial_fp32_analyses-idle",
        "serial_fp32_analyses-probing",
    }
    plain = result["plain"]["samples_per_s"]
    assert result["samples"] == result["plain_samples"] == 2 * 32 * 1  # every path trains every sample once
    for path in result["paths"].values():
        assert path["samples_per_s"] > 0 and path["ratio"] == pytest.approx(path["samples_per_s"] / plain, rel=1e-2)
        assert 0 < path["aggregation_share"] < 1
        assert path["peak_fraction"] is None  # no peak FLOP/s known for a CPU
    assert result["engine_samples_per_s"] == result["paths"]["serial_fp32"]["samples_per_s"]
    x, y = torch.rand(4, 3, 32, 32), torch.zeros(4, dtype=torch.long)
    assert result["train_flops_per_sample"] == round(training_flops(build_model("resnet10", 10, 3), x, y))


@pytest.mark.slow
def test_per_client_bench_trains_the_same_samples_both_ways():
    """Many small clients against one loop over their samples: the same passes, and a ratio and
    per-client cost that are the two timings' (a path that trained other samples, or a ratio of
    other numbers, fails)."""
    r = per_client(model="resnet10", clients=4, samples=8, batch_size=4, threads=1, repeats=1)
    assert r["samples"] == r["one_loop_samples"] == 4 * 8
    assert r["ratio"] == pytest.approx(r["round_s"] / r["one_loop_s"], rel=1e-2)
    assert r["per_client_ms"] == pytest.approx(1000 * (r["round_s"] - r["one_loop_s"]) / 4, abs=0.25)  # ms rounding


def test_training_flops_of_a_linear_layer_are_its_forward_and_weight_gradient():
    """2dk multiply-adds forward and 2dk for the weight gradient (no input gradient is needed)."""
    model, x, y = torch.nn.Linear(8, 4, bias=False), torch.randn(5, 8), torch.randint(0, 4, (5,))
    assert training_flops(model, x, y) == 2 * 8 * 4 + 2 * 8 * 4


def test_peak_flops_know_the_gpus_and_not_a_cpu():
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989.4e12
    assert peak_flops("NVIDIA H100 PCIe", "fp32") == 378e12  # not the SXM part's
    assert peak_flops("x86_64", "fp32") is None


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_one_line_and_exit_2():
    proc = subprocess.run(
        [sys.executable, "-m", "incofl.cli", "bench", "--device", "cuda", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == (
        "incofl bench: error: device: cuda, but this machine has no CUDA device (device: auto uses the CPU then)"
    )


@pytest.mark.slow
def test_the_work_said_before_a_run_is_what_it_trains():
    """Sample-passes from the drawn schedule equal the passes the rounds report; the FLOPs
    weight each client's passes by its model group's count."""
    from helpers import engine_on, small_synthetic

    from incofl.fl.engine.estimate import Work

    engine = engine_on(
        small_synthetic(120),
        clients=4,
        ratio=0.5,
        models=["resnet10", "resnet14"],
        rounds=3,
        batch_size=16,
        local_epochs=2,
    )
    work = Work(engine.server, 1)  # a run resumed after round 1
    trained = [engine.run_round(t).samples for t in Round.upto(engine.server.settings.rounds)]
    assert work.round_passes == trained[1:] and work.passes == sum(trained[1:])
    smallest, largest = (
        training_flops(m.eval(), *engine.transport.clients.training.train.batch(torch.arange(2)))
        for m in engine.server.models
    )
    assert smallest < largest == work.largest
    assert smallest * work.passes <= work.flops <= largest * work.passes
    assert work.time_line(2.0).endswith(
        f"about {2.0 * trained[2] / trained[1]:.0f} s for the remaining rounds at the first round's speed"
    )
