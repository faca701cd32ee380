"""`incofl bench`: both paths measured on the asked device, with the device named in the JSON."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from incofl.bench import benchmark

SMALL = {"model": "resnet10", "clients": 2, "samples": 32, "epochs": 1, "batch_size": 16, "repeats": 1, "threads": 1}


def test_cpu_bench_names_its_device_and_measures_both_paths():
    result = benchmark(**SMALL)
    assert result["device"] == "cpu" and result["device_name"]
    assert result["engine_samples_per_s"] > 0 and result["plain_samples_per_s"] > 0
    assert result["ratio"] == pytest.approx(result["engine_samples_per_s"] / result["plain_samples_per_s"], rel=1e-2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_one_line_and_exit_2():
    proc = subprocess.run([sys.executable, "-m", "incofl.cli", "bench", "--device", "cuda", "--json"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == (
        "incofl bench: error: device: cuda, but this machine has no CUDA device (device: auto uses the CPU then)"
    )
