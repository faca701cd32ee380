"""The console script's `--set`: repeated options add up (`--set a=1 --set b=2` = `--set a=1 b=2`),
for every subcommand that takes it; before, only the last `--set` counted and the run silently
used the config's value for every key set earlier."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from incofl.cli import build_parser
from incofl.data.partition import Partition

REPO = Path(__file__).resolve().parents[1]
INCOFL = Path(sys.executable).parent / "incofl"
TINY = REPO / "tests" / "data" / "tiny.yaml"  # clients: 8, alphas: [0.5], synthetic data (no download)


def partition(tmp_path: Path, *sets: str) -> tuple[str, Partition]:
    """`incofl partition` on the tiny config, cache and artifact in tmp_path: its line and artifact."""
    out = tmp_path / "p.npz"
    cmd = [str(INCOFL), "partition", "-c", str(TINY), *sets, "--out", str(out)]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, Partition.load(out)


@pytest.mark.slow
@pytest.mark.parametrize(
    "sets",
    [
        ["--set", "clients=10", "--set", "alpha=1.0", "--set", "cache_dir=cache"],
        ["--set", "clients=10", "alpha=1.0", "cache_dir=cache"],
        ["-s", "clients=10", "-s", "alpha=1.0", "cache_dir=cache"],
    ],
    ids=["repeated", "one-list", "short-mixed"],
)
def test_every_set_takes_effect(tmp_path, sets):
    line, part = partition(tmp_path, *sets)
    assert "alpha=1.0" in line and ", 10 clients," in line, line
    assert len(part.parts) == 10 and part.meta["alpha"] == 1.0 and part.meta["clients"] == 10
    assert (tmp_path / "cache" / "synthetic.npz").exists()  # cache_dir took effect too


@pytest.mark.parametrize("command", ["prepare", "partition", "train"])
def test_set_accumulates_for_every_subcommand(command):
    parser = build_parser()
    extra = [] if command == "prepare" else ["--out", "x"]
    args = parser.parse_args([command, "--set", "a=1", "--set", "b=2", "c=3", "-s", "d=4", *extra])
    assert args.set == ["a=1", "b=2", "c=3", "d=4"]
    assert parser.parse_args([command, *extra]).set == []  # the default list is not shared between parses


@pytest.mark.slow
def test_train_without_a_config_runs_on_the_built_in_defaults(tmp_path):
    """No --config: digits with the embedded experiment's federation (100 clients could not each get 10 images)."""
    out = tmp_path / "run"
    sets = ["rounds=1", "models=[resnet10]", "eval_last=0", "progress=false", "cache_dir=cache"]
    cmd = [str(INCOFL), "train", "--out", str(out), "--set", *sets]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == "digits" and summary["config"]["clients"] == 20 and summary["rounds"] == 1
