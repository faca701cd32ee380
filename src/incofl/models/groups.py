"""FedPart's layer groups (docs/methods.md, FedPart), read off a ResNet's module structure.

In module order, input to output: the stem (conv1 + bn1); per BasicBlock conv1 + bn1, conv2
+ bn2 and, where the block has one, its downsample conv + BN (torchvision registers it after
conv2); last the head: fc and, when MOON's projection head is built, `proj` with it (the
head is whatever maps the features to logits, so the group counts do not depend on MOON).
Each convolution opens a group and the BatchNorm registered right after it joins it, so no
list of layer names is written down here: a ResNet-8 has 10 groups, ResNet10 13, ResNet18 21
and ResNet26 29. The groups partition the model's parameters; `stats` are the floating-point
buffers of their modules (BN running mean and variance), which travel with the group.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn
from torchvision.models.resnet import ResNet

STEM, HEAD = "stem", "head"
_BLOCK_LAYER = re.compile(r"^(layer\d+)\.(\d+)\.(.+)$")  # stage, block index, layer within the block


@dataclass(frozen=True)
class LayerGroup:
    key: str  # "stem", "layer2.0.conv1", "layer2.0.downsample", "head"
    params: frozenset[str]  # parameter names
    stats: frozenset[str]  # floating-point buffers of the same modules (BN running statistics)


def _key(conv: str) -> str:
    """A conv's group name: the stem, or its path with a Sequential's index dropped (downsample.0)."""
    if "." not in conv:
        return STEM
    return conv.removesuffix(".0") if conv.endswith("downsample.0") else conv


def _entries(module: nn.Module, prefix: str) -> tuple[set[str], set[str]]:
    """(parameter names, floating-point buffer names) a module holds itself, with its path."""
    params = {f"{prefix}.{n}" for n, _ in module.named_parameters(recurse=False)}
    stats = {f"{prefix}.{n}" for n, b in module.named_buffers(recurse=False) if b.is_floating_point()}
    return params, stats


def layer_groups(model: nn.Module) -> list[LayerGroup]:
    """The model's FedPart layer groups, input to output; a ValueError for a model that is not a ResNet."""
    if not isinstance(model, ResNet):
        raise ValueError(f"FedPart layer groups are defined for ResNets only, not {type(model).__name__}")
    convs: list[tuple[str, set[str], set[str]]] = []  # (key, params, stats), in module order
    head: tuple[set[str], set[str]] = (set(), set())
    last = None  # the type of the previous module holding parameters
    for name, module in model.named_modules():
        params, stats = _entries(module, name)
        if not params:
            continue
        if isinstance(module, nn.Conv2d):
            convs.append((_key(name), params, stats))
        elif isinstance(module, nn.BatchNorm2d) and last is nn.Conv2d:
            convs[-1][1].update(params)
            convs[-1][2].update(stats)
        elif isinstance(module, nn.Linear):
            head[0].update(params)
            head[1].update(stats)
        else:
            raise ValueError(f"no FedPart layer group for {name} ({type(module).__name__})")
        last = type(module)
    # every module holding parameters joined exactly one group (or raised): they partition the parameters
    return [LayerGroup(key, frozenset(p), frozenset(s)) for key, p, s in [*convs, (HEAD, *head)]]


def counterpart(key: str, groups: list[LayerGroup]) -> LayerGroup:
    """The group of `groups` (a possibly shallower model's) that stands for a larger model's `key`:
    the same group if the model has it, else the same layer of the deepest earlier block of the
    same stage (stage splitting drops a stage's last blocks: ResNet10's `layer3.0.conv1` stands
    for ResNet26's `layer3.2.conv1`)."""
    by_key = {g.key: g for g in groups}
    if key in by_key:
        return by_key[key]
    match = _BLOCK_LAYER.match(key)
    if match:
        stage, block, layer = match.groups()
        for earlier in range(int(block) - 1, -1, -1):
            if f"{stage}.{earlier}.{layer}" in by_key:
                return by_key[f"{stage}.{earlier}.{layer}"]
    raise ValueError(f"no FedPart layer group stands for {key} in this model")
