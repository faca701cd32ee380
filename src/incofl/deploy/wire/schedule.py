"""What a federation's node is told of a run (its schedule), and nothing else of the experiment:
its client's record of the run's settings (incofl.sides.ClientSettings: every setting the client side
computes with, config.py's `Role.CLIENT` tags: epochs, batch size, optimiser and its settings, the method
and its parameters, the models, the seed, ...), the digest of the partition settings its data file must
have been exported with (sides.partition_digest, paths left out), whether the run
starts from pretrained weights (the node's own file holds them), the name of the run's folder
of saved states (`run_key`, of the server's whole config) and the data set's facts (class count,
image shape, normalisation: data/facts.py), which a site serving its own data checks it against
and normalises with (site/owndata.py). No path and no setting only the server
computes with travels: the node's files are those its own node config names.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from incofl.config import RunConfig
from incofl.data.facts import Facts
from incofl.errors import key_and_message
from incofl.fl.engine.checkpoint import semantic_config
from incofl.sides import ClientSettings, PartitionSettings

DIGEST = re.compile(r"[0-9a-f]{64}")
RUN_FOLDER = re.compile(r"[0-9a-f]{16}")  # run_key's names


def run_key(cfg: RunConfig) -> str:
    """The folder name of a run's node states: the hash of its config's settings that change the
    numbers (a resumed run's, whose threads or progress may differ, is the same)."""
    semantic = semantic_config(cfg.model_dump())
    return hashlib.sha256(json.dumps(semantic, sort_keys=True, default=str).encode()).hexdigest()[:16]


def schedule_of(cfg: RunConfig, facts: Facts | None = None) -> str:
    """The schedule the server tells every node (module docstring), as JSON; the data set's
    facts from `facts` (None: none told, as to a node that reads an exported share)."""
    client = ClientSettings.of(cfg).model_dump(mode="json")
    partition = PartitionSettings.of(cfg).digest()
    data = None if facts is None else {**facts.to_json(), "clients": []}  # no client's facts: not the node's to know
    told = {"config": client, "partition": partition, "pretrained": bool(cfg.pretrained), "run": run_key(cfg)}
    return json.dumps({**told, "data": data})


@dataclass(frozen=True)
class Schedule:
    """A node's schedule, read back: its client side's record of the run's settings (every setting the
    client side computes with, as the server's config has it, and no other), the digest of the
    partition settings to check its file against, whether it needs pretrained weights, its run,
    the data set's facts (no client's; None if not told)."""

    settings: ClientSettings
    partition: str
    pretrained: bool
    run: str
    data: Facts | None = None

    @classmethod
    def read(cls, text: str) -> Schedule:
        """`schedule_of`'s text, checked: a ValueError names the first entry that is not a schedule's."""
        data = json.loads(text)
        if not isinstance(data, dict) or set(data) != {"config", "partition", "pretrained", "run", "data"}:
            raise ValueError("schedule: not config, partition, pretrained, run and data")
        config, partition, run = data["config"], data["partition"], data["run"]
        if not isinstance(partition, str) or not DIGEST.fullmatch(partition):
            raise ValueError("schedule: partition: not the digest of the partition's settings")
        if type(data["pretrained"]) is not bool or not isinstance(run, str) or not RUN_FOLDER.fullmatch(run):
            raise ValueError("schedule: pretrained or run: not a flag and a run's folder name")  # run names a folder
        if data["data"] is not None and not isinstance(data["data"], dict):
            raise ValueError("schedule: data: not the data set's facts")
        facts = None if data["data"] is None else Facts.from_json(data["data"], 0)  # a ValueError names the entry
        try:
            # every setting required (none left to a default here: the server's value), none other
            # taken, each by the config's own checks
            settings = ClientSettings.model_validate(config)
        except ValueError as err:  # pydantic's ValidationError, one line naming the setting
            raise ValueError(f"schedule: config: {key_and_message(err)}") from None
        return cls(settings, partition, data["pretrained"], run, facts)
