"""DVC on a clone of the working tree as committed (README, "Reproduce with DVC"): every stage
is up to date without a remote, `dvc metrics show` lists every experiment and `dvc metrics diff`
compares commits, `dvc plots show` renders offline; an edit to training code flags the training
stages (and report code only the report stages), and Snakemake reruns training for it; a report
stage remakes its committed table byte for byte; `dvc exp run -S` runs the default stages on the
tiny config; cached outputs go to a local-directory remote and come back."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from workflows import ENV, REPO, TINY

from incofl.codehash import TRAINING_CODE

# One worker makes the module's clones once (xdist group); end to end: the README's test table.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("dvc"), pytest.mark.timeout(1800)]

GIT_ENV = {
    **ENV,
    "DVC_NO_ANALYTICS": "1",
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@example.com",
}
STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
METRICS = sorted(path for stage in STAGES.values() for entry in stage.get("metrics", []) for path in entry)
PLOTS = sorted(path for stage in STAGES.values() for entry in stage.get("plots", []) for path in entry)
TRAINING = ["train@", "digits-train"]  # the training stages' names start with these


def sh(cwd: Path, *cmd: str, timeout: int = 900) -> str:
    # each clone runs its own package (as an editable install of the clone would)
    env = {**GIT_ENV, "PYTHONPATH": str(cwd / "src")}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def committed(tmp_path_factory) -> Path:
    """A git repository holding the working tree as it would be committed (tracked files and
    untracked ones git does not ignore), results included."""
    src = tmp_path_factory.mktemp("committed")
    files = sh(REPO, "git", "ls-files", "--cached", "--others", "--exclude-standard", "-z").split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    sh(src, "git", "init", "-q")
    sh(src, "git", "add", "-A")
    sh(src, "git", "commit", "-qm", "the working tree")
    return src


def clone(committed: Path, dst: Path) -> Path:
    sh(dst.parent, "git", "clone", "-q", str(committed), str(dst))
    return dst


def changed_stages(repo: Path) -> set[str]:
    return set(json.loads(sh(repo, "dvc", "status", "--json")))


def test_training_stages_depend_on_the_hashed_training_code():
    """dvc.yaml's training stages and Snakemake's code hash (incofl.codehash) cover the same files."""
    code = {f"src/incofl/{name}" for name in TRAINING_CODE}
    assert set(STAGES["train"]["do"]["deps"]) == code
    assert set(STAGES["digits-train"]["deps"]) - {"Snakefile", "workflow/rules", "workflow/schemas"} == code


def test_fresh_clone_is_up_to_date_and_shows_every_experiment(committed, tmp_path):
    repo = clone(committed, tmp_path / "clone")
    assert "Data and pipelines are up to date." in sh(repo, "dvc", "status")
    (workspace,) = json.loads(sh(repo, "dvc", "metrics", "show", "--json")).values()
    assert sorted(workspace["data"]) == METRICS and len(METRICS) == 9
    for path, shown in workspace["data"].items():
        assert "error" not in shown and shown["data"], path
    paired = workspace["data"]["results/evidence-inco-vs-heteroavg/dvc/metrics.json"]["data"]["paired"]
    assert paired["InCoAvg - HeteroAvg"]["cifar10"]["a0.5"]["final_acc"]["n"] == 5


@pytest.mark.parametrize("flag", [[], ["--html-template", "workflow/dvc/offline.html"]], ids=["config", "flag"])
def test_plots_render_offline(committed, flag, tmp_path):
    repo = clone(committed, tmp_path / "clone")
    sh(repo, "dvc", "plots", "show", "-o", str(tmp_path / "plots"), *flag)
    html = (tmp_path / "plots" / "index.html").read_text()
    assert "<script src=" not in html and "cdn.jsdelivr" not in html  # nothing loaded from a network
    for lib in ("vega 5.20.2", "vega-lite 5.2.0", "vega-embed 6.18.2"):
        assert f"<!-- {lib} " in html
    for path in PLOTS:  # one plot per file, its element id the path with / and . as _
        assert f"vegaEmbed('#{path.replace('/', '_').replace('.', '_')}'" in html, path


def test_metrics_diff_compares_two_commits(committed, tmp_path):
    repo = clone(committed, tmp_path / "clone")
    path = repo / "results/evidence-fedlag/dvc/metrics.json"
    metrics = json.loads(path.read_text())
    metrics["runs-fedlag"]["cifar10"]["a0.1"]["FedLAG"]["mean"] += 1.0
    path.write_text(json.dumps(metrics))
    sh(repo, "git", "commit", "-qam", "a metric moved")
    diff = json.loads(sh(repo, "dvc", "metrics", "diff", "HEAD~1", "HEAD", "--json"))
    (changed,) = diff["results/evidence-fedlag/dvc/metrics.json"].items()
    assert changed[0] == "runs-fedlag.cifar10.a0.1.FedLAG.mean" and changed[1]["diff"] == pytest.approx(1.0)


def test_a_code_edit_flags_the_stages_that_run_it(committed, tmp_path):
    """Report code flags the report stages only; training code flags every training stage."""
    repo = clone(committed, tmp_path / "clone")
    with (repo / "src/incofl/report/tables.py").open("a") as f:
        f.write("\nREPORT_EDIT = 1\n")
    changed = changed_stages(repo)
    assert changed == {name for name in STAGES if name.endswith("-report") or name.startswith("report-")}
    with (repo / "src/incofl/fl/stages/aggregate.py").open("a") as f:
        f.write("\nTRAINING_EDIT = 1\n")
    runs = yaml.safe_load((repo / "workflow/dvc/runs.yaml").read_text())["runs"]
    assert changed_stages(repo) == changed | {"digits-train"} | {f"train@{key}" for key in runs}


def test_report_stage_remakes_its_committed_table(committed, tmp_path):
    repo = clone(committed, tmp_path / "clone")
    sh(repo, "dvc", "repro", "--force", "--single-item", "report-fedlag")
    assert sh(repo, "git", "status", "--porcelain") == ""  # every output byte for byte, dvc.lock too


def test_cached_outputs_go_to_a_local_remote_and_back(committed, tmp_path):
    """A user with storage turns an output's cache on and pushes it (README, "Reproduce with DVC")."""
    repo = clone(committed, tmp_path / "clone")
    out = "results/evidence-fidelity/collapse.pdf"
    dvc_yaml = repo / "dvc.yaml"
    dvc_yaml.write_text(dvc_yaml.read_text().replace(f"{out}: {{cache: false}}", f"{out}: {{cache: true}}"))
    sh(repo, "git", "rm", "-q", "--cached", out)  # DVC's cache holds it now, not git
    sh(repo, "dvc", "commit", "--force", "report-collapse")
    sh(repo, "dvc", "remote", "add", "-d", "storage", str(tmp_path / "storage"))
    assert "1 file pushed" in sh(repo, "dvc", "push")
    original = (repo / out).read_bytes()
    (repo / out).unlink()
    shutil.rmtree(repo / ".dvc" / "cache")
    sh(repo, "dvc", "pull")
    assert (repo / out).read_bytes() == original


# --- the default stages on the tiny config: one real run for the file ---------------------
@pytest.fixture(scope="module")
def experiment(committed, tmp_path_factory) -> Path:
    """A clone with tests/data/tiny.yaml as the default config, its runs made by
    `dvc exp run -S config/config.yaml:rounds=3 digits-report` (digits-train and digits-report, in the
    workspace)."""
    repo = clone(committed, tmp_path_factory.mktemp("exp") / "clone")
    shutil.copy(TINY, repo / "config" / "config.yaml")
    for made in ("results/runs", "results/partitions"):  # the committed digits runs: another experiment
        shutil.rmtree(repo / made)
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", "tiny default config")
    # the default experiment's stages only: were the evidence stages out of date (training code
    # edited without `dvc commit`), a bare `dvc exp run` would retrain them, for days
    sh(repo, "dvc", "exp", "run", "-S", "config/config.yaml:rounds=3", "digits-report")
    return repo


def test_exp_run_set_param_shows_beside_the_baseline(experiment):
    for method in ("FedAvg", "InCoAvg"):
        summary = json.loads((experiment / "results/runs/synthetic/a0.5" / method / "s0/summary.json").read_text())
        assert summary["rounds"] == 3
    rows = json.loads(sh(experiment, "dvc", "exp", "show", "--json"))
    (baseline,) = [row for row in rows if row["rev"] != "workspace"]
    (exp,) = [rev for e in baseline["experiments"] for rev in e["revs"]]
    assert exp["data"]["params"]["config/config.yaml"]["data"]["rounds"] == 3
    assert baseline["data"]["params"]["config/config.yaml"]["data"]["rounds"] == 2
    metrics = exp["data"]["metrics"]["results/dvc/metrics.json"]["data"]["runs"]["synthetic"]["a0.5"]
    assert set(metrics) == {"FedAvg", "InCoAvg"} and 0 <= metrics["FedAvg"]["mean"] <= 100


def test_training_code_edit_makes_snakemake_plan_the_training_jobs(experiment, tmp_path):
    """The train rule's params hold the training code's hash: an edit reruns the runs, a comment does not."""
    repo = tmp_path / "workspace"
    shutil.copytree(experiment, repo, symlinks=True)  # with Snakemake's records and the data cache
    dry_run = ("snakemake", "runs", "--configfile", "config/config.yaml", "--dry-run")
    assert "Nothing to be done" in sh(repo, *dry_run)
    server = repo / "src/incofl/fl/stages/aggregate.py"
    server.write_text(server.read_text() + "\n# a comment changes no number\n")
    assert "Nothing to be done" in sh(repo, *dry_run)
    server.write_text(server.read_text() + "\nTRAINING_EDIT = 1\n")
    planned = sh(repo, *dry_run)
    assert "train " in planned and "Params have changed since last execution" in planned, planned
    assert {"digits-train", "digits-report"} <= changed_stages(repo)
