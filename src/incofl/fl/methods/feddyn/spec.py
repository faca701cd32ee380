"""FedDyn's parameters and methods (Acar et al., ICLR 2021, Algorithm 1): the client's dynamic
regulariser (DynClient; DynObjective is its server half) and the server's correction
(DynCorrection), both in dyn.py; and InCoDyn, the InCo step after that correction."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from incofl.fl.methods.inco.spec import PAPER, with_inco
from incofl.params import AggregationParams, Params
from incofl.spec import GROUPWISE_SOURCE, Component, Method


class DynParams(Params):
    alpha: float = Field(0.01, gt=0.0, allow_inf_nan=False)  # the regulariser's weight (the paper's CIFAR-10 value)


class PlainMean(AggregationParams):
    weighted: Literal[False] = False  # theta = the plain mean over the sampled clients (Algorithm 1), never weighted


DYN = Component("incofl.fl.methods.feddyn.dyn:DynObjective", DynParams)
CORRECTION = Component("incofl.fl.methods.feddyn.dyn:DynCorrection", DynParams)
GROUPWISE_MEAN = Component("incofl.fl.stages.aggregate:GroupWise", PlainMean)
SHARED_MEAN = Component("incofl.fl.stages.aggregate:Shared", PlainMean)
SOURCE = "Acar et al., ICLR 2021 (FedDyn)"

METHODS = (
    Method("FedDyn", DYN, GROUPWISE_MEAN, post=(CORRECTION,), source=SOURCE + GROUPWISE_SOURCE),
    # InCo's step after FedDyn's correction
    with_inco("InCoDyn", "FedDyn", PAPER + "; " + SOURCE, DYN, SHARED_MEAN, before=(CORRECTION,)),
)
