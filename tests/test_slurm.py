"""The workflow through the SLURM profile (profiles/slurm) on a running cluster (CI: the
one-node cluster of .ci/slurm-up.sh): tests/data/tiny.yaml, each job a SLURM job, the
training jobs asking for a GPU, gives the same Table 2 as the same config run locally."""

from __future__ import annotations

import re
import shutil
import subprocess

import pandas as pd
import pytest
from test_workflow import ENV, REPO, run_snakemake, snakemake_cmd


def _cluster_up() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=20).returncode == 0
    except subprocess.TimeoutExpired:
        return False


pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.skipif(not _cluster_up(), reason="no SLURM cluster (`sinfo` fails); CI starts one"),
]

# Training jobs ask for a GPU: on the CI cluster a fake one, and torch (device auto) uses the CPU.
RESOURCES = "resources={gpu: 1, runtime: 10, mem_mb: 1000}"


def test_slurm_run_equals_local_run(tmp_path):
    local = run_snakemake(tmp_path / "local", "--cores", "2")
    assert local.returncode == 0, local.stderr[-3000:]

    # under `timeout -s INT`: at the limit Snakemake cancels its SLURM jobs (README, "SLURM details")
    cmd = [
        "timeout",
        "-s",
        "INT",
        "-k",
        "30",
        "900",
        *snakemake_cmd(tmp_path / "slurm", "--profile", "profiles/slurm", "--config", RESOURCES),
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]

    jobs = {m[1]: m[2] for m in re.finditer(r"SLURM jobid (\d+) \(log: \S*/slurm_logs/rule_(\w+)/", log)}
    assert {"prepare", "partition", "train"} <= set(jobs.values()), log[-5000:]
    train_jobs = [job for job, rule in jobs.items() if rule == "train"]
    assert len(train_jobs) == 2
    for job in train_jobs:
        info = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
        assert "TresPerJob=gres:gpu:1" in info and "mem=1000M" in info and "TimeLimit=00:10:00" in info, info

    ours, theirs = (pd.read_csv(tmp_path / d / "results" / "tables" / "table2.csv") for d in ("slurm", "local"))
    pd.testing.assert_frame_equal(ours, theirs)
    assert ours["n_seeds"].tolist() == [1, 1]
