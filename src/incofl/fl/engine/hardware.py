"""The kind of hardware a run computes on: what, besides the code, its settings and the seed,
decides a run's floating-point results. Two runs of one setting on the same kind give the same
weights bit for bit; on different kinds they drift apart (docs/workflow.md, "Did my rerun
reproduce?"). summary.json records it as `hardware`; the golden runs are pinned by it."""

from __future__ import annotations

import platform
import re
from pathlib import Path

import torch

from incofl.numerics import Numerics, describe


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo, else the platform's), without its clock: the clock
    picks no kernel."""
    info = Path("/proc/cpuinfo")
    names = [
        line.split(":", 1)[1].strip()
        for line in (info.read_text().splitlines() if info.exists() else [])
        if line.startswith("model name")
    ]
    model = names[0] if names else platform.processor() or platform.machine()
    return re.sub(r"\s*@\s*[\d.]+\s*GHz$", "", model)


def hardware_kind(device: torch.device, numerics: Numerics = "native") -> str:
    """`<CPU model> | <ATen's CPU capability> | <torch version>` on a CPU (oneDNN and MKL pick
    kernels by instruction set; ATEN_CPU_CAPABILITY can lower it); under portable numerics one kind
    for every x86-64 CPU with AVX2 (incofl.numerics); on a GPU its name and CUDA's version."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} | CUDA {torch.version.cuda} | {torch.__version__}"
    if device.type != "cpu":
        return f"{device.type} on {cpu_model()} | {torch.__version__}"
    if numerics == "portable":
        return f"{describe(numerics)} | {torch.__version__}"
    return f"{cpu_model()} | {torch.backends.cpu.get_cpu_capability()} | {torch.__version__}"
