"""ScaleFL's CIFAR ResNet-110 with three early exits, cut in width and depth (docs/methods.md, hetero splitting).

Read from ScaleFL's release (git-disl/scale-fl, models/resnet.py and config.py): three stages
of 18 post-activation BasicBlocks of int(16 s), int(32 s), int(64 s) channels for a width s;
exits after the 30th, 38th and 46th block (`ee_layer_locations` [30, 38, 46]), each three
[3x3 conv, BN, ReLU] at the block's width, a global average pool and a linear layer; the final
classifier is a bare pool + linear. BN uses batch statistics (no running buffers), and layers
keep PyTorch's default initialisation, as in the release.

Level k (1..4) holds exactly what exit k needs: the blocks up to exit k and exits 1..k (level
4: every block, the three exits and `fc`). The release builds every level at full depth and
stops the forward at exit k; here the unused blocks are absent, so a level's state-dict names
are a subset of every deeper level's and its entries are leading channel slices of them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

WIDTHS = (16, 32, 64)
STRIDES = (1, 2, 2)
STAGE_BLOCKS = 18
EXIT_AFTER = (30, 38, 46)  # 1-based block counts: stage 2 block 12, stage 3 blocks 2 and 10
EXIT_CONVS = 3
LEVELS = len(EXIT_AFTER) + 1


def _bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, track_running_stats=False)


class BasicBlock(nn.Module):
    def __init__(self, in_channels: int, channels: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False)
        self.bn1 = _bn(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = _bn(channels)
        changes = stride != 1 or in_channels != channels
        shortcut = (nn.Conv2d(in_channels, channels, 1, stride, bias=False), _bn(channels)) if changes else ()
        self.shortcut = nn.Sequential(*shortcut)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(out + self.shortcut(x))


class Exit(nn.Module):
    """An early classifier: EXIT_CONVS x [3x3 conv C->C without bias, BN, ReLU], pool, linear."""

    def __init__(self, channels: int, num_classes: int):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(channels, channels, 3, 1, 1, bias=False) for _ in range(EXIT_CONVS))
        self.bns = nn.ModuleList(_bn(channels) for _ in range(EXIT_CONVS))
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv, bn in zip(self.convs, self.bns, strict=True):
            x = F.relu(bn(conv(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class ExitResNet(nn.Module):
    def __init__(
        self, num_classes: int, in_channels: int = 3, width: float = 1.0, exits: int = LEVELS, scale: float = 1.0
    ):
        super().__init__()
        if not 1 <= exits <= LEVELS:
            raise ValueError(f"exits must be in 1..{LEVELS}, got {exits}")
        widths = [int(round(scale * c) * width) for c in WIDTHS]
        depth = EXIT_AFTER[exits - 1] if exits < LEVELS else len(WIDTHS) * STAGE_BLOCKS
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False)
        self.bn1 = _bn(widths[0])
        self.stages = -(-depth // STAGE_BLOCKS)  # the last one may be cut short
        channels = widths[0]
        for stage, (w, stride) in enumerate(zip(widths[: self.stages], STRIDES, strict=False)):
            count = min(STAGE_BLOCKS, depth - stage * STAGE_BLOCKS)
            blocks = [BasicBlock(channels, w, stride)] + [BasicBlock(w, w, 1) for _ in range(count - 1)]
            setattr(self, f"layer{stage + 1}", nn.Sequential(*blocks))
            channels = w
        self.exit_after = EXIT_AFTER[:exits]
        self.exits = nn.ModuleList(Exit(widths[(b - 1) // STAGE_BLOCKS], num_classes) for b in self.exit_after)
        self.fc = nn.Linear(channels, num_classes) if exits == LEVELS else None
        self.outputs = len(self.exit_after) + (self.fc is not None)  # the logits `forward` returns

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Logits of every exit the model has, shallowest first; the last is the deepest."""
        x = F.relu(self.bn1(self.conv1(x)))
        logits, done = [], 0
        for stage in range(1, self.stages + 1):
            for block in getattr(self, f"layer{stage}"):
                x = block(x)
                done += 1
                if done in self.exit_after:
                    logits.append(self.exits[self.exit_after.index(done)](x))
        if self.fc is not None:
            logits.append(self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)))
        return logits


def resnet110(
    num_classes: int, in_channels: int = 3, width: float = 1.0, exits: int = LEVELS, scale: float = 1.0
) -> ExitResNet:
    """ScaleFL's level (width, exits): the release's four are (0.7, 1), (0.7, 2), (0.75, 3), (1, 4).
    `scale` multiplies the full model's channels before the width cuts them (CPU-sized runs)."""
    return ExitResNet(num_classes, in_channels, width, exits, scale)
