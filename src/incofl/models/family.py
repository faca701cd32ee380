"""Model groups: group g -> architecture; the server model is the largest one."""

from __future__ import annotations

import torch
from torch import nn

from incofl.models.cnn import CNNS, cnn
from incofl.models.preresnet import preresnet18
from incofl.models.resnet import BLOCKS, resnet
from incofl.models.resnet110 import resnet110
from incofl.models.vit import DEPTHS, vit

VIT_INPUT = 224


def build_model(
    name: str,
    num_classes: int,
    in_channels: int,
    *,
    stem: str = "imagenet",
    pretrained: str | None = None,
    image_size: int = 32,
    projection_dim: int | None = None,
    rate: float = 1.0,
    exits: int | None = None,
    track_stats: bool = False,
    scale: float = 1.0,
) -> nn.Module:
    """`projection_dim` adds MOON's projection head (models/projection.py). `image_size` is the
    side of the images the model takes (ViTs: 224; cnn20: its fc1 width depends on it); `stem`
    is the ResNets', `pretrained` the ViTs'. Width models (docs/methods.md, hetero splitting): `rate` cuts the
    width, `exits` the depth (resnet110), `track_stats` gives preresnet18 BN running statistics
    (static BN at evaluation), `scale` thins the full model itself (`model_scale`; also the
    depth family's ResNets)."""
    if name == "preresnet18":
        return preresnet18(num_classes, in_channels, rate=rate, track_stats=track_stats, scale=scale)
    if name == "resnet110":
        return resnet110(num_classes, in_channels, width=rate, exits=exits or 4, scale=scale)
    if name in BLOCKS:
        return resnet(name, num_classes, in_channels, stem, projection_dim, scale)
    if name in CNNS:
        return cnn(name, num_classes, in_channels, image_size, projection_dim)
    if name in DEPTHS:
        return vit(name, num_classes, in_channels, pretrained, img_size=image_size, projection_dim=projection_dim)
    raise ValueError(f"unknown model {name!r}")


def exit_logits(output: torch.Tensor | list[torch.Tensor]) -> list[torch.Tensor]:
    """Every exit's logits of a model's output: resnet110 returns one per exit, the others one."""
    return output if isinstance(output, list) else [output]


def exit_count(model: nn.Module) -> int:
    """How many exits a model's output has (exit_logits): resnet110's levels say, the others have one."""
    return int(getattr(model, "outputs", 1))


def input_size(name: str, image_size: int) -> int:
    """The side of the images a model family takes: ViTs 224 (images are resized), ResNets and
    cnn20 the data's (after `resize`)."""
    return VIT_INPUT if name in DEPTHS else image_size


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def check_nested(models: list[nn.Module]) -> int:
    """Index of the server model: the one whose state names and shapes contain every other's."""
    server = max(range(len(models)), key=lambda i: len(models[i].state_dict()))
    big = models[server].state_dict()
    for model in models:
        for name, tensor in model.state_dict().items():
            if name not in big or big[name].shape != tensor.shape:
                raise ValueError(
                    f"model groups are not nested: {name} {tuple(tensor.shape)} is not in the server model"
                )
    return server
