"""A run stopped after a round and resumed from its checkpoint ends as the run never stopped,
for every registered method (parametrised from the registry: a new method is tested by being
registered), for a post transform that keeps state (docs/add-a-method.md's server momentum),
and after SIGKILLs at random moments for a sample of methods."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from helpers import QUIET, small_synthetic

from incofl.config import RunConfig, load_run_config
from incofl.fl.engine import checkpoint
from incofl.fl.engine.checkpoint import CheckpointMismatch
from incofl.fl.engine.simulator import train
from incofl.registry import METHODS, Component, Method, register

ROUNDS, STOP = 3, 2  # stopped after round 2 of 3: the resumed run trains round 3 from the checkpoint
# the cheapest settings that make every kind of method keep state: two model groups (one
# federation each under group-wise aggregation), two of four clients a round (so clients return
# to state they kept), a warm-up of one round for FedLAG and FedPart (the rounds after it plan
# from what was learnt)
BASE = {
    **QUIET,
    "clients": 4,
    "ratio": 0.5,
    "rounds": ROUNDS,
    "batch_size": 16,
    "models": ["resnet10", "resnet14"],
    "model_scale": 0.25,
    "checkpoint_every": 1,
    "eval_last": ROUNDS,
}
ARGS = {"FedLAG": {"warmup": 1, "top_k": 2}, "FedPart": {"warmup": 1, "rounds_per_group": 1}}


def settings(name: str) -> dict[str, Any]:
    """What a method needs of a run, from its registry entry (Method.check's requirements)."""
    method = METHODS[name]
    out: dict[str, Any] = {**BASE, "method": name}
    if method.width:  # one architecture cut in width: two levels
        model = "resnet110" if method.objective.exits else "preresnet18"
        out |= {"models": [model], "width_rates": [1.0, 0.5], "model_scale": 0.125}
    if method.planner.personal:
        out["holdout"] = 0.25
    family = "FedLAG" if method.planner.name == "LagPlanner" else "FedPart" if method.partial else None
    return {**out, "method_args": ARGS.get(family, {})}


@pytest.fixture(scope="module")
def data():
    return small_synthetic(96)


def outputs(out: Path) -> tuple[dict[str, Any], pd.DataFrame]:
    """The run's summary (state_sha256: its weights' hash) and metrics, the clock's figures aside."""
    summary = json.loads((out / "summary.json").read_text())
    timeless = {k: v for k, v in summary.items() if k not in ("wall_s", "samples_per_s")}
    return timeless, pd.read_csv(out / "metrics.csv").drop(columns="seconds")


def straight_and_resumed(cfg: RunConfig, data, tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """An uninterrupted run, and one restarted from that run's checkpoint after round STOP."""
    save = checkpoint.save

    def keep(path: Path, payload: dict) -> None:
        save(path, payload)
        if payload["round"] == STOP:
            shutil.copy(path, tmp_path / "stopped.pt")

    monkeypatch.setattr(checkpoint, "save", keep)
    train(cfg, tmp_path / "straight", data=data)
    monkeypatch.undo()
    (tmp_path / "resumed").mkdir()
    shutil.copy(tmp_path / "stopped.pt", tmp_path / "resumed" / "ckpt.pt")
    train(cfg, tmp_path / "resumed", data=data)
    assert f"after round {STOP}" in (tmp_path / "resumed" / "train.log").read_text()
    return tmp_path / "straight", tmp_path / "resumed"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_resumes_bit_identically(name, data, tmp_path, monkeypatch):
    straight, resumed = straight_and_resumed(RunConfig(**settings(name)), data, tmp_path, monkeypatch)
    (summary, metrics), (summary_resumed, metrics_resumed) = outputs(straight), outputs(resumed)
    assert summary["state_sha256"] == summary_resumed["state_sha256"] and summary == summary_resumed
    pd.testing.assert_frame_equal(metrics, metrics_resumed)


def momentum_example() -> type:
    """docs/add-a-method.md's post transform with state (its 'State across rounds' example)."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "add-a-method.md").read_text()
    code = re.search(r"## State across rounds.*?```python\n(.*?)```", doc, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "docs/add-a-method.md", "exec"), namespace)
    return namespace["ServerMomentum"]


@pytest.fixture
def momentum():
    register(Method("FedAvgM", post=(Component(momentum_example()),), source="server momentum (example)"))
    yield "FedAvgM"
    METHODS.pop("FedAvgM")


@pytest.mark.slow
def test_a_post_transform_with_state_resumes_bit_identically(momentum, data, tmp_path, monkeypatch):
    """Its buffers are checkpointed by construction (one per federation: two model groups);
    without them the resumed run's round 3 would start from empty buffers and differ."""
    cfg = RunConfig(**settings(momentum))
    straight, resumed = straight_and_resumed(cfg, data, tmp_path, monkeypatch)
    assert outputs(straight)[0]["state_sha256"] == outputs(resumed)[0]["state_sha256"]
    stopped = checkpoint.load(tmp_path / "stopped.pt", cfg.model_dump())["engine"]["components"]["post.0"]
    assert sorted(stopped["buffers"]) == [0, 1]
    plain = RunConfig(**settings("FedAvg"))
    train(plain, tmp_path / "plain", data=data)
    assert outputs(tmp_path / "plain")[0]["state_sha256"] != outputs(straight)[0]["state_sha256"]  # it moves them


def test_a_checkpoint_of_other_components_is_refused_naming_the_role(data, tmp_path):
    cfg = RunConfig(**{**settings("FedAvg"), "rounds": 1, "keep_checkpoint": True})
    train(cfg, tmp_path / "run", data=data)
    payload = checkpoint.load(tmp_path / "run" / "ckpt.pt", cfg.model_dump())
    payload["engine"]["kinds"]["post.0"] = "ServerMomentum"
    checkpoint.save(tmp_path / "run" / "ckpt.pt", payload)
    (tmp_path / "run" / "summary.json").unlink()
    with pytest.raises(
        CheckpointMismatch,
        match=r"ckpt.pt: components: the checkpoint's post.0 is ServerMomentum, "
        r"this run's absent; delete the checkpoint",
    ):
        train(cfg, tmp_path / "run", data=data)


# a seeded draw of one method (the test names it); InCoAvg is killed at random moments in test_reliability
KILLED = random.Random(0).sample(sorted(set(METHODS) - {"InCoAvg"}), 1)


def experiment(name: str, tmp_path: Path) -> Path:
    """The method's settings as an experiment config for `incofl train` (24 images a client)."""
    run = {k: v for k, v in settings(name).items() if k not in ("dataset", "method", "method_args")}
    config = {
        **run,
        "datasets": ["synthetic"],
        "methods": [name],
        "partition": "iid_draw",
        "client_samples": 24,
        "per_method": {name: {"method_args": settings(name)["method_args"]}},
        "cache_dir": str(tmp_path / "cache"),
        "rounds": 6,
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", KILLED)
def test_sigkilled_at_random_moments_resumes_bit_identically(name, tmp_path):
    """`incofl train` killed (SIGKILL) at a random moment after its first trained round (in the
    evaluation or the checkpoint write after it), started again and killed at a random moment
    after a checkpoint is on disk, then run to the end: it equals the run never killed."""
    path = experiment(name, tmp_path)
    train(load_run_config(path), tmp_path / "straight")
    out, rng, command = tmp_path / "killed", random.Random(name), [sys.executable, "-m", "incofl.cli", "train"]
    log, ckpt = out / "train.log", out / "ckpt.pt"
    waits = [lambda: log.exists() and " trained in " in log.read_text(), ckpt.exists]
    for reached in waits:
        proc = subprocess.Popen([*command, "--config", str(path), "--out", str(out)], stderr=subprocess.DEVNULL)
        while proc.poll() is None and not reached():
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.5))
        assert proc.poll() is None, "the run ended before it was killed: make it longer"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert subprocess.run([*command, "--config", str(path), "--out", str(out)], timeout=600).returncode == 0
    assert "resumed from" in log.read_text()
    (summary, metrics), (summary_killed, metrics_killed) = outputs(tmp_path / "straight"), outputs(out)
    assert summary["state_sha256"] == summary_killed["state_sha256"] and summary == summary_killed
    pd.testing.assert_frame_equal(metrics, metrics_killed)
