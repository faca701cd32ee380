"""The in-memory form every data source produces."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class ImageDataset:
    """Decoded images as uint8 NCHW arrays with int64 labels, train and test."""

    name: str
    x_train: np.ndarray  # uint8 (N, C, H, W)
    y_train: np.ndarray  # int64 (N,)
    x_test: np.ndarray
    y_test: np.ndarray
    order: str = "original"  # sample order: as published (torchvision's), "folder" (by class), "unknown"

    @property
    def num_classes(self) -> int:
        return int(np.concatenate([self.y_train, self.y_test]).max()) + 1  # the test split may be empty

    @property
    def channels(self) -> int:
        return int(self.x_train.shape[1])

    @property
    def image_size(self) -> int:
        return int(self.x_train.shape[2])

    def pooled(self) -> ImageDataset:
        """The train and test images as one training set (train first, then test, each in its
        order) and an empty test split (0 images of the same shape and dtypes): FedLAG's
        release partitions CIFAR-10's 60,000 images over the clients (`pool_test`)."""
        return replace(
            self,
            x_train=np.concatenate([self.x_train, self.x_test]),
            y_train=np.concatenate([self.y_train, self.y_test]),
            x_test=self.x_test[:0].copy(),
            y_test=self.y_test[:0].copy(),
        )

    def channel_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-channel mean and std of the training images in [0, 1], for normalisation."""
        x = self.x_train.astype(np.float64) / 255.0
        return x.mean(axis=(0, 2, 3)), x.std(axis=(0, 2, 3))


@dataclass(frozen=True)
class ShareDataset(ImageDataset):
    """A share of a data set's images (a federation site's, or the server's test split alone), with
    the whole data set's class count and normalisation, which a share cannot compute from its own."""

    classes: int = 0
    mean: np.ndarray | None = None
    std: np.ndarray | None = None

    @property
    def num_classes(self) -> int:
        return self.classes

    def channel_stats(self) -> tuple[np.ndarray, np.ndarray]:
        assert self.mean is not None and self.std is not None
        return self.mean, self.std
