"""The ResNet stage-splitting family (the InCo paper's nested models), built on torchvision's ResNet.

Smaller members are name-subsets of larger ones: ResNet10/14/18/22/26 differ only in the
number of BasicBlocks per stage, so `layer3.2.conv1.weight` exists only from ResNet22 up.
ResNet-8 (FedPart's poster model) has three stages, 64-128-256, and a
classifier on 256 features: it is not nested with the others (its `fc` is narrower).
`scale` (the config's `model_scale`) multiplies every stage's width, for CPU-sized runs: the
members stay nested, since each stage is thinned alike.
"""

from __future__ import annotations

import torch
from torch import nn
from torchvision.models.resnet import BasicBlock, ResNet

from incofl.models.projection import Projectable

WIDTHS = (64, 128, 256, 512)  # torchvision's stage widths

BLOCKS = {
    "resnet8": [1, 1, 1],
    "resnet10": [1, 1, 1, 1],
    "resnet14": [1, 1, 2, 2],
    "resnet18": [2, 2, 2, 2],
    "resnet22": [2, 2, 3, 3],
    "resnet26": [3, 3, 3, 3],
}


class FamilyResNet(Projectable, ResNet):
    """torchvision's ResNet with a choice of stem, a `features` method (penultimate layer) and
    an optional MOON projection head (`projection_dim`)."""

    classifier_name = "fc"

    def __init__(
        self,
        blocks: list[int],
        num_classes: int,
        in_channels: int = 3,
        stem: str = "imagenet",
        projection_dim: int | None = None,
        scale: float = 1.0,
    ):
        # torchvision always builds four stages: a three-stage model drops a one-block fourth
        super().__init__(BasicBlock, [*blocks, 1][:4], num_classes=num_classes)
        if scale != 1.0:
            self._thin(blocks, scale)
        width = self.bn1.num_features
        if len(blocks) == 3:  # the classifier reads layer3's channels
            self.layer4 = nn.Identity()
            self.fc = nn.Linear(self.layer3[-1].bn2.num_features, num_classes)
        if stem == "cifar":  # 3x3 stride-1 stem without max-pool, for 32x32 inputs
            self.conv1 = nn.Conv2d(in_channels, width, 3, 1, 1, bias=False)
            self.maxpool = nn.Identity()
        elif in_channels != 3 or scale != 1.0:
            self.conv1 = nn.Conv2d(in_channels, width, 7, 2, 3, bias=False)
        if stem == "cifar" or in_channels != 3 or scale != 1.0:  # a new conv is initialised like torchvision's
            nn.init.kaiming_normal_(self.conv1.weight, mode="fan_out", nonlinearity="relu")
        self.add_projection(projection_dim)

    def _thin(self, blocks: list[int], scale: float) -> None:
        """The same stages at `scale` x torchvision's widths (new modules, initialised as torchvision
        initialises its own); the stem's conv is replaced by the caller."""
        widths = [max(1, round(scale * w)) for w in WIDTHS]
        self.inplanes = widths[0]
        self.bn1 = nn.BatchNorm2d(widths[0])
        stages = [
            self._make_layer(BasicBlock, w, n, stride=1 if i == 0 else 2)
            for i, (w, n) in enumerate(zip(widths, [*blocks, 1][:4], strict=True))
        ]
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(widths[3], self.fc.out_features)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return torch.flatten(self.avgpool(x), 1)


def resnet(
    name: str,
    num_classes: int,
    in_channels: int = 3,
    stem: str = "imagenet",
    projection_dim: int | None = None,
    scale: float = 1.0,
) -> FamilyResNet:
    return FamilyResNet(BLOCKS[name], num_classes, in_channels, stem, projection_dim, scale)
