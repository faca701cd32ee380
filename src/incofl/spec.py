"""What a method is: its stage components (`Component`) and their composition (`Method`), and
the generic stages' components every method family builds on (docs/add-a-method.md).

A family declares its methods in its torch-free `fl/methods/<family>/spec.py`, which the
registry (registry.py) collects. A component is named by where its class lives and imported
only when a run is built (`Component.cls`); it declares here what validating a config needs of
it: its parameters and what it requires of the run (a personal model per client, ResNet layer
groups, width models, early exits). So a config, a workflow's dry run and the report commands
are checked without importing torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from incofl.models.names import EXIT_MODEL, EXITS, LAYER_GROUP_MODELS, WIDTH_MODELS
from incofl.params import AggregationParams, Params, combine, parse

if TYPE_CHECKING:
    from incofl.config import Settings


@dataclass(frozen=True)
class Component:
    """A stage component: its class (`"module:Class"`, imported on first use, or the class
    itself for one defined in a Python session), its typed parameters, and what it requires.
    The flags are the planner's (`personal`, `layer_groups`, `width`) or the objective's (`exits`).
    tests/test_registry.py imports every registered component's class, so a reference that no
    longer names its class fails there, not in a user's run."""

    code: str | type
    params: type[Params] = Params
    personal: bool = False  # keeps a personal model on each client, scored on its held-out share
    layer_groups: bool = False  # plans over the ResNet layer groups of models/groups.py (FedPart)
    width: bool = False  # trains models cut in width, and in depth (width models only)
    exits: bool = False  # its loss reads every early exit (ScaleFL: resnet110)
    # parameters renamed since runs were made: old name -> (new name, old value -> new value)
    renamed: dict[str, tuple[str, dict[Any, Any]]] = field(default_factory=dict, hash=False)

    @cached_property
    def cls(self) -> type:
        """The component's class (imports its module, and torch with it)."""
        if isinstance(self.code, type):
            return self.code
        module, name = self.code.split(":")
        return getattr(importlib.import_module(module), name)

    @property
    def name(self) -> str:
        return self.code.__name__ if isinstance(self.code, type) else self.code.split(":")[1]


# The generic stages' components, which every family's methods build on
CE = Component("incofl.fl.stages.objective:Objective")  # FedAvg's local cross-entropy
GROUPWISE = Component("incofl.fl.stages.aggregate:GroupWise", AggregationParams)
SHARED = Component("incofl.fl.stages.aggregate:Shared", AggregationParams)
FULL = Component("incofl.fl.stages.plan:FullPlanner")
# The layouts: how the models are built, started from and evaluated (`incofl.registry.layout_of`)
GROUPS = Component("incofl.fl.stages.layout:GroupLayout")  # one whole model per model group
WIDTH_LAYOUT = Component("incofl.fl.methods.width.levels:WidthLayout")  # one model cut in width, a level per group
# The source of a method whose aggregation is group-wise, as in the InCo paper's baselines
GROUPWISE_SOURCE = "; groupwise as in Chan et al., ICLR 2024"


@dataclass(frozen=True)
class Method:
    name: str
    objective: Component = CE
    aggregator: Component = GROUPWISE
    pre: tuple[Component, ...] = ()  # transforms of the client updates, before aggregation
    post: tuple[Component, ...] = ()  # transforms of each averaged update, after it
    observers: tuple[Component, ...] = ()
    planner: Component = FULL
    base: str | None = None
    defaults: dict[str, Any] = field(default_factory=dict)  # this method's values of component parameters
    source: str = ""

    @cached_property
    def params(self) -> type[Params]:
        """The typed model of this method's `method_args`: every component's parameters."""
        return combine(self.name, [(c.name, c.params) for c in self._components], self.defaults)

    def parse_args(self, args: dict[str, Any]) -> Params:
        """Validated `method_args`; a bad name or value is a ValueError naming `method_args.<key>`."""
        return parse(self.params, self.name, self.migrate(args))

    def migrate(self, args: dict[str, Any]) -> dict[str, Any]:
        """`args` with the parameters its components renamed under their new names (a config, a
        summary.json or a checkpoint written before the rename); an old value with no new one
        is left under its old name, which parse_args then refuses."""
        out = dict(args)
        for component in self._components:
            for old, (new, values) in component.renamed.items():
                if old in out and new not in out and out[old] in values:
                    out[new] = values[out.pop(old)]
        return out

    @property
    def _components(self) -> list[Component]:
        return [self.objective, self.aggregator, *self.pre, *self.post, self.planner]

    @property
    def width(self) -> bool:
        """Trains models cut in width (and depth): HeteroFL, FedRolex, ScaleFL (fl/methods/width/)."""
        return self.planner.width

    @property
    def partial(self) -> bool:
        """Trains one layer group in most rounds (FedPart's schedule)."""
        return self.planner.layer_groups

    def model_kwargs(self, hp: Params) -> dict[str, Any]:
        """The objective's model-building parameters (MOON's projection_dim) for `build_model`."""
        return {name: getattr(hp, name) for name in self.objective.cls.client.model_args}

    def check(self, settings: Settings) -> None:
        """Settings this method cannot run with, as a ValueError naming the key: personal methods
        need `holdout`; layer groups are defined for ResNets; width methods need a width model
        (ScaleFL resnet110, the others preresnet18) and other methods uncut levels; the batched
        trainer trains only objectives it can batch (fl/stages/batched.py: the only check that imports
        the objective's code)."""
        name, model = self.name, settings.models[0]
        if self.planner.personal and not settings.holdout:
            # without it, the first client's personal model would be reported on the global test set
            raise ValueError(
                f"holdout: {name} keeps a personal model on each client, tested on that client's "
                "held-out share: set holdout (FedLAG's: 0.25)"
            )
        if self.partial and model not in LAYER_GROUP_MODELS:
            raise ValueError(f"models: {name}'s layer groups are defined for ResNets, not {model}")
        if self.width and model not in WIDTH_MODELS:
            raise ValueError(f"models: {name} cuts a model in width; use one of {', '.join(WIDTH_MODELS)}")
        exits = self.objective.exits  # its loss reads every exit; the other width methods' one output
        if self.width and exits != (model == EXIT_MODEL):
            raise ValueError(f"models: {name} trains {f'{EXIT_MODEL} (early exits)' if exits else 'preresnet18'}")
        if self.width and settings.holdout:
            raise ValueError(f"holdout: personal accuracy is not defined for {name}'s width levels")
        cut = settings.levels and any(rate < 1 or deepest not in (None, EXITS) for rate, deepest in settings.levels)
        if cut and not self.width:
            raise ValueError(
                f"width_rates: {name} trains whole models; cut ones need a width method "
                "(HeteroFL, FedRolex, ScaleFL, or their InCo)"
            )
        if settings.trainer == "batched" and not self.objective.cls.client.batchable():
            raise ValueError(
                f"trainer: batched cannot train {name} (its {self.objective.name} objective has "
                "session hooks of its own); use trainer: serial"
            )
        if settings.cuda_graphs and not self.objective.cls.client.capturable():
            raise ValueError(
                f"cuda_graphs: {name}'s {self.objective.name} objective has session hooks of its own, which a "
                "CUDA graph cannot replay; train it without cuda_graphs"
            )
