"""HeteroFL's pre-activation ResNet-18 for width splitting (HeteroFL and FedRolex; docs/methods.md, hetero splitting).

A model at width rate r keeps ceil(r * C) of every layer's C channels, except the image input
channels and the classifier's class rows, so every rate has the same state-dict names and a
sub-model's entries are slices of the full model's. Blocks are BN-ReLU-conv twice; where a
block changes stride or width its shortcut is a bare 1x1 conv on the block's first BN-ReLU
output. The stem has neither BN nor max-pool: the blocks' own BN comes first.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

WIDTHS = (64, 128, 256, 512)
STRIDES = (1, 2, 2, 2)
BLOCKS_PER_STAGE = 2


def _bn(channels: int, track_stats: bool) -> nn.BatchNorm2d:
    # momentum None: running statistics, when kept, are cumulative averages (HeteroFL's static BN)
    return nn.BatchNorm2d(channels, momentum=None, track_running_stats=track_stats)


class PreActBlock(nn.Module):
    def __init__(self, in_channels: int, channels: int, stride: int, track_stats: bool):
        super().__init__()
        self.bn1 = _bn(in_channels, track_stats)
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False)
        self.bn2 = _bn(channels, track_stats)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        changes = stride != 1 or in_channels != channels
        self.shortcut = nn.Conv2d(in_channels, channels, 1, stride, bias=False) if changes else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(x))
        shortcut = x if self.shortcut is None else self.shortcut(out)
        return self.conv2(F.relu(self.bn2(self.conv1(out)))) + shortcut


class PreResNet(nn.Module):
    classifier_name = "fc"

    def __init__(
        self, num_classes: int, in_channels: int = 3, rate: float = 1.0, track_stats: bool = False, scale: float = 1.0
    ):
        super().__init__()
        widths = [math.ceil(rate * round(scale * c)) for c in WIDTHS]
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False)
        channels = widths[0]
        for stage, (width, stride) in enumerate(zip(widths, STRIDES, strict=True), start=1):
            blocks = [PreActBlock(channels, width, stride, track_stats)]
            blocks += [PreActBlock(width, width, 1, track_stats) for _ in range(BLOCKS_PER_STAGE - 1)]
            setattr(self, f"layer{stage}", nn.Sequential(*blocks))
            channels = width
        self.bn = _bn(channels, track_stats)
        self.fc = nn.Linear(channels, num_classes)
        for m in self.modules():  # BN keeps its default weight 1, bias 0; the linear layer its default
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer4(self.layer3(self.layer2(self.layer1(self.conv1(x)))))
        return torch.flatten(F.adaptive_avg_pool2d(F.relu(self.bn(x)), 1), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


def preresnet18(
    num_classes: int, in_channels: int = 3, rate: float = 1.0, track_stats: bool = False, scale: float = 1.0
) -> PreResNet:
    """`track_stats` False: batch statistics only, no BN buffers (training); True: cumulative running
    statistics, for HeteroFL's static-BN evaluation of the full model. `scale` multiplies the full
    model's channels before the rate cuts them (HeteroFL's `hidden_size`; CPU-sized runs)."""
    return PreResNet(num_classes, in_channels, rate, track_stats, scale)
