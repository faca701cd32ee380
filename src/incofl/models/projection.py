"""MOON's optional projection head, shared by the model families.

MOON (Li, He & Song, CVPR 2021; its code's `ModelFedCon`) puts a two-layer head between the
encoder and the classifier: h = features(x), z = l2(relu(l1(h))) with l1: feat -> feat and
l2: feat -> projection_dim, and the classifier reads z. Models built without a projection
dimension have no `proj` entries and the plain classifier on h, so every other method's
state-dict names and shapes are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class Projectable:
    """Mixin for an `nn.Module` with `features(x)` and a final linear layer named `classifier_name`."""

    classifier_name: str
    proj: nn.Module | None
    features: Callable[[torch.Tensor], torch.Tensor]

    def add_projection(self, dim: int | None) -> None:
        """Insert the head (dim > 0) and re-size the classifier to read z; call at the end of __init__."""
        head: nn.Linear = getattr(self, self.classifier_name)
        if not dim:
            self.proj = None
            return
        width = head.in_features
        self.proj = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, dim))
        setattr(self, self.classifier_name, nn.Linear(dim, head.out_features))

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The representation the classifier reads: MOON's z with a head, else the features."""
        h = self.features(x)
        return h if self.proj is None else self.proj(h)

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.classifier_name)(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.embed(x))
