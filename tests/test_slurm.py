"""The workflow through the SLURM profile (profiles/slurm) on a running cluster (CI: the
one-node cluster of .ci/slurm-up.sh): tests/data/tiny.yaml with `resources.runs_per_gpu: 2`,
the suite's one SLURM run. prepare and partition are SLURM jobs of their own; the two training
runs (and their batch record) are ONE SLURM job sharing one GPU; the Table 2 it gives equals
the local run's (conftest.py's tiny_run). How a single training job asks for its GPU is the
dry run's (tests/test_workflow.py)."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from helpers import unavailable
from workflows import ENV, REPO, snakemake_cmd


@functools.cache
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
    pytest.mark.xdist_group("tiny_run"),
    pytest.mark.timeout(1800),
]


@pytest.fixture(scope="session", autouse=True)
def cluster() -> None:
    """Session scope: checked before the session's tiny_run is made."""
    if not _cluster_up():
        unavailable("no SLURM cluster (`sinfo` fails); CI starts one")


# Training asks for a GPU (on the CI cluster a fake one; torch, device auto, uses the CPU), and
# with runs_per_gpu 2 (README, "Several runs per GPU") both runs share one job and that GPU.
SHARED = "resources={gpu: 1, runtime: 10, mem_mb: 1000, runs_per_gpu: 2}"


def run_slurm(workdir: Path, *args: str) -> str:
    """The workflow through the profile, under `timeout -s INT`: at the limit Snakemake cancels
    its SLURM jobs (README, "SLURM details"). Its log (stdout and stderr)."""
    cmd = ["timeout", "-s", "INT", "-k", "30", "600", *snakemake_cmd(workdir, "--profile", "profiles/slurm", *args)]
    proc = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    return log


def slurm_jobs(log: str) -> dict[str, str]:
    """SLURM job id -> `rule_<rule>` or `group_<group>_<its rules>` (the plugin's log folder)."""
    return {m[1]: m[2] for m in re.finditer(r"SLURM jobid (\d+) \(log: \S*/slurm_logs/((?:rule|group)_\w+)/", log)}


def scontrol(job: str) -> str:
    return subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout


def test_slurm_run_trains_side_by_side_in_one_job_and_equals_the_local_run(tmp_path, tiny_run):
    """prepare and partition are SLURM jobs; the tiny config's 2 training runs (and their batch
    record) are ONE SLURM job asking for one GPU, 2 x 1,000 MB, 2 x 1 CPU and 10 + 1 minutes;
    inside it one Snakemake starts both runs at once (its log is kept); the table is the local
    run's."""
    log = run_slurm(tmp_path, "--slurm-keep-successful-logs", "--config", SHARED)

    jobs = slurm_jobs(log)
    assert {"rule_prepare", "rule_partition"} <= set(jobs.values()) and "rule_train" not in jobs.values(), log[-5000:]
    grouped = [job for job, name in jobs.items() if name.startswith("group_")]
    assert [jobs[job] for job in grouped] == ["group_gpu_train_train_batch"], log[-5000:]
    job = grouped[0]
    info = scontrol(job)
    assert "TresPerNode=gres:gpu:1" in info and "TresPerJob" not in info, info  # one GPU, not 2
    assert "mem=2000M" in info and "NumCPUs=2" in info and "TimeLimit=00:11:00" in info, info

    record = (tmp_path / "results" / "logs" / "train" / "batches" / "b0.txt").read_text().splitlines()
    assert record[0].startswith(f"slurm_job={job} ") and not record[0].endswith("gpus="), record
    assert sorted(record[1:]) == sorted(
        f"results/runs/synthetic/a0.5/{m}/s0/summary.json" for m in ("FedAvg", "InCoAvg")
    )
    # the group's log: the Snakemake inside the SLURM job's srun step starts both runs at once
    group_log = next((tmp_path / ".snakemake" / "slurm_logs" / "group_gpu_train_train_batch").rglob(f"{job}.log"))
    inner = group_log.read_text().split("Provided cores:", 1)[1]
    started = inner.split("Execute 2 jobs...", 1)[1].split("Finished jobid", 1)[0]
    assert started.count("localrule train:") == 2, inner

    ours = pd.read_csv(tmp_path / "results" / "tables" / "table2.csv")
    pd.testing.assert_frame_equal(ours, pd.read_csv(tiny_run / "results" / "tables" / "table2.csv"))
    assert ours["n_seeds"].tolist() == [1, 1]
