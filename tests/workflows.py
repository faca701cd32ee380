"""Running the Snakemake workflow from the tests (importable: pytest puts tests/ on sys.path).
tests/test_workflow.py, test_slurm.py, test_dvc.py and the others that start Snakemake share
these; the one real local run of tests/data/tiny.yaml is conftest.py's `tiny_run`."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TINY = REPO / "tests" / "data" / "tiny.yaml"
TINY_ANALYSIS = REPO / "tests" / "data" / "tiny-analysis.yaml"
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}


def package_with_family(tmp: Path, name: str = "FedAvgNew") -> Path:
    """A copy of the package with one more method family folder, `zfamily/`, holding only a spec
    that registers `name` (FedAvg's stages): the folder to put first on PYTHONPATH."""
    src = tmp / "src"
    shutil.copytree(REPO / "src" / "incofl", src / "incofl", ignore=shutil.ignore_patterns("__pycache__"))
    family = src / "incofl" / "fl" / "methods" / "zfamily"
    family.mkdir()
    (family / "__init__.py").write_text("")
    (family / "spec.py").write_text(f'from incofl.spec import Method\n\nMETHODS = (Method("{name}"),)\n')
    return src


def snakemake_cmd(workdir: Path, *args: str, config: Path = TINY) -> list[str]:
    """The experiment joins the `--config` items of `args` (a second --config would replace them)."""
    args = list(args) if "--config" in args else [*args, "--config"]
    args.insert(args.index("--config") + 1, f"experiment={config}")
    return [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "--directory", str(workdir), *args]


def run_snakemake(workdir: Path, *args: str, config: Path = TINY, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        snakemake_cmd(workdir, *args, config=config), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout
    )


def planned_jobs(workdir: Path, *args: str, config: Path = TINY) -> dict[str, int]:
    """Jobs per rule of a dry run (empty when nothing is to be done)."""
    proc = run_snakemake(workdir, "--dry-run", "--quiet", "rules", *args, config=config)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    text = proc.stdout + proc.stderr
    if "Job stats:" not in text:
        assert "Nothing to be done" in text, text
        return {}
    table = text.split("Job stats:", 1)[1].split("total", 1)[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.M)}


def _start(workdir: Path, config: Path) -> subprocess.Popen:
    """Snakemake in a process group of its own (signalled with its training job, as Ctrl-C in a
    terminal would), SIGINT at its default even when the tests run in the background (nohup, &),
    where it is ignored and the ignoring is inherited."""
    return subprocess.Popen(
        snakemake_cmd(workdir, "--cores", "1", config=config),
        cwd=REPO,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _signal_when(proc: subprocess.Popen, ready: Callable[[], bool], sig: signal.Signals, what: str) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None and not ready():
        time.sleep(0.02)
    try:
        assert proc.poll() is None, f"the workflow ended before {what}"
    finally:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=120)


def run_interrupted(workdir: Path, config: Path = TINY) -> dict[str, str]:
    """The workflow of a config with two runs (one data set, alpha and seed), interrupted twice and
    resumed: kill -9 of the whole process group once one run has finished and the other has a
    checkpoint; after `--unlock`, Ctrl-C (SIGINT) once that other run has resumed; then a rerun to
    the end. Returns which run finished first and that run's summary's mtime before the reruns,
    and writes them to `interruptions.json` in `workdir`."""
    raw = yaml.safe_load(config.read_text())
    runs = workdir / "results" / "runs" / raw["datasets"][0] / f"a{raw['alphas'][0]}"
    methods = raw["methods"]
    finished: list[str] = []

    def one_finished_other_checkpointed() -> bool:
        finished[:] = [m for m in methods if (runs / m / "s0" / "summary.json").exists()]
        return len(finished) == 1 and any((runs / m / "s0" / "ckpt.pt").exists() for m in methods if m not in finished)

    _signal_when(_start(workdir, config), one_finished_other_checkpointed, signal.SIGKILL, "a run had finished")
    (first,) = finished
    (second,) = set(methods) - {first}
    assert not (runs / second / "s0" / "summary.json").exists()
    record = {"first": first, "second": second, "mtime": str((runs / first / "s0" / "summary.json").stat().st_mtime_ns)}
    assert run_snakemake(workdir, "--unlock", config=config).returncode == 0  # kill -9 left Snakemake's lock

    def resumed() -> bool:
        log = runs / second / "s0" / "train.log"
        return log.exists() and "resumed from" in log.read_text()

    _signal_when(_start(workdir, config), resumed, signal.SIGINT, "the second run resumed")
    rerun = run_snakemake(workdir, "--cores", "2", config=config)  # rerun-incomplete: profiles/default
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    (workdir / "interruptions.json").write_text(json.dumps(record))
    return record
