"""Typed method hyper-parameters: one pydantic model per stage component (each family's in its
`fl/methods/<family>/spec.py`, the generic stages' here), and their union for a method.

A method's `method_args` are validated against the union of its components' models (strict:
`weighted: "no"` is an error, not True; numbers must be finite and in range), when the
config is, before any job starts. A bad name or value is one line naming
`method_args.<key>`, the value and what is allowed.
"""

from __future__ import annotations

from copy import copy
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model


class Params(BaseModel):
    """Base of every component's parameters: unknown names refused, no silent coercion."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class AggregationParams(Params):
    weighted: bool = False  # sample-weighted averaging (p_i = n_i / sum n) instead of the plain mean


def combine(name: str, models: list[tuple[str, type[Params]]], defaults: dict[str, Any]) -> type[Params]:
    """One model with every field of `models` ((component name, its parameters) pairs), with the method's
    own `defaults` in place of the components'. Two components declaring one name is a ValueError
    naming both (one value could not mean two things), unless one's model derives from the other's."""
    fields: dict[str, Any] = {}
    owners: dict[str, tuple[str, type[Params]]] = {}
    for component, model in models:
        for key, info in model.model_fields.items():
            if key in owners:
                other, theirs = owners[key]
                if not issubclass(model, theirs) and not issubclass(theirs, model):
                    raise ValueError(f"{name}: parameter {key!r} is declared by both {other} and {component}")
                if issubclass(theirs, model):
                    continue  # the derived model's field stands
            owners[key] = (component, model)
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
