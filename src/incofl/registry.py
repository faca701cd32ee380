"""The method registry: a name -> the components of its round's stages, what they take and what
they need.

A method is one entry: its local objective (train), its aggregator (aggregate), transforms
before aggregation (FedNova's normalisation) and after it (InCo), extra observers (InCo's
theta/beta log), its planner, the method its table row is compared with (`base`), and its
own defaults for the components' typed parameters (`params.py`). See docs/add-a-method.md.

The registry imports no training code: each component is named by where its class lives and
imported only when a run is built (`Component.cls`), and declares here what validating a config
needs of it: its parameters and what it requires of the run (a personal model per client, ResNet
layer groups, width models, early exits). So a config, a workflow's dry run and the report
commands are checked without importing torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from incofl.models.names import EXIT_MODEL, EXITS, LAYER_GROUP_MODELS, WIDTH_MODELS
from incofl.params import (
    AggregationParams,
    ExitParams,
    InCoParams,
    LagParams,
    MaskedParams,
    MoonParams,
    NovaParams,
    Params,
    PartParams,
    ProxParams,
    RolexParams,
    ScaffoldParams,
    SlicedParams,
    WidthParams,
    combine,
    parse,
)

if TYPE_CHECKING:
    from incofl.config import Settings


@dataclass(frozen=True)
class Component:
    """A stage component: its class (`"module:Class"`, imported on first use, or the class
    itself for one defined in a Python session), its typed parameters, and what it requires.
    The flags are the planner's (`personal`, `layer_groups`, `width`) or the objective's (`exits`)."""

    code: str | type
    params: type[Params] = Params
    personal: bool = False  # keeps a personal model on each client, scored on its held-out share
    layer_groups: bool = False  # plans over the ResNet layer groups of models/groups.py (FedPart)
    width: bool = False  # trains models cut in width, and in depth (width models only)
    exits: bool = False  # its loss reads every early exit (ScaleFL: resnet110)

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


# The components of the registered methods, by stage
CE = Component("incofl.fl.stages.local:Objective")  # FedAvg's local cross-entropy
PROX = Component("incofl.fl.methods.objectives:FedProx", ProxParams)
SCAFFOLD = Component("incofl.fl.methods.objectives:Scaffold", ScaffoldParams)
MOON = Component("incofl.fl.methods.objectives:Moon", MoonParams)
MASKED = Component("incofl.fl.methods.width.masked:MaskedCE", MaskedParams)
EXIT_LOSS = Component("incofl.fl.methods.width.exits:ExitLoss", ExitParams, exits=True)
GROUPWISE = Component("incofl.fl.stages.aggregate:GroupWise", AggregationParams)
SHARED = Component("incofl.fl.stages.aggregate:Shared", AggregationParams)
SLICED = Component("incofl.fl.methods.width.aggregate:SlicedMean", SlicedParams)
ROLEX = Component("incofl.fl.methods.width.aggregate:RolexMean", RolexParams)
NOVA = Component("incofl.fl.methods.fednova:NovaNormalize", NovaParams)
INCO = Component("incofl.fl.methods.inco:InCoStep", InCoParams)
INCO_LOG = Component("incofl.fl.methods.inco:InCoLog")
FULL = Component("incofl.fl.stages.plan:FullPlanner")
PART = Component("incofl.fl.methods.fedpart:PartPlanner", PartParams, layer_groups=True)
LOCAL = Component("incofl.fl.methods.personal:LocalPlanner", personal=True)
FEDPER = Component("incofl.fl.methods.personal:FedPerPlanner", personal=True)
LAG = Component("incofl.fl.methods.personal:LagPlanner", LagParams, personal=True)
WIDTH = Component("incofl.fl.methods.width.levels:WidthPlanner", WidthParams, width=True)
# The layouts: how the models are built, started from and evaluated (`layout_of`)
GROUPS = Component("incofl.fl.stages.layout:GroupLayout")  # one whole model per model group
WIDTH_LAYOUT = Component("incofl.fl.methods.width.levels:WidthLayout")  # one model cut in width, a level per group


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
        components = [self.objective, self.aggregator, *self.pre, *self.post, self.planner]
        return combine(self.name, [c.params for c in components], self.defaults)

    def parse_args(self, args: dict[str, Any]) -> Params:
        """Validated `method_args`; a bad name or value is a ValueError naming `method_args.<key>`."""
        return parse(self.params, self.name, args)

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
        return {name: getattr(hp, name) for name in self.objective.cls.model_args}

    def check(self, settings: Settings) -> None:
        """Settings this method cannot run with, as a ValueError naming the key: personal methods
        need `holdout`; layer groups are defined for ResNets; width methods need a width model
        (ScaleFL resnet110, the others preresnet18) and other methods uncut levels; the batched
        trainer trains only objectives it can batch (fl/stages/batched.py: the only check that imports
        the objective's code)."""
        name, model = self.name, settings.models[0]
        if self.planner.personal and not settings.holdout:
            # without it, the first client's personal model would be reported on the global test set
            raise ValueError(f"holdout: {name} keeps a personal model on each client, tested on that client's "
                             "held-out share: set holdout (FedLAG's: 0.25)")  # fmt: skip
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
            raise ValueError(f"width_rates: {name} trains whole models; cut ones need a width method "
                             "(HeteroFL, FedRolex, ScaleFL, or their InCo)")  # fmt: skip
        if settings.trainer == "batched" and not self.objective.cls.batchable():
            raise ValueError(f"trainer: batched cannot train {name} (its {self.objective.name} objective has "
                             "session hooks of its own); use trainer: serial")  # fmt: skip


def _inco(name: str, base: str, source: str, objective: Component = CE, aggregator: Component = SHARED,
          **kw: Any) -> Method:  # fmt: skip
    """HeteroAvg (or width splitting's per-element mean) over the shared global state, then the
    InCo step, with its theta/beta log."""
    return Method(name, objective, aggregator, post=(INCO,), observers=(INCO_LOG,), base=base, source=source, **kw)


def _width(name: str, source: str, inco: str | None = None, aggregator: Component = SLICED, **kw: Any) -> Method:
    """A width-splitting method (fl/methods/width/), or with `inco` (its base's name) the InCo step after it."""
    if inco:
        return _inco(name, inco, _PAPER + "; " + source, aggregator=aggregator, planner=WIDTH, **kw)
    return Method(name, aggregator=aggregator, planner=WIDTH, source=source, **kw)


_PAPER = "Chan et al., ICLR 2024"
_GROUPWISE = "; groupwise as in " + _PAPER
_PROX = "Li et al., MLSys 2020 (FedProx)"
_SCAFFOLD = "Karimireddy et al., ICML 2020 (SCAFFOLD, option II)"  # plain mean over S, its Algorithm 1
_NOVA = "Wang et al., NeurIPS 2020 (FedNova)"  # sample-weighted: p_i = n_i / sum n
_MOON = "Li, He & Song, CVPR 2021 (MOON)"
_PART = "Wang et al., NeurIPS 2024 (FedPart, partial network updates)"
_LAG = "FedLAG, arXiv 2410.02845 (layer-wise personalisation by gradient conflict)"
_HETEROFL = "Diao et al., ICLR 2021 (HeteroFL: leading channels)"
_ROLEX = "Alam et al., NeurIPS 2022 (FedRolex: rolling sub-models)"
_SCALEFL = "Ilhan et al., CVPR 2023 (ScaleFL: width and depth, early exits)"
_ROLLING = {"rolling": True}
_EXITS = {"class_rows": False}  # ScaleFL averages classifier rows like any element
_REGISTRY = [
    Method("FedAvg", source="McMahan et al. 2017" + _GROUPWISE),
    Method("FedProx", PROX, source=_PROX + _GROUPWISE),
    Method("SCAFFOLD", SCAFFOLD, source=_SCAFFOLD + _GROUPWISE),
    Method("FedNova", pre=(NOVA,), defaults={"weighted": True}, source=_NOVA + _GROUPWISE),
    Method("MOON", MOON, source=_MOON + _GROUPWISE),
    Method("HeteroAvg", aggregator=SHARED, source=_PAPER),
    _inco("InCoAvg", "FedAvg", _PAPER),
    _inco("InCoProx", "FedProx", _PAPER + "; " + _PROX, PROX),
    _inco("InCoScaffold", "SCAFFOLD", _PAPER + "; " + _SCAFFOLD, SCAFFOLD),
    _inco("InCoNova", "FedNova", _PAPER + "; " + _NOVA, pre=(NOVA,), defaults={"weighted": True}),
    _inco("InCoMOON", "MOON", _PAPER + "; " + _MOON, MOON),
    _inco("InCoAvg-noNorm", "FedAvg", _PAPER + ", Fig. 8", defaults={"normalize": False}),
    _inco("InCoAvg-noOpt", "FedAvg", _PAPER + ", Fig. 8", defaults={"optimize": False}),
    _inco("InCoAvg-noNormOpt", "FedAvg", _PAPER + ", Fig. 8", defaults={"normalize": False, "optimize": False}),
    _inco("InCoAvg-paper", "FedAvg", _PAPER + ", Algorithm 1", defaults={"variant": "paper"}),
    _inco(
        "InCoAvg-projection", "FedAvg", _PAPER + ", Theorem 3.1", defaults={"variant": "paper", "mode": "projection"}
    ),
    # compared with full updates of the same objective over the same rounds (the poster's "FNU")
    Method("FedPart", planner=PART, base="FedAvg", source=_PART + "; groupwise"),
    Method("FedPartProx", PROX, planner=PART, base="FedProx", source=_PART + "; " + _PROX),
    Method("FedPartMOON", MOON, planner=PART, base="MOON", source=_PART + "; " + _MOON),
    _inco("InCoPart", "FedPart", _PAPER + "; " + _PART, planner=PART),
    # personalised: each client keeps part of its model (measure with `holdout`, personal accuracy)
    Method("Local", planner=LOCAL, source="local training only (FedLAG's baseline)"),
    Method(
        "FedPer",
        planner=FEDPER,
        base="FedAvg",
        defaults={"weighted": True},
        source="Arivazhagan et al. 2019 (FedPer: personal head); sample-weighted",
    ),  # fmt: skip
    Method("FedLAG", planner=LAG, base="FedAvg", defaults={"weighted": True}, source=_LAG + "; sample-weighted"),
    # width (and depth) splitting, the InCo paper's "hetero splitting" (its Fig. 5c)
    _width("HeteroFL", _HETEROFL, objective=MASKED),
    _width("FedRolex", _ROLEX, aggregator=ROLEX, objective=MASKED, defaults=_ROLLING),
    _width("ScaleFL", _SCALEFL, objective=EXIT_LOSS, defaults=_EXITS),
    _width("InCoHeteroFL", _HETEROFL, inco="HeteroFL", objective=MASKED),
    _width("InCoRolex", _ROLEX, inco="FedRolex", aggregator=ROLEX, objective=MASKED, defaults=_ROLLING),
    _width("InCoScaleFL", _SCALEFL, inco="ScaleFL", objective=EXIT_LOSS, defaults=_EXITS),
]
METHODS: dict[str, Method] = {m.name: m for m in _REGISTRY}


def register(method: Method) -> Method:
    """Add a method (used by modules that define new components)."""
    METHODS[method.name] = method
    return method


def layout_of(settings: Settings) -> Component:
    """The layout of a run's models, which follows its model: a width model (preresnet18,
    resnet110) in width levels, under a whole-model method too (uncut then: Method.check refuses
    cut levels), so that it is scored as a width model is (its BN rule at evaluation); every other
    model one per model group."""
    return WIDTH_LAYOUT if settings.levels else GROUPS


def base_of(name: str) -> str | None:
    return METHODS[name].base
