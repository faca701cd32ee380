"""The personalised methods' parameters and methods: local training, FedPer and FedLAG (each
client keeps part of its model; measured with `holdout`, personal accuracy)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from incofl.params import Params
from incofl.spec import Component, Method


class LagParams(Params):
    """FedLAG (docs/methods.md, FedLAG): FedAvg warm-up counting gradient conflicts, then the top-K
    conflicting state entries personal."""

    signal: Literal["last_grad", "update"] = "last_grad"  # a client's last mini-batch gradient (release) or update
    xi: float = Field(0.0, ge=-1.0, le=1.0, allow_inf_nan=False)  # a pair conflicts when cos(g_i, g_j) < xi
    top_k: int = Field(2, ge=0)  # K personal entries (a weight and its bias count apart)
    warmup: int | None = Field(None, ge=1)  # warm-up rounds; None: R_s + 1 with R_s = min(rounds // 2, 30)
    # after warm-up, clients receive the shared entries (the paper); false: nothing (the released
    # main branch, whose broadcast is a no-op: local training after a FedAvg warm-up)
    broadcast: bool = True


LOCAL = Component("incofl.fl.methods.personal.plan:LocalPlanner", personal=True)
FEDPER = Component("incofl.fl.methods.personal.plan:FedPerPlanner", personal=True)
# `broadcast` was `variant: intended | released` (the committed runs' configs hold the old name)
LAG = Component(
    "incofl.fl.methods.personal.plan:LagPlanner",
    LagParams,
    personal=True,
    renamed={"variant": ("broadcast", {"intended": True, "released": False})},
)
_LAG = "FedLAG, arXiv 2410.02845 (layer-wise personalisation by gradient conflict)"
_WEIGHTED = {"weighted": True}

METHODS = (
    Method("Local", planner=LOCAL, source="local training only (FedLAG's baseline)"),
    Method(
        "FedPer",
        planner=FEDPER,
        base="FedAvg",
        defaults=_WEIGHTED,
        source="Arivazhagan et al. 2019 (FedPer: personal head); sample-weighted",
    ),
    Method("FedLAG", planner=LAG, base="FedAvg", defaults=_WEIGHTED, source=_LAG + "; sample-weighted"),
)
