"""A data set held as tensors on the training device, served as normalised batches (a training
split's augmented by the function data/augment.py makes: the server side loads no augmentation)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from incofl.data.dataset import ImageDataset

# a training batch's augmentation: (normalised images, the batch's generator, the fill of black pixels) -> images
Augmenter = Callable[[torch.Tensor, torch.Generator, torch.Tensor], torch.Tensor]


def normalisation(data: ImageDataset, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (mean, std): `stats` of the training images (ours), `half` (0.5, 0.5: the
    release's SVHN and ViT) or `none` (pixels in [0, 1]: the release's FMNIST)."""
    if mode == "stats":
        return data.channel_stats()
    mean, std = (0.5, 0.5) if mode == "half" else (0.0, 1.0)
    return np.full(data.channels, mean), np.full(data.channels, std)


class TensorSplit:
    """uint8 images and labels on `device`; batches come out as normalised float tensors, augmented
    by `augmenter` where a batch is drawn with a generator (training)."""

    def __init__(
        self,
        x: np.ndarray,
        y: np.ndarray,
        mean: np.ndarray,
        std: np.ndarray,
        device: torch.device,
        input_size: int,
        augmenter: Augmenter | None = None,
    ):
        self.x = torch.from_numpy(x).to(device)
        self.y = torch.from_numpy(y).long().to(device)
        # torch's default float type: float32, or float64 where the CPU-independent pins set it
        self.mean = torch.tensor(mean, dtype=torch.get_default_dtype(), device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.get_default_dtype(), device=device).view(1, -1, 1, 1)
        self.input_size = input_size
        self.augmenter = augmenter

    def __len__(self) -> int:
        return len(self.y)

    def batch(self, idx: torch.Tensor, gen: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        idx = idx.to(self.x.device)
        x = (self.x[idx].to(self.mean.dtype) / 255.0 - self.mean) / self.std
        if gen is not None and self.augmenter is not None:
            x = self.augmenter(x, gen, -self.mean / self.std)  # the fill: pixel 0 (black), normalised
        if x.shape[-1] != self.input_size:  # e.g. 32x32 images into a 224x224 ViT, FMNIST's 28 to 32
            x = F.interpolate(x, size=self.input_size, mode="bilinear", align_corners=False)
        return x, self.y[idx]
