"""The console script's `--set`: repeated options add up (`--set a=1 --set b=2` = `--set a=1 b=2`),
for every subcommand that takes it; before, only the last `--set` counted and the run silently
used the config's value for every key set earlier."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from incofl.cli import build_parser, run
from incofl.data.partition import Partition
from incofl.models.names import RESNETS

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


# --- the report commands: --config required, --out a folder, damaged run files one line ----------
def _run_dir(root: Path, method: str, seed: int, acc: float) -> Path:
    """A finished run as the engine writes it (the fields the reports read)."""
    run_dir = root / "cifar10" / "a0.5" / method / f"s{seed}"
    run_dir.mkdir(parents=True)
    summary = {
        "method": method,
        "dataset": "cifar10",
        "alpha": 0.5,
        "seed": seed,
        "rounds": 2,
        "final_acc": acc,
        "best_acc": acc,
        "last10_acc": acc,
        "group_final_acc": [acc] * 5,
        "config": {"method": method, "method_args": {}, "models": list(RESNETS)},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / "metrics.csv").write_text(f"round,mean_acc,mean_loss\n1,{acc / 2},2.0\n2,{acc},1.0\n")
    return run_dir


@pytest.fixture
def reports(tmp_path: Path) -> tuple[Path, Path]:
    """(config, runs root): FedAvg and InCoAvg, two seeds, one cell."""
    runs = tmp_path / "runs"
    for seed in (0, 1):
        _run_dir(runs, "FedAvg", seed, 50.0 + seed)
        _run_dir(runs, "InCoAvg", seed, 55.0 + 2 * seed)
    config = tmp_path / "exp.yaml"
    grid = {"datasets": ["cifar10"], "alphas": [0.5], "methods": ["FedAvg", "InCoAvg"], "seeds": [0, 1]}
    config.write_text(yaml.safe_dump(grid))
    return config, runs


def _report_argv(command: str, config: Path | None, runs: Path, out: Path) -> list[str]:
    """`incofl <command>` over `runs` (paired: InCoAvg against FedAvg) with `out` as --out."""
    extra = {"paired": ["--method", "InCoAvg", "--base", "FedAvg"], "analysis": []}.get(command, [])
    head = ["analysis", "groups"] if command == "analysis" else [command]
    return [*head, *(["--config", str(config)] if config else []), "--runs", str(runs), "--out", str(out), *extra]


REPORTS = ["table", "figures", "paired", "metrics", "fedpart"]


def _one_line(capsys: pytest.CaptureFixture, argv: list[str], names: str) -> str:
    """Exit 2 and one line on stderr naming `names` (argparse's own errors included), no traceback."""
    try:
        code = run(argv)
    except SystemExit as stop:  # argparse
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and names in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("command", REPORTS)
def test_report_without_a_config_is_refused(reports, tmp_path, capsys, command):
    """Without --config a report would show the built-in experiment's grid: none of the runs."""
    _one_line(capsys, _report_argv(command, None, reports[1], tmp_path / "out"), "--config")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", REPORTS)
def test_report_of_runs_outside_the_config_grid_is_refused(reports, tmp_path, capsys, command):
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"datasets": ["cifar10"], "alphas": [1.0], "methods": ["FedAvg", "InCoAvg"]}))
    _one_line(capsys, _report_argv(command, other, reports[1], tmp_path / "out"), "none of its 4 runs")
    assert not (tmp_path / "out").exists()


DAMAGE = [
    ("summary.json", '{"method": "FedAvg", "dataset": "cif', "not valid JSON"),
    ("summary.json", b"\xff\xfe\x00garbage", "not valid JSON"),
    (
        "summary.json",
        '{"method": "FedAvg", "dataset": "cifar10", "seed": 1}',
        "not a run summary (bad or missing 'alpha')",
    ),
    ("metrics.csv", "", "not a readable CSV"),
]
CURVES = ("figures", "metrics", "fedpart")


# (command, damage): every report command reads summaries; those drawing curves also metrics.csv
DAMAGED = [(c, d) for c in [*REPORTS, "analysis"] for d in DAMAGE if d[0] == "summary.json" or c in CURVES]


@pytest.mark.parametrize("command,damage", DAMAGED, ids=[f"{c}-{d[0]}-{d[2][:12]}" for c, d in DAMAGED])
def test_damaged_run_file_is_one_line_naming_it(reports, tmp_path, capsys, command, damage):
    config, runs = reports
    name, content, message = damage
    damaged = runs / "cifar10" / "a0.5" / "FedAvg" / "s1" / name
    damaged.write_bytes(content if isinstance(content, bytes) else content.encode())
    err = _one_line(capsys, _report_argv(command, config, runs, tmp_path / "out"), f"{damaged}: {message}")
    assert err.startswith(f"incofl {command}: error: ")


@pytest.mark.parametrize("command", [*REPORTS, "analysis"])
def test_out_is_an_output_folder_in_every_report_command(reports, tmp_path, capsys, command):
    config, runs = reports
    _one_line(capsys, _report_argv(command, config, runs, tmp_path / "table.md"), "--out")
    assert not (tmp_path / "table.md").exists()
    assert run(_report_argv(command, config, runs, tmp_path / "out")) == 0
    written = {p.name for p in (tmp_path / "out").iterdir()}
    expected = {
        "table": "table2.md",
        "figures": "ablation.pdf",
        "paired": "paired-InCoAvg-vs-FedAvg.md",
        "metrics": "metrics.json",
        "fedpart": "fedpart.md",
        "analysis": "groups.md",
    }
    assert expected[command] in written, written


def test_paired_names_a_method_outside_the_grid(reports, tmp_path, capsys):
    config, runs = reports
    argv = ["paired", "-c", str(config), "--runs", str(runs), "--method", "InCoProx", "--base", "FedAvg"]
    _one_line(capsys, argv, "--method InCoProx: not a method of the config's grid (FedAvg, InCoAvg)")


# --- analysis names ---------------------------------------------------------------------------------
def test_analysis_names_are_the_workflow_rules_names():
    from incofl.cli import ANALYSIS_NAMES
    from incofl.report.analyses import ANALYSES, STUDIES

    assert set(ANALYSIS_NAMES) == {*ANALYSES, *STUDIES}
    rules = (REPO / "workflow" / "rules" / "common.smk").read_text()
    assert all(f'"{name}"' in rules for name in ANALYSIS_NAMES)  # GRID_ANALYSES and STUDIES there


@pytest.mark.parametrize("old,new", [("theta-beta", "theta_beta"), ("case-study", "case_study")])
def test_old_analysis_spelling_is_refused_with_the_new_one(tmp_path, capsys, old, new):
    argv = ["analysis", old, "--runs", str(tmp_path), "--out", str(tmp_path / "out")]
    err = _one_line(capsys, argv, f"{old!r} is spelled {new}")
    assert err.startswith("incofl analysis: error: ")


# --- the parser itself ------------------------------------------------------------------------------
def test_version_is_the_package_version(capsys):
    import tomllib

    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["--version"])
    assert stop.value.code == 0
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert capsys.readouterr().out.strip() == f"incofl {pyproject['project']['version']}"


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser and every subcommand's, depth first."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return [parser, *(q for s in subs for p in s.choices.values() for q in _parsers(p))]


def test_every_flag_of_every_subcommand_has_help():
    parsers = _parsers(build_parser())
    assert len(parsers) > 10  # the walk reached the subcommands
    missing = [f"{p.prog} {a.option_strings or a.dest}" for p in parsers for a in p._actions if not a.help]
    assert not missing, missing


def test_docs_commands_md_is_generated_from_the_parser():
    """docs/commands.md documents every flag once, from its help text: regenerate it with
    `python -m incofl.clidoc > docs/commands.md` after changing the parser."""
    from incofl.clidoc import markdown

    assert (REPO / "docs" / "commands.md").read_text() == markdown(), "docs/commands.md is stale"
    flags = {s for p in _parsers(build_parser()) for a in p._actions for s in a.option_strings} - {"-h", "--help"}
    assert all(f"`{flag}`" in markdown() for flag in flags)
    rows = [line for line in markdown().splitlines() if line.startswith("| `")]
    assert len(rows) > len(flags) / 2 and not any("<" in row for row in rows)  # Markdown would take <x> for HTML
