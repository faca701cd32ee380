"""Tensor-level normalisation and augmentation: no PIL, no DataLoader workers in the hot loop."""

from __future__ import annotations

import torch
import torch.nn.functional as F

DEFAULT_AUGMENT = {"cifar10": "crop_flip", "cinic10": "crop_flip", "svhn": "crop"}


def resolve_augment(mode: str, dataset: str) -> str:
    """`auto` -> random crop + flip for natural images, crop for digits-like SVHN, none otherwise."""
    return DEFAULT_AUGMENT.get(dataset, "none") if mode == "auto" else mode


def random_crop(x: torch.Tensor, pad: int, gen: torch.Generator) -> torch.Tensor:
    """Per-sample random crop of a zero-padded batch back to its size."""
    n, c, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=gen).to(x.device)
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=gen).to(x.device)
    rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
    cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
    batch = torch.arange(n, device=x.device)[:, None, None, None]
    chan = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[batch, chan, rows, cols]


def random_flip(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    flip = (torch.rand(x.shape[0], generator=gen) < 0.5).to(x.device)[:, None, None, None]
    return torch.where(flip, x.flip(3), x)


def augment(x: torch.Tensor, mode: str, gen: torch.Generator) -> torch.Tensor:
    if mode in ("crop", "crop_flip"):
        x = random_crop(x, 4, gen)
    if mode == "crop_flip":
        x = random_flip(x, gen)
    return x
