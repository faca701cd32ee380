"""Width (and depth) splitting's parameters and methods, the InCo paper's "hetero splitting" (its
Fig. 5c): HeteroFL, FedRolex, ScaleFL, each also with the InCo step."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from incofl.fl.methods.inco.spec import PAPER, with_inco
from incofl.params import Params
from incofl.spec import Component, Method


class WidthParams(Params):
    """Width splitting's plan (docs/methods.md, hetero splitting): leading channels (HeteroFL), or FedRolex's window
    rolled by one channel every round."""

    rolling: bool = False


class SlicedParams(Params):
    """Width splitting's aggregation: classifier rows only from clients holding the class (HeteroFL, FedRolex)."""

    class_rows: bool = True


class RolexParams(SlicedParams):
    """FedRolex's aggregation. `mean`: the paper's selective average, as SlicedMean; `released`:
    the release's weighting by how often each element was trained (docs/fedrolex-weighting.md)."""

    weighting: Literal["mean", "released"] = "mean"


class MaskedParams(Params):
    """HeteroFL's and FedRolex's local training (docs/methods.md, hetero splitting). `grad_clip`, not `clip`: InCo's
    parameters name their own `clip`, and a width method with InCo takes both."""

    grad_clip: float = Field(1.0, gt=0.0, allow_inf_nan=False)  # max L2 norm of the gradient (both releases: 1)
    mask_classes: bool = True  # logits of the classes a client holds no sample of set to 0 (both releases)


class ExitParams(Params):
    """ScaleFL's early-exit loss (docs/methods.md, hetero splitting)."""

    # intended: teacher detached, KL per sample; released: teacher not detached, KL averaged over B x C
    distill: Literal["intended", "released"] = "intended"
    # The release distils only with --KD_gamma 0.05 (its AG News command; CIFAR runs use the default 0)
    gamma: float = Field(0.05, ge=0.0, allow_inf_nan=False)
    temperature: float = Field(3.0, gt=0.0, allow_inf_nan=False)  # the release's KD_T
    # share of the rounds before distillation starts: from round index distill_from * rounds on (release: 25%)
    distill_from: float = Field(0.25, ge=0.0, le=1.0, allow_inf_nan=False)


MASKED = Component("incofl.fl.methods.width.masked:MaskedCE", MaskedParams)
EXIT_LOSS = Component("incofl.fl.methods.width.exits:ExitLoss", ExitParams, exits=True)
SLICED = Component("incofl.fl.methods.width.aggregate:SlicedMean", SlicedParams)
ROLEX = Component("incofl.fl.methods.width.aggregate:RolexMean", RolexParams)
WIDTH = Component("incofl.fl.methods.width.levels:WidthPlanner", WidthParams, width=True)

_HETEROFL = "Diao et al., ICLR 2021 (HeteroFL: leading channels)"
_ROLEX = "Alam et al., NeurIPS 2022 (FedRolex: rolling sub-models)"
_SCALEFL = "Ilhan et al., CVPR 2023 (ScaleFL: width and depth, early exits)"
_ROLLING = {"rolling": True}
_EXITS = {"class_rows": False}  # ScaleFL averages classifier rows like any element


def _width(name: str, source: str, inco: str | None = None, aggregator: Component = SLICED, **kw: Any) -> Method:
    """A width-splitting method, or with `inco` (its base's name) the InCo step after it."""
    if inco:
        return with_inco(name, inco, PAPER + "; " + source, aggregator=aggregator, planner=WIDTH, **kw)
    return Method(name, aggregator=aggregator, planner=WIDTH, source=source, **kw)


METHODS = (
    _width("HeteroFL", _HETEROFL, objective=MASKED),
    _width("FedRolex", _ROLEX, aggregator=ROLEX, objective=MASKED, defaults=_ROLLING),
    _width("ScaleFL", _SCALEFL, objective=EXIT_LOSS, defaults=_EXITS),
    _width("InCoHeteroFL", _HETEROFL, inco="HeteroFL", objective=MASKED),
    _width("InCoRolex", _ROLEX, inco="FedRolex", aggregator=ROLEX, objective=MASKED, defaults=_ROLLING),
    _width("InCoScaleFL", _SCALEFL, inco="ScaleFL", objective=EXIT_LOSS, defaults=_EXITS),
)
