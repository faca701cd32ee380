"""DVC after a clone: in a temporary git repository made from this working tree (with
tests/data/tiny.yaml as config/config.yaml), `dvc repro` runs the workflow and writes
results/metrics.json, `dvc metrics show` reads it, `dvc plots show` renders with no network
(the offline template), and `dvc exp run -S` reruns the affected training runs."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from workflows import ENV, REPO, TINY

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # end to end: the README's test table

GIT_ENV = {
    **ENV,
    "DVC_NO_ANALYTICS": "1",
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@example.com",
}


def sh(cwd: Path, *cmd: str, timeout: int = 900) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=GIT_ENV, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A git clone of the working tree as it would be committed, with the tiny config as default."""
    root = tmp_path_factory.mktemp("dvc")
    src, dst = root / "src", root / "clone"
    files = sh(REPO, "git", "ls-files", "--cached", "--others", "--exclude-standard", "-z").split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file() and not name.startswith(("results/", "resources/")):
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    shutil.copy(TINY, src / "config" / "config.yaml")
    sh(src, "git", "init", "-q")
    sh(src, "git", "add", "-A")
    sh(src, "git", "commit", "-qm", "tiny default config")
    sh(root, "git", "clone", "-q", str(src), str(dst))
    sh(dst, "dvc", "repro")
    return dst


def test_repro_writes_metrics_that_dvc_reads(clone):
    metrics = json.loads(sh(clone, "dvc", "metrics", "show", "--json"))
    (workspace,) = metrics.values()
    values = workspace["data"]["results/metrics.json"]["data"]["synthetic"]["a0.5"]
    assert set(values) == {"FedAvg", "InCoAvg"} and 0 <= values["FedAvg"]["mean"] <= 100
    assert "up to date" in sh(clone, "dvc", "status")


@pytest.mark.parametrize("flag", [[], ["--html-template", "workflow/dvc/offline.html"]], ids=["config", "flag"])
def test_plots_render_offline(clone, flag, tmp_path):
    sh(clone, "dvc", "plots", "show", "-o", str(tmp_path), *flag)
    html = (tmp_path / "index.html").read_text()
    assert "<script src=" not in html and "cdn.jsdelivr" not in html  # nothing loaded from a network
    for lib in ("vega 5.20.2", "vega-lite 5.2.0", "vega-embed 6.18.2"):
        assert f"<!-- {lib} " in html
    assert "vegaEmbed('#results_plots_curves_csv'" in html


def test_exp_run_set_param_reruns_the_runs(clone):
    sh(clone, "git", "add", "-A")
    sh(clone, "git", "commit", "-qm", "dvc repro")
    sh(clone, "dvc", "exp", "run", "-S", "config/config.yaml:rounds=3")
    for method in ("FedAvg", "InCoAvg"):
        summary = json.loads((clone / "results/runs/synthetic/a0.5" / method / "s0/summary.json").read_text())
        assert summary["rounds"] == 3
    rows = json.loads(sh(clone, "dvc", "exp", "show", "--json"))
    exps = [rev for row in rows for exp in row.get("experiments") or [] for rev in exp["revs"]]
    assert [rev["data"]["params"]["config/config.yaml"]["data"]["rounds"] for rev in exps] == [3]
