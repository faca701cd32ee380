"""A run's settings by side: what the server computes with (`ServerSettings`), what a client
computes with (`ClientSettings`) and what a partition is drawn with (`PartitionSettings`).

Each is a frozen record generated from the tags config.py's `RunConfig` fields carry, so no list
is kept by hand:
- a client computes with the settings tagged `Role.CLIENT`; a federation's node is told exactly
  these (its schedule: deploy/wire/schedule.py) and builds its client side from them alone;
- a partition is drawn with the settings tagged `Affects.PARTITION`, and a share holds the
  normalisation (`Role.EXPORTED`); a node checks its data file against their digest;
- the server computes with every setting but those only drawing a partition needs and those
  naming where the data lies (`Role.SHARED`): it reads the run's facts instead (data/facts.py).
  The client's settings are among its own: it tells them.

Every field of a record is required (a record is made from a whole config, `of`, or read from a
schedule, where a setting left out is refused, never taken at a default) and checked by the
config's own rules for it; the model groups (`groups`, `levels`, `bn_at_eval`) are derived as
the config derives them. Entry points (the CLI, `incofl train`, the ServerApp) read a
`RunConfig`; every stage, trainer and evaluator takes its side's record.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, create_model, field_validator, model_validator
from pydantic_core import PydanticUndefined

from incofl.config import (
    Affects,
    ModelGroups,
    Role,
    RunConfig,
    ServerGroups,
    check_dataset,
    check_method,
    check_models,
    run_settings,
)
from incofl.registry import METHODS

CLIENT_SETTINGS = run_settings(Role.CLIENT)
PARTITION_SETTINGS = run_settings(Affects.PARTITION, Role.EXPORTED)
SERVER_SETTINGS = frozenset(RunConfig.model_fields) - (PARTITION_SETTINGS - CLIENT_SETTINGS) - run_settings(Role.SHARED)


class SideRecord(BaseModel):
    """A record of some of a run's settings (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @classmethod
    def of(cls, cfg: RunConfig) -> Self:
        """The record of a whole run's config (checked there: not again)."""
        return cls.model_construct(**{name: getattr(cfg, name) for name in cls.model_fields})


class RunSide(ModelGroups, SideRecord):
    """A side's record: the config's checks of the settings it holds, and its model groups."""

    @field_validator("models", check_fields=False)
    @classmethod
    def _models(cls, models: list[str]) -> list[str]:
        return check_models(models)

    @field_validator("method", check_fields=False)
    @classmethod
    def _method(cls, method: str) -> str:
        return check_method(method)

    @field_validator("dataset", check_fields=False)
    @classmethod
    def _dataset(cls, dataset: str) -> str:
        return check_dataset(dataset)

    @model_validator(mode="after")
    def _method_args(self) -> Self:
        METHODS[self.method].parse_args(self.method_args)  # a ValueError naming method_args.<key>
        return self


def _record(name: str, settings: frozenset[str], base: type[SideRecord], doc: str) -> Any:
    """A frozen record of `settings`, each field RunConfig's (its type and checks), none with a default."""
    fields = {}
    for setting in sorted(settings):
        field = copy.copy(RunConfig.model_fields[setting])
        field.default, field.default_factory = PydanticUndefined, None
        fields[setting] = (field.annotation, field)
    return create_model(name, __base__=base, __doc__=doc, __module__=__name__, **fields)


ClientSettings = _record(
    "ClientSettings", CLIENT_SETTINGS, RunSide, "What a client computes with (Role.CLIENT): a node's schedule."
)


class ServerSide(ServerGroups, RunSide):
    """The server's record: a side's, and the epoch scaling its transforms derive."""


ServerSettings = _record(
    "ServerSettings", SERVER_SETTINGS, ServerSide, "What the server computes with (module docstring)."
)


class PartitionSide(SideRecord):
    def digest(self) -> str:
        """SHA-256 of the settings a share depends on, paths left out (a site's own folder is its
        own): what a node checks its data file's against (`partition_digest`)."""
        return partition_digest(self.model_dump(mode="json"))


PartitionSettings = _record(
    "PartitionSettings",
    PARTITION_SETTINGS,
    PartitionSide,
    "What a partition is drawn with, and a share's normalisation.",
)
DIGESTED = PARTITION_SETTINGS - run_settings(Role.PATH)  # what the digest covers


def partition_digest(settings: dict[str, Any]) -> str:
    """SHA-256 of the partition settings `settings` holds of DIGESTED (a data file's, as exported, or a run's)."""
    told = {key: settings.get(key) for key in sorted(DIGESTED)}
    return hashlib.sha256(json.dumps(told, sort_keys=True).encode()).hexdigest()
