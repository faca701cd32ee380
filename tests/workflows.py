"""Running the Snakemake workflow from the tests (importable: pytest puts tests/ on sys.path).
tests/test_workflow.py, test_slurm.py, test_dvc.py and the others that start Snakemake share
these; the one real local run of tests/data/tiny.yaml is conftest.py's `tiny_run`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TINY = REPO / "tests" / "data" / "tiny.yaml"
TINY_ANALYSIS = REPO / "tests" / "data" / "tiny-analysis.yaml"
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}


def snakemake_cmd(workdir: Path, *args: str, config: Path = TINY) -> list[str]:
    return [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "--directory", str(workdir),
            "--configfile", str(config), *args]  # fmt: skip


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
