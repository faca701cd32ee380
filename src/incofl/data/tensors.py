"""A data set held as tensors on the training device, served as normalised batches."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from incofl.data.augment import Augmentation, augment
from incofl.data.dataset import ImageDataset


def normalisation(data: ImageDataset, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (mean, std): `stats` of the training images (ours), `half` (0.5, 0.5: the
    release's SVHN and ViT) or `none` (pixels in [0, 1]: the release's FMNIST)."""
    if mode == "stats":
        return data.channel_stats()
    mean, std = (0.5, 0.5) if mode == "half" else (0.0, 1.0)
    return np.full(data.channels, mean), np.full(data.channels, std)


class TensorSplit:
    """uint8 images and labels on `device`; batches come out as normalised float tensors."""

    def __init__(
        self,
        x: np.ndarray,
        y: np.ndarray,
        mean: np.ndarray,
        std: np.ndarray,
        device: torch.device,
        input_size: int,
        augmentation: Augmentation | None = None,
    ):
        self.x = torch.from_numpy(x).to(device)
        self.y = torch.from_numpy(y).long().to(device)
        # torch's default float type: float32, or float64 where the CPU-independent pins set it
        self.mean = torch.tensor(mean, dtype=torch.get_default_dtype(), device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.get_default_dtype(), device=device).view(1, -1, 1, 1)
        self.input_size = input_size
        self.augmentation = augmentation or Augmentation()

    def __len__(self) -> int:
        return len(self.y)

    def batch(self, idx: torch.Tensor, gen: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        idx = idx.to(self.x.device)
        x = (self.x[idx].to(self.mean.dtype) / 255.0 - self.mean) / self.std
        if gen is not None and self.augmentation.active:
            x = augment(x, self.augmentation, gen, fill=-self.mean / self.std)  # pixel 0 (black), normalised
        if x.shape[-1] != self.input_size:  # e.g. 32x32 images into a 224x224 ViT, FMNIST's 28 to 32
            x = F.interpolate(x, size=self.input_size, mode="bilinear", align_corners=False)
        return x, self.y[idx]


def to_device(
    data: ImageDataset,
    device: torch.device,
    input_size: int,
    augmentation: Augmentation | None = None,
    normalize: str = "stats",
) -> tuple[TensorSplit, TensorSplit]:
    """Train split (augmented) and test split, both normalised alike."""
    mean, std = normalisation(data, normalize)
    train = TensorSplit(data.x_train, data.y_train, mean, std, device, input_size, augmentation)
    test = TensorSplit(data.x_test, data.y_test, mean, std, device, input_size)
    return train, test
