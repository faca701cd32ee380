"""FedPart's parameters and methods (Wang et al., NeurIPS 2024, partial network updates), each
compared with full updates of the same objective over the same rounds (the poster's "FNU")."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from incofl.fl.methods.inco.spec import PAPER, with_inco
from incofl.fl.methods.objectives.spec import MOON, MOON_SOURCE, PROX, PROX_SOURCE
from incofl.params import Params
from incofl.spec import Component, Method


class PartParams(Params):
    """FedPart's schedule (docs/methods.md, FedPart): W full rounds, then R rounds for each layer group in turn."""

    order: Literal["sequential", "reverse", "random"] = "sequential"  # random: a fresh permutation per cycle
    warmup: int = Field(5, ge=0)  # W: full rounds at the start of a cycle
    rounds_per_group: int = Field(2, ge=1)  # R
    # cycles: W + R*G rounds, repeated; once: one warm-up, then partial rounds for ever. Not
    # `variant`, which InCo's parameters already name (InCoPart takes both).
    schedule: Literal["cycles", "once"] = "cycles"


PART = Component("incofl.fl.methods.fedpart.plan:PartPlanner", PartParams, layer_groups=True)
_PART = "Wang et al., NeurIPS 2024 (FedPart, partial network updates)"

METHODS = (
    Method("FedPart", planner=PART, base="FedAvg", source=_PART + "; groupwise"),
    Method("FedPartProx", PROX, planner=PART, base="FedProx", source=_PART + "; " + PROX_SOURCE),
    Method("FedPartMOON", MOON, planner=PART, base="MOON", source=_PART + "; " + MOON_SOURCE),
    with_inco("InCoPart", "FedPart", PAPER + "; " + _PART, planner=PART),
)
