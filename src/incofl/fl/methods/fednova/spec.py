"""FedNova's parameters and methods (Wang et al., NeurIPS 2020): the normalisation of each
client's update before a sample-weighted average (p_i = n_i / sum n), and with the InCo step."""

from __future__ import annotations

from pydantic import Field

from incofl.fl.methods.inco.spec import PAPER, with_inco
from incofl.params import Params
from incofl.spec import GROUPWISE_SOURCE, Component, Method


class NovaParams(Params):
    rho: float | None = Field(None, ge=0.0, lt=1.0, allow_inf_nan=False)  # None: the local SGD momentum (0 for Adam)


NOVA = Component("incofl.fl.methods.fednova.normalize:NovaNormalize", NovaParams)
_NOVA = "Wang et al., NeurIPS 2020 (FedNova)"
_WEIGHTED = {"weighted": True}

METHODS = (
    Method("FedNova", pre=(NOVA,), defaults=_WEIGHTED, source=_NOVA + GROUPWISE_SOURCE),
    with_inco("InCoNova", "FedNova", PAPER + "; " + _NOVA, pre=(NOVA,), defaults=_WEIGHTED),
)
