"""The ViT-S layer-splitting family (depth 8..12) built with timm; 224x224 inputs."""

from __future__ import annotations

import os
import re
from typing import Any

import torch
from timm.models.vision_transformer import VisionTransformer

from incofl.errors import ConfigError
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
        model.load_state_dict(_pretrained_state(pretrained, model), strict=False)
    return model


def _pretrained_state(path: str | os.PathLike, model: FamilyViT) -> dict[str, torch.Tensor]:
    """The file's entries of `model`, less the classifier head: every other entry must be there
    with its shape; the file may hold deeper blocks (dropped). Anything else is refused in one
    line naming the file and the keys: a file of another model would otherwise load nothing."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # missing, damaged, or a pickle of objects (never loaded)
        raise ConfigError(f"pretrained: {path}: not a readable state-dict file ({type(err).__name__})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"pretrained: {path}: not a state dict (a mapping of entry names to tensors)")
    fresh = ("head.", "proj.")  # the classifier and MOON's projection: always new
    ours = {k: v for k, v in model.state_dict().items() if not k.startswith(fresh)}
    deeper = re.compile(r"blocks\.(\d+)\.")
    unexpected = [
        k
        for k in state
        if k not in ours
        and not k.startswith(fresh)
        and not ((m := deeper.match(k)) and int(m.group(1)) >= len(model.blocks))
    ]
    problems = {
        "missing": [k for k in ours if k not in state],
        "unexpected": unexpected,
        "of another shape": [k for k in ours if k in state and state[k].shape != ours[k].shape],
    }
    found = [
        f"{len(keys)} {what} ({', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''})"
        for what, keys in problems.items()
        if keys
    ]
    if found:
        raise ConfigError(f"pretrained: {path}: not weights of this ViT, keys: {'; '.join(found)}")
    return {k: v for k, v in state.items() if k in ours}
