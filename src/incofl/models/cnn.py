"""FedLAG's released CNN (docs/methods.md, FedLAG): `cnn20`, a one-model family.

The release (khanhkhanhlele/FedLAG, system/flcore/trainmodel/models.py, class `FedAvgCNN20`;
`--model cnn20` in system/main.py) is three blocks of two 3x3 convolutions (padding 1, with
bias, each followed by ReLU) and a 2x2 max-pool: 32-32, 64-64, 128-128 channels; then
flatten, FC 128*4*4 = 2048 -> 512 with ReLU, and the head 512 -> classes. No batch norm, no
dropout, PyTorch's default initialisation (the release calls no init on it). The state-dict
names are the release's (`conv1.0.weight`, `conv1.2.weight`, ..., `fc1.0.weight`, `fc.weight`;
the release wraps it as `base.*` + `head.*` for FedLAG), so FedLAG's personal layers and the
FedPer head (`fc.*`) read the same entries. 1,341,226 parameters for CIFAR-10.

The release hard-codes 2048 inputs to fc1 (32x32 images); here fc1's width comes from the
input side (`image_size`): three floor-halvings, so 28x28 images (FMNIST without `resize`)
give 128*3*3 = 1152, and `resize: 32` gives the release's model. `features` is the 512-wide
output of fc1 (the release's `base`), which MOON's projection head reads.
"""

from __future__ import annotations

import torch
from torch import nn

from incofl.models.projection import Projectable

CNNS = ("cnn20",)
_WIDTHS = (32, 64, 128)
_HIDDEN = 512


def _block(cin: int, cout: int) -> nn.Sequential:
    """conv-ReLU-conv-ReLU-maxpool, indexed as the release's (convs at 0 and 2)."""
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel_size=3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, kernel_size=3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(kernel_size=2, stride=2),
    )


def flat_features(image_size: int) -> int:
    """fc1's input width for square images of side `image_size` (2048 at 32)."""
    side = image_size // 2 // 2 // 2
    if side < 1:
        raise ValueError(f"cnn20: images of side {image_size} vanish in its three 2x2 max-pools; 8 is the least")
    return _WIDTHS[-1] * side * side


class CNN20(Projectable, nn.Module):
    """FedAvgCNN20 with a `features` method (fc1's output) and an optional MOON projection head."""

    classifier_name = "fc"

    def __init__(
        self,
        num_classes: int,
        in_channels: int = 3,
        image_size: int = 32,
        projection_dim: int | None = None,
    ):
        super().__init__()
        a, b, c = _WIDTHS
        self.conv1 = _block(in_channels, a)
        self.conv2 = _block(a, b)
        self.conv3 = _block(b, c)
        self.fc1 = nn.Sequential(nn.Linear(flat_features(image_size), _HIDDEN), nn.ReLU(inplace=True))
        self.fc = nn.Linear(_HIDDEN, num_classes)
        self.add_projection(projection_dim)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv3(self.conv2(self.conv1(x)))
        return self.fc1(torch.flatten(x, 1))


def cnn(
    name: str, num_classes: int, in_channels: int = 3, image_size: int = 32, projection_dim: int | None = None
) -> CNN20:
    if name not in CNNS:
        raise ValueError(f"unknown CNN {name!r}")
    return CNN20(num_classes, in_channels, image_size, projection_dim)
