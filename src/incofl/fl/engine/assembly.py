"""What both sides of a run are built on, in one downward pass: the data on the run's device,
each client's share and the facts of it the server side reads (data/facts.py), the models as the
run's layout lays them out, and the method's typed parameters. The server side (server.py) and
the client side (clients.py) are each built from an `Assembly`; the simulator builds one and
hands it to both, a federation's server and each of its nodes build their own (the server from
the facts and the test split, a node from its client's data alone).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from incofl.config import RunConfig
from incofl.data.augment import resolve_augment
from incofl.data.dataset import ImageDataset
from incofl.data.facts import Facts, shares
from incofl.data.partition import Partition
from incofl.data.tensors import TensorSplit, to_device
from incofl.fl.contracts import Setup, StageSettings
from incofl.fl.stages.clientstore import ClientStore
from incofl.fl.stages.layout import Layout, LayoutInputs, LayoutSettings, keeps
from incofl.fl.stages.sampling import group_of
from incofl.models.family import build_model, input_size
from incofl.params import Params
from incofl.registry import METHODS, Method, layout_of


@dataclass
class Assembly:
    """A run's data, shares, models (its layout's) and method, on its device (module docstring)."""

    cfg: RunConfig
    device: torch.device
    parts: list[np.ndarray]  # each client's training indices (with `holdout`, less its held-out share)
    held_out: list[np.ndarray] | None  # each client's held-out indices (holdout > 0)
    facts: Facts  # all the server side reads of the data (data/facts.py)
    train_data: TensorSplit
    test_data: TensorSplit
    layout: Layout
    method: Method
    hp: Params

    @property
    def models(self) -> list[nn.Module]:
        return self.layout.models

    def setup(self, store: ClientStore | None = None) -> Setup:
        """What the method's components are built from (`store`: the client side's, for its objective)."""
        aggregator = self.method.aggregator.cls
        server = list(self.layout.server_model.state_dict())
        return Setup(StageSettings.of(self.cfg), server, self.layout, self.models, aggregator.federation, store)


def assemble(
    cfg: RunConfig, data: ImageDataset, partition: Partition, device: torch.device, facts: Facts | None = None
) -> Assembly:
    """The data (each client's share and its facts, the splits on the device in the models' input
    size, with the augmentation they train with), then the models, seeded by the run's seed (laid
    out as the run's model asks: fl/stages/layout.py), then the method's parameters. `facts`: the
    run's, where `data` holds no training sample (a federation's server); else derived here."""
    if len(partition.parts) != cfg.clients:
        raise ValueError(f"partition has {len(partition.parts)} clients, config has clients={cfg.clients}")
    parts, held_out, derived = shares(data, partition, cfg.holdout, cfg.partition_seed, cfg.normalize)
    facts = facts or derived
    size = input_size(cfg.models[0], cfg.resize or data.image_size)
    aug = resolve_augment(cfg.augment, cfg.dataset, model=cfg.models[0], cutout=cfg.cutout, pad_fill=cfg.pad_fill)
    train_data, test_data = to_device(data, device, size, aug, cfg.normalize)
    method = METHODS[cfg.method]
    hp = method.parse_args(cfg.method_args)
    model_kwargs = method.model_kwargs(hp)

    def build(name: str, **model_args: Any) -> nn.Module:
        model = build_model(
            name,
            data.num_classes,
            data.channels,
            stem=cfg.stem,
            pretrained=cfg.pretrained,
            image_size=size,
            scale=cfg.model_scale,
            **model_args,
            **model_kwargs,
        ).to(device)
        return model.to(memory_format=torch.channels_last) if cfg.channels_last else model

    torch.manual_seed(cfg.seed)  # the models' initialisation
    groups = [group_of(c, cfg.clients, cfg.groups) for c in range(cfg.clients)]
    inputs = LayoutInputs(
        LayoutSettings.of(cfg), build, size, train_data, test_data, parts, held_out, groups, facts, keeps(cfg)
    )
    layout = layout_of(cfg).cls(inputs)
    return Assembly(cfg, device, parts, held_out, facts, train_data, test_data, layout, method, hp)
