"""InCo Aggregation's parameters and methods (Chan et al., ICLR 2024): InCoAvg, its ablations and
variants, and `with_inco`, which composes the InCo step with any base method's other stages (the
other families' InCo methods: InCoProx, InCoNova, InCoPart, InCoHeteroFL, ...)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from incofl.params import Params
from incofl.spec import CE, SHARED, Component, Method


class InCoParams(Params):
    variant: Literal["official", "paper"] = "official"
    mode: Literal["always", "projection"] = "always"  # paper variant: c = -beta/alpha, or max(0, -beta/alpha)
    normalize: bool = True
    optimize: bool = True
    eps: float = Field(1e-7, gt=0.0, allow_inf_nan=False)
    clamp_max: float = Field(5.0, gt=0.0, allow_inf_nan=False)  # official: upper bound of c
    clip: float = Field(0.1, gt=0.0, allow_inf_nan=False)  # official: elementwise bound of T'


INCO = Component("incofl.fl.methods.inco.step:InCoStep", InCoParams)
INCO_LOG = Component("incofl.fl.methods.inco.step:InCoLog")
PAPER = "Chan et al., ICLR 2024"


def with_inco(
    name: str,
    base: str,
    source: str,
    objective: Component = CE,
    aggregator: Component = SHARED,
    before: tuple[Component, ...] = (),
    **kw: Any,
) -> Method:
    """HeteroAvg (or width splitting's per-element mean) over the shared global state, then the
    post transforms `before` (a base method's own, e.g. FedDyn's correction), then the InCo step,
    with its theta/beta log; `base` is the method its table row is compared with."""
    post = (*before, INCO)
    return Method(name, objective, aggregator, post=post, observers=(INCO_LOG,), base=base, source=source, **kw)


_FIG8 = PAPER + ", Fig. 8"
METHODS = (
    with_inco("InCoAvg", "FedAvg", PAPER),
    with_inco("InCoAvg-noNorm", "FedAvg", _FIG8, defaults={"normalize": False}),
    with_inco("InCoAvg-noOpt", "FedAvg", _FIG8, defaults={"optimize": False}),
    with_inco("InCoAvg-noNormOpt", "FedAvg", _FIG8, defaults={"normalize": False, "optimize": False}),
    with_inco("InCoAvg-paper", "FedAvg", PAPER + ", Algorithm 1", defaults={"variant": "paper"}),
    with_inco(
        "InCoAvg-projection", "FedAvg", PAPER + ", Theorem 3.1", defaults={"variant": "paper", "mode": "projection"}
    ),
)
