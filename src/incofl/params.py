"""Typed method hyper-parameters: one pydantic model per stage component.

A method's `method_args` are validated against the union of its components' models (strict:
`weighted: "no"` is an error, not True; numbers must be finite and in range), when the
config is, before any job starts. A bad name or value is one line naming
`method_args.<key>`, the value and what is allowed.
"""

from __future__ import annotations

from copy import copy
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model


class Params(BaseModel):
    """Base of every component's parameters: unknown names refused, no silent coercion."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class AggregationParams(Params):
    weighted: bool = False  # sample-weighted averaging (p_i = n_i / sum n) instead of the plain mean


class ProxParams(Params):
    mu: float = Field(0.1, ge=0.0, allow_inf_nan=False)  # proximal weight (the loss term is mu/2 ||w - w_g||^2)
    anchor: Literal["round", "initial"] = "round"  # w_g: this round's global model, or the initial one


class ScaffoldParams(Params):
    correction: Literal["step", "gradient"] = "step"  # where c - c_i enters: weights after a step, or the gradient


class NovaParams(Params):
    rho: float | None = Field(None, ge=0.0, lt=1.0, allow_inf_nan=False)  # None: the local SGD momentum (0 for Adam)


class MoonParams(Params):
    mu: float = Field(5.0, ge=0.0, allow_inf_nan=False)  # weight of the contrastive term
    temperature: float = Field(0.5, gt=0.0, allow_inf_nan=False)
    pool_size: int = Field(1, ge=1)  # previous local models kept per client
    projection_dim: int = Field(256, ge=0)  # MOON's projection head; 0: none (z = features)


class InCoParams(Params):
    variant: Literal["official", "paper"] = "official"
    mode: Literal["always", "projection"] = "always"  # paper variant: c = -beta/alpha, or max(0, -beta/alpha)
    normalize: bool = True
    optimize: bool = True
    eps: float = Field(1e-7, gt=0.0, allow_inf_nan=False)
    clamp_max: float = Field(5.0, gt=0.0, allow_inf_nan=False)  # official: upper bound of c
    clip: float = Field(0.1, gt=0.0, allow_inf_nan=False)  # official: elementwise bound of T'


class PartParams(Params):
    """FedPart's schedule (docs/methods.md, FedPart): W full rounds, then R rounds for each layer group in turn."""

    order: Literal["sequential", "reverse", "random"] = "sequential"  # random: a fresh permutation per cycle
    warmup: int = Field(5, ge=0)  # W: full rounds at the start of a cycle
    rounds_per_group: int = Field(2, ge=1)  # R
    # cycles: W + R*G rounds, repeated; once: one warm-up, then partial rounds for ever. Not
    # `variant`, which InCo's parameters already name (InCoPart takes both).
    schedule: Literal["cycles", "once"] = "cycles"


class WidthParams(Params):
    """Width splitting's plan (docs/methods.md, hetero splitting): leading channels (HeteroFL), or FedRolex's window
    rolled by one channel every round."""

    rolling: bool = False


class SlicedParams(Params):
    """Width splitting's aggregation: classifier rows only from clients holding the class (HeteroFL, FedRolex)."""

    class_rows: bool = True


class RolexParams(SlicedParams):
    """FedRolex's aggregation. `mean`: the paper's selective average, as SlicedMean; `released`:
    the release's weighting by how often each element was held (docs/fedrolex-weighting.md)."""

    weighting: Literal["mean", "released"] = "mean"


class LagParams(Params):
    """FedLAG (docs/methods.md, FedLAG): FedAvg warm-up counting gradient conflicts, then the top-K
    conflicting state entries personal."""

    signal: Literal["last_grad", "update"] = "last_grad"  # a client's last mini-batch gradient (release) or update
    xi: float = Field(0.0, ge=-1.0, le=1.0, allow_inf_nan=False)  # a pair conflicts when cos(g_i, g_j) < xi
    top_k: int = Field(2, ge=0)  # K personal entries (a weight and its bias count apart)
    warmup: int | None = Field(None, ge=1)  # warm-up rounds; None: R_s + 1 with R_s = min(rounds // 2, 30)
    variant: Literal["intended", "released"] = "intended"  # released: no broadcast after warm-up (main branch)


def combine(name: str, models: list[type[Params]], defaults: dict[str, Any]) -> type[Params]:
    """One model with every field of `models` (later ones win a name clash), with the method's
    own `defaults` in place of the components'."""
    fields: dict[str, Any] = {}
    for model in models:
        for key, info in model.model_fields.items():
            fields[key] = (info.annotation, info)
    for key, value in defaults.items():
        info = copy(fields[key][1])
        info.default = value
        fields[key] = (fields[key][0], info)
    return create_model(f"{name}Params", __base__=Params, **fields)


def parse(model: type[Params], method: str, args: dict[str, Any]) -> Params:
    """`args` as `model`, or a ValueError naming `method_args.<key>`, the value and what is allowed."""
    try:
        return model.model_validate(args)
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        if first["type"] == "extra_forbidden":
            allowed = ", ".join(model.model_fields) or "nothing"
            raise ValueError(f"method_args.{key}: not a parameter of {method} (takes: {allowed})") from None
        raise ValueError(f"method_args.{key}: {first['msg']} (got {first['input']!r})") from None


def describe(model: type[Params]) -> str:
    """`name=default` for every parameter, for `incofl methods`."""
    return " ".join(f"{key}={info.default!r}" for key, info in model.model_fields.items())


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
