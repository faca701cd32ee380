"""The device a run computes on (the same for both sides of a run)."""

from __future__ import annotations

import torch

from incofl.config import ConfigError, RunConfig
from incofl.numerics import activate


def run_device(cfg: RunConfig) -> torch.device:
    """The device a run computes on, its numerics in effect: a portable run computes on the CPU
    with every pin checked (incofl.numerics), so `device: auto` means the CPU there. `cfg` then
    holds the numerics in effect, as the run records them: `auto` is decided here where nothing
    decided it before (incofl.numerics.decide), e.g. in a federation's processes."""
    cfg.numerics = activate("native" if cfg.numerics == "auto" and cfg.device == "cuda" else cfg.numerics)
    device = resolve_device("cpu" if cfg.numerics == "portable" else cfg.device)
    if cfg.cuda_graphs and device.type != "cuda":
        raise ConfigError(f"cuda_graphs: CUDA graphs replay on a GPU; this run computes on the {device.type}")
    return device


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda, but this machine has no CUDA device (device: auto uses the CPU then)")
    return torch.device(name)
