"""What both sides of a run build alike from their record of its settings (incofl.sides): the
method and its typed parameters, and the run's models as its layout lays them out, seeded by the
run's seed (both sides start from the same weights). The server side's builder (server.py) lays
them out over the test split and the run's facts, the client side's (clients.py) over its
training data; the simulator calls both (simulator.py), a federation's server and each node one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from incofl.data.tensors import TensorSplit
from incofl.fl.contracts import Setup, SideSettings
from incofl.fl.stages.layout import Layout, LayoutInputs, keeps
from incofl.fl.stages.sampling import group_of
from incofl.models.family import build_model, input_size
from incofl.params import Params
from incofl.registry import METHODS, Method, layout_of

if TYPE_CHECKING:
    from incofl.fl.stages.clientstore import ClientStore


@dataclass(frozen=True)
class Shape:
    """What a model is built for: the data set's class count and channels, and its image side."""

    classes: int
    channels: int
    image_size: int

    def input_size(self, settings: SideSettings) -> int:
        """The side the run's models take images at (a ViT's, or `resize`)."""
        return input_size(settings.models[0], settings.resize or self.image_size)


@dataclass(frozen=True)
class LaidOut:
    """A side's method, its parameters and its layout (module docstring)."""

    settings: SideSettings
    method: Method
    hp: Params
    layout: Layout

    @property
    def models(self) -> list[nn.Module]:
        return self.layout.models

    def setup(self, store: ClientStore | None = None) -> Setup:
        """What the method's components on this side are built from (`store`: the client side's)."""
        aggregator = self.method.aggregator.cls
        server = list(self.layout.server_model.state_dict())
        return Setup(self.settings, server, self.layout, self.models, aggregator.federation, store)


def lay_out(
    settings: SideSettings,
    shape: Shape,
    device: torch.device,
    test: TensorSplit,
    pretrained: str | None,
    **inputs: Any,
) -> LaidOut:
    """The side's models, seeded by the run's seed, laid out as its model asks (fl/stages/layout.py)
    over `test` and the side's further `inputs` (LayoutInputs'); `pretrained`: the side's own file."""
    method = METHODS[settings.method]
    hp = method.parse_args(settings.method_args)
    model_kwargs = method.model_kwargs(hp)
    size = shape.input_size(settings)

    def build(name: str, **model_args: Any) -> nn.Module:
        model = build_model(
            name,
            shape.classes,
            shape.channels,
            stem=settings.stem,
            pretrained=pretrained,
            image_size=size,
            scale=settings.model_scale,
            **model_args,
            **model_kwargs,
        ).to(device)
        return model.to(memory_format=torch.channels_last) if settings.channels_last else model

    torch.manual_seed(settings.seed)  # the models' initialisation
    groups = [group_of(c, settings.clients, settings.groups) for c in range(settings.clients)]
    layout = layout_of(settings).cls(LayoutInputs(settings, build, size, test, groups, keeps(settings), **inputs))
    return LaidOut(settings, method, hp, layout)
