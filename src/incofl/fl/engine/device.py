"""The device a run computes on (the same for both sides of a run)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from incofl.config import ConfigError, RunConfig
from incofl.numerics import activate

if TYPE_CHECKING:
    from incofl.sides import ClientSettings, ServerSettings


def run_device(cfg: RunConfig) -> torch.device:
    """The device a run computes on, its threads set (`side_device`); `cfg` then holds the numerics in effect, as the
    run records them: `auto` is decided here where nothing decided it before (incofl.numerics.decide),
    e.g. in a federation's server."""
    cfg.numerics = in_effect(cfg)
    return _device(cfg, cfg.numerics)


def side_device(settings: ServerSettings | ClientSettings) -> torch.device:
    """The device a side computes on, its threads set and its numerics in effect: a portable run computes on the CPU
    with every pin checked (incofl.numerics), so `device: auto` means the CPU there."""
    return _device(settings, in_effect(settings))


def in_effect(settings: ServerSettings | ClientSettings | RunConfig) -> str:
    """The numerics a run's kernels compute with, activated (`auto` on a GPU: native)."""
    return activate("native" if settings.numerics == "auto" and settings.device == "cuda" else settings.numerics)


def _device(settings: ServerSettings | ClientSettings | RunConfig, numerics: str) -> torch.device:
    """The device, with the settings' torch threads set (unset: torch's default)."""
    if settings.threads:
        torch.set_num_threads(settings.threads)
    device = resolve_device("cpu" if numerics == "portable" else settings.device)
    if settings.cuda_graphs and device.type != "cuda":
        raise ConfigError(f"cuda_graphs: CUDA graphs replay on a GPU; this run computes on the {device.type}")
    return device


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda, but this machine has no CUDA device (device: auto uses the CPU then)")
    return torch.device(name)
