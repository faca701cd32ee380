"""The run's settings by side (incofl.sides): records generated from config.py's tags, every field
required and checked; no stage takes the whole config; the server side loads nothing of a client's."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from incofl.config import Affects, Role, RunConfig, run_settings
from incofl.sides import (
    CLIENT_SETTINGS,
    DIGESTED,
    SERVER_SETTINGS,
    ClientSettings,
    PartitionSettings,
    ServerSettings,
    partition_digest,
)

SRC = Path(__file__).resolve().parents[1] / "src" / "incofl"


def test_each_record_holds_the_settings_its_tags_name():
    assert set(ClientSettings.model_fields) == run_settings(Role.CLIENT) == CLIENT_SETTINGS
    assert set(PartitionSettings.model_fields) == run_settings(Affects.PARTITION, Role.EXPORTED)
    assert set(ServerSettings.model_fields) == SERVER_SETTINGS
    assert CLIENT_SETTINGS <= SERVER_SETTINGS  # the server tells a client its settings
    assert not SERVER_SETTINGS & run_settings(Role.SHARED)  # where data lies, how shares are drawn: the facts'
    assert "alpha" not in SERVER_SETTINGS and {"ratio", "update_noise", "analyses"} <= SERVER_SETTINGS - CLIENT_SETTINGS
    assert not CLIENT_SETTINGS & run_settings(Role.PATH)  # a node's files are its own config's


def test_a_record_has_no_default_and_checks_each_setting_by_the_configs_rule():
    with pytest.raises(ValidationError) as missing:
        ClientSettings.model_validate({})
    assert {e["loc"][0] for e in missing.value.errors() if e["type"] == "missing"} == CLIENT_SETTINGS
    told = ClientSettings.of(RunConfig(lr=0.5, method="FedProx", method_args={"mu": 0.2})).model_dump(mode="json")
    assert ClientSettings.model_validate(told).lr == 0.5
    for key, bad, why in [
        ("lr", 0.0, "greater than 0"),
        ("models", ["resnet10", "vit_d8"], "one family"),
        ("method", "FedNope", "unknown method"),
        ("method_args", {"mu": -1}, "mu"),
        ("threads", 2, None),  # a good value: taken
    ]:
        if why is None:
            assert ClientSettings.model_validate({**told, key: bad}).threads == 2
            continue
        with pytest.raises(ValueError, match=why):
            ClientSettings.model_validate({**told, key: bad})
    with pytest.raises(ValidationError, match="ratio"):  # a server-only setting is no client's
        ClientSettings.model_validate({**told, "ratio": 0.5})
    with pytest.raises(ValidationError):  # frozen
        ClientSettings.model_validate(told).lr = 1.0  # type: ignore[misc]


def test_the_records_derive_the_model_groups_as_the_config_does():
    for cfg in (RunConfig(), RunConfig(models=["preresnet18"], method="HeteroFL", width_rates=[1.0, 0.5])):
        for record in (ClientSettings.of(cfg), ServerSettings.of(cfg)):
            assert (record.groups, record.levels, record.bn_at_eval) == (cfg.groups, cfg.levels, cfg.bn_at_eval)
    vit = RunConfig(models=["vit_d8"], vit_epoch_scale="all", dataset="cifar10")
    assert ServerSettings.of(vit).scales_epochs and not hasattr(ClientSettings.of(vit), "scales_epochs")


def test_the_partition_digest_covers_every_partition_setting_but_paths():
    cfg = RunConfig()
    base = PartitionSettings.of(cfg).model_dump(mode="json")
    assert PartitionSettings.of(cfg).digest() == partition_digest(base)
    for key, value in [("alpha", 0.1), ("min_size", 3), ("partition_seed", 1), ("normalize", "half"), ("clients", 7)]:
        assert key in DIGESTED and partition_digest({**base, key: value}) != partition_digest(base)
    assert "release_partitions" not in DIGESTED  # a path: each site's own
    assert partition_digest({**base, "release_partitions": "/elsewhere"}) == partition_digest(base)
    assert json.loads(json.dumps(base)) == base  # what a file holds reads back to the same digest


ENTRY_POINTS = {"fl/engine/run.py", "fl/engine/simulator.py", "fl/engine/device.py"}  # read a RunConfig


def test_no_stage_trainer_evaluator_or_method_component_takes_the_whole_config():
    """Under fl/, only the entry points import RunConfig: every other module takes its side's record."""
    takers = []
    for path in sorted((SRC / "fl").rglob("*.py")):
        name = path.relative_to(SRC).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and any(a.name == "RunConfig" for a in node.names):
                takers.append(name)
    assert sorted(set(takers)) == sorted(ENTRY_POINTS)


SERVER_LOADS = """
import sys, incofl.deploy.server.serverapp
from incofl.registry import METHODS
from incofl.spec import GROUPS, WIDTH_LAYOUT
for m in METHODS.values():  # every class a server's build loads: the server halves, then the layouts
    [c.cls for c in (m.objective, m.aggregator, *m.pre, *m.post, *m.observers, m.planner)]
GROUPS.cls, WIDTH_LAYOUT.cls
print(' '.join(m for m in sys.modules if m.startswith('incofl')))
"""


@pytest.mark.slow
def test_the_server_app_and_every_server_component_load_no_trainer_partitioner_augmentation_share_or_site_data():
    """What import-linter's contract says of the import graph, checked in a fresh process, with
    the classes a server's build imports by name (Component.cls) for every method: a method's
    objective module holds its two halves (fl/stages/objective.py), never the local loop."""
    loaded = set(
        subprocess.run([sys.executable, "-c", SERVER_LOADS], check=True, capture_output=True, text=True).stdout.split()
    )
    forbidden = {
        "incofl.fl.stages.trainer",
        "incofl.fl.stages.batched",
        "incofl.fl.stages.graphs",
        "incofl.fl.stages.client",
        "incofl.fl.stages.local",
        "incofl.data.partition",
        "incofl.data.augment",
        "incofl.data.shares",
        "incofl.data.sources",
        "incofl.fl.engine.clients",
        "incofl.fl.engine.simulator",
    }
    assert {"incofl.fl.engine.server", "incofl.fl.methods.objectives.scaffold"} <= loaded
    assert not loaded & forbidden, loaded & forbidden
    assert not [m for m in loaded if m.startswith("incofl.deploy.site")]
