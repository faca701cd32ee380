"""The objective-only methods' parameters and methods: FedProx, SCAFFOLD, MOON (a local
objective each, on the generic stages) and their InCo versions."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from incofl.fl.methods.inco.spec import PAPER, with_inco
from incofl.params import Params
from incofl.spec import GROUPWISE_SOURCE, Component, Method


class ProxParams(Params):
    mu: float = Field(0.1, ge=0.0, allow_inf_nan=False)  # proximal weight (the loss term is mu/2 ||w - w_g||^2)
    anchor: Literal["round", "initial"] = "round"  # w_g: this round's global model, or the initial one


class ScaffoldParams(Params):
    correction: Literal["step", "gradient"] = "step"  # where c - c_i enters: weights after a step, or the gradient


class MoonParams(Params):
    mu: float = Field(5.0, ge=0.0, allow_inf_nan=False)  # weight of the contrastive term
    temperature: float = Field(0.5, gt=0.0, allow_inf_nan=False)
    pool_size: int = Field(1, ge=1)  # previous local models kept per client
    projection_dim: int = Field(256, ge=0)  # MOON's projection head; 0: none (z = features)


PROX = Component("incofl.fl.methods.objectives.fedprox:FedProx", ProxParams)
SCAFFOLD = Component("incofl.fl.methods.objectives.scaffold:Scaffold", ScaffoldParams)
MOON = Component("incofl.fl.methods.objectives.moon:Moon", MoonParams)
PROX_SOURCE = "Li et al., MLSys 2020 (FedProx)"
SCAFFOLD_SOURCE = "Karimireddy et al., ICML 2020 (SCAFFOLD, option II)"  # plain mean over S, its Algorithm 1
MOON_SOURCE = "Li, He & Song, CVPR 2021 (MOON)"

METHODS = (
    Method("FedProx", PROX, source=PROX_SOURCE + GROUPWISE_SOURCE),
    Method("SCAFFOLD", SCAFFOLD, source=SCAFFOLD_SOURCE + GROUPWISE_SOURCE),
    Method("MOON", MOON, source=MOON_SOURCE + GROUPWISE_SOURCE),
    with_inco("InCoProx", "FedProx", PAPER + "; " + PROX_SOURCE, PROX),
    with_inco("InCoScaffold", "SCAFFOLD", PAPER + "; " + SCAFFOLD_SOURCE, SCAFFOLD),
    with_inco("InCoMOON", "MOON", PAPER + "; " + MOON_SOURCE, MOON),
)
