"""The ViT-S layer-splitting family (depth 8..12) built with timm; 224x224 inputs."""

from __future__ import annotations

import os
from typing import Any

import torch
from timm.models.vision_transformer import VisionTransformer

from incofl.models.projection import Projectable

DEPTHS = {f"vit_d{d}": d for d in range(8, 13)}


class FamilyViT(Projectable, VisionTransformer):
    """ViT-S/16 with a `features` method (the pre-logits token) and an optional MOON projection
    head; `forward` = head(features(x)), timm's forward without attention masks."""

    classifier_name = "head"

    def __init__(self, projection_dim: int | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.add_projection(projection_dim)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 1:  # grey images as three equal channels, as the authors' code does
            x = x.expand(-1, 3, -1, -1)
        return self.forward_head(self.forward_features(x), pre_logits=True)


def vit(
    name: str,
    num_classes: int,
    in_channels: int = 3,
    pretrained: str | os.PathLike | None = None,
    img_size: int = 224,
    projection_dim: int | None = None,
) -> FamilyViT:
    """A ViT-S of the named depth; `pretrained` is a local state-dict file (no hub at run time):
    its blocks beyond this depth and its classifier head are dropped (fresh head). The patch
    embedding always takes 3 channels; `in_channels` 1 (grey) is copied to 3 in `features`."""
    model = FamilyViT(
        img_size=img_size,
        patch_size=16,
        embed_dim=384,
        depth=DEPTHS[name],
        num_heads=6,
        in_chans=3,  # grey inputs are expanded in `features`, so RGB pretrained weights fit
        num_classes=num_classes,
        projection_dim=projection_dim,
    )
    if pretrained:
        state = torch.load(pretrained, map_location="cpu", weights_only=True)
        state = {k: v for k, v in state.items() if k in model.state_dict() and not k.startswith("head.")}
        model.load_state_dict(state, strict=False)
    return model
