"""A data set held as tensors on the training device, served as normalised batches."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from incofl.data.augment import augment
from incofl.data.dataset import ImageDataset


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
        augment_mode: str = "none",
    ):
        self.x = torch.from_numpy(x).to(device)
        self.y = torch.from_numpy(y).long().to(device)
        self.mean = torch.tensor(mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        self.input_size = input_size
        self.augment_mode = augment_mode

    def __len__(self) -> int:
        return len(self.y)

    def batch(self, idx: torch.Tensor, gen: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        idx = idx.to(self.x.device)
        x = (self.x[idx].float() / 255.0 - self.mean) / self.std
        if gen is not None and self.augment_mode != "none":
            x = augment(x, self.augment_mode, gen)
        if x.shape[-1] != self.input_size:  # e.g. 32x32 images into a 224x224 ViT
            x = F.interpolate(x, size=self.input_size, mode="bilinear", align_corners=False)
        return x, self.y[idx]


def to_device(
    data: ImageDataset, device: torch.device, input_size: int, augment_mode: str
) -> tuple[TensorSplit, TensorSplit]:
    """Train split (augmented) and test split, normalised with the training set's channel stats."""
    mean, std = data.channel_stats()
    train = TensorSplit(data.x_train, data.y_train, mean, std, device, input_size, augment_mode)
    test = TensorSplit(data.x_test, data.y_test, mean, std, device, input_size)
    return train, test
