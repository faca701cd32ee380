"""The method registry: a name -> the components of its round's stages.

A method is one entry: its local objective (train), its aggregator (aggregate), transforms
before aggregation (FedNova's normalisation) and after it (InCo), extra observers (InCo's
theta/beta log), its planner, the method its table row is compared with (`base`), and its
own defaults for the components' typed parameters (`params.py`). See README "Add a method".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from incofl.fl.client import Objective
from incofl.fl.objectives import ExitLoss, FedProx, MaskedCE, Moon, Scaffold
from incofl.fl.observers import InCoLog, Observer
from incofl.fl.params import Params, combine, parse
from incofl.fl.personal import FedPerPlanner, LagPlanner, LocalPlanner
from incofl.fl.plan import FullPlanner, PartPlanner
from incofl.fl.server import GroupWise, Shared
from incofl.fl.transforms import INCO, AverageTransform, NovaNormalize, UpdateTransform
from incofl.fl.width import RolexMean, SlicedMean, WidthPlanner


@dataclass(frozen=True)
class Method:
    name: str
    objective: type[Objective] = Objective
    aggregator: type[Shared] = GroupWise
    pre: tuple[type[UpdateTransform], ...] = ()  # transforms of the client updates, before aggregation
    post: tuple[type[AverageTransform], ...] = ()  # transforms of each averaged update, after it
    observers: tuple[type[Observer], ...] = ()
    planner: type[FullPlanner] = FullPlanner
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
        """Trains models cut in width (and depth): HeteroFL, FedRolex, ScaleFL (fl/width.py)."""
        return issubclass(self.planner, WidthPlanner)

    @property
    def partial(self) -> bool:
        """Trains one layer group in most rounds (FedPart's schedule)."""
        return self.planner is PartPlanner

    def model_kwargs(self, hp: Params) -> dict[str, Any]:
        """The objective's model-building parameters (MOON's projection_dim) for `build_model`."""
        return {name: getattr(hp, name) for name in self.objective.model_args}


def _inco(
    name: str,
    base: str,
    source: str,
    objective: type[Objective] = Objective,
    aggregator: type[Shared] = Shared,
    **kw: Any,
) -> Method:
    """HeteroAvg (or width splitting's per-element mean) over the shared global state, then the
    InCo step, with its theta/beta log."""
    return Method(name, objective, aggregator, post=INCO, observers=(InCoLog,), base=base, source=source, **kw)


def _width(
    name: str, source: str, inco: str | None = None, aggregator: type[SlicedMean] = SlicedMean, **kw: Any
) -> Method:
    """A width-splitting method (fl/width.py), or with `inco` (its base's name) the InCo step after it."""
    if inco:
        return _inco(name, inco, _PAPER + "; " + source, aggregator=aggregator, planner=WidthPlanner, **kw)
    return Method(name, aggregator=aggregator, planner=WidthPlanner, source=source, **kw)


_PAPER = "Chan et al., ICLR 2024"
_GROUPWISE = "; groupwise as in " + _PAPER
_PROX = "Li et al., MLSys 2020 (FedProx)"
_SCAFFOLD = "Karimireddy et al., ICML 2020 (SCAFFOLD, option II)"  # plain mean over S, its Algorithm 1
_NOVA = "Wang et al., NeurIPS 2020 (FedNova)"  # sample-weighted: p_i = n_i / sum n (METHODS.md 3)
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
    Method("FedProx", FedProx, source=_PROX + _GROUPWISE),
    Method("SCAFFOLD", Scaffold, source=_SCAFFOLD + _GROUPWISE),
    Method("FedNova", pre=(NovaNormalize,), defaults={"weighted": True}, source=_NOVA + _GROUPWISE),
    Method("MOON", Moon, source=_MOON + _GROUPWISE),
    Method("HeteroAvg", aggregator=Shared, source=_PAPER),
    _inco("InCoAvg", "FedAvg", _PAPER),
    _inco("InCoProx", "FedProx", _PAPER + "; " + _PROX, FedProx),
    _inco("InCoScaffold", "SCAFFOLD", _PAPER + "; " + _SCAFFOLD, Scaffold),
    _inco("InCoNova", "FedNova", _PAPER + "; " + _NOVA, pre=(NovaNormalize,), defaults={"weighted": True}),
    _inco("InCoMOON", "MOON", _PAPER + "; " + _MOON, Moon),
    _inco("InCoAvg-noNorm", "FedAvg", _PAPER + ", Fig. 8", defaults={"normalize": False}),
    _inco("InCoAvg-noOpt", "FedAvg", _PAPER + ", Fig. 8", defaults={"optimize": False}),
    _inco("InCoAvg-noNormOpt", "FedAvg", _PAPER + ", Fig. 8", defaults={"normalize": False, "optimize": False}),
    _inco("InCoAvg-paper", "FedAvg", _PAPER + ", Algorithm 1", defaults={"variant": "paper"}),
    _inco(
        "InCoAvg-projection", "FedAvg", _PAPER + ", Theorem 3.1", defaults={"variant": "paper", "mode": "projection"}
    ),  # noqa: E501
    # compared with full updates of the same objective over the same rounds (the poster's "FNU")
    Method("FedPart", planner=PartPlanner, base="FedAvg", source=_PART + "; groupwise"),
    Method("FedPartProx", FedProx, planner=PartPlanner, base="FedProx", source=_PART + "; " + _PROX),
    Method("FedPartMOON", Moon, planner=PartPlanner, base="MOON", source=_PART + "; " + _MOON),
    _inco("InCoPart", "FedPart", _PAPER + "; " + _PART, planner=PartPlanner),
    # personalised: each client keeps part of its model (measure with `holdout`, personal accuracy)
    Method("Local", planner=LocalPlanner, source="local training only (FedLAG's baseline)"),
    Method(
        "FedPer",
        planner=FedPerPlanner,
        base="FedAvg",
        defaults={"weighted": True},
        source="Arivazhagan et al. 2019 (FedPer: personal head); sample-weighted",
    ),  # fmt: skip
    Method("FedLAG", planner=LagPlanner, base="FedAvg", defaults={"weighted": True}, source=_LAG + "; sample-weighted"),
    # width (and depth) splitting, the InCo paper's "hetero splitting" (its Fig. 5c)
    _width("HeteroFL", _HETEROFL, objective=MaskedCE),
    _width("FedRolex", _ROLEX, aggregator=RolexMean, objective=MaskedCE, defaults=_ROLLING),
    _width("ScaleFL", _SCALEFL, objective=ExitLoss, defaults=_EXITS),
    _width("InCoHeteroFL", _HETEROFL, inco="HeteroFL", objective=MaskedCE),
    _width("InCoRolex", _ROLEX, inco="FedRolex", aggregator=RolexMean, objective=MaskedCE, defaults=_ROLLING),
    _width("InCoScaleFL", _SCALEFL, inco="ScaleFL", objective=ExitLoss, defaults=_EXITS),
]
METHODS: dict[str, Method] = {m.name: m for m in _REGISTRY}


def register(method: Method) -> Method:
    """Add a method (used by modules that define new components)."""
    METHODS[method.name] = method
    return method


def base_of(name: str) -> str | None:
    return METHODS[name].base
