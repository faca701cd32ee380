"""The Snakemake workflow (the schema's sync with the config model: tests/test_schema.py): every
shipped config is valid, a dry run plans exactly the grid's jobs, a bad config stops the workflow
before any job with the key in the message, a local run of tests/data/tiny.yaml produces the
tables, figures, metrics and report, a config change reruns exactly the affected jobs, and a
killed workflow resumes without redoing finished runs."""

from __future__ import annotations

import json
import re
import subprocess

import jsonschema
import pandas as pd
import pytest
import yaml
from workflows import ENV, REPO, TINY, TINY_ANALYSIS, package_with_family, planned_jobs, run_snakemake, snakemake_cmd

from incofl.config import validate_experiment
from incofl.registry import METHODS

SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
CONFIGS = sorted((REPO / "config").glob("*.yaml")) + [TINY, TINY_ANALYSIS]


def grid_jobs(cfg: dict) -> dict[str, int]:
    """The jobs a config's grid needs from scratch."""
    exp = validate_experiment(cfg)
    runs = len(exp.datasets) * len(exp.alphas) * len(exp.methods) * len(exp.seeds)
    parts = {
        (s.clients, s.partition_seed)
        for s in (exp.run_config(exp.datasets[0], exp.alphas[0], m, 0) for m in exp.methods)
    }
    return (
        {
            "experiment_config": 1,
            "prepare": len(exp.datasets),
            "run_config": runs,
            "partition": len(exp.datasets) * len(exp.alphas) * len(parts),
            "train": runs,
            "table": 1,
            "figures": 1,
            "plot_data": 1,
            "all": 1,
        }
        | ({"fedpart_table": 1} if any(METHODS[exp.method_of(m)].partial for m in exp.methods) else {})
        | analysis_jobs(exp)
    )


def analysis_jobs(exp) -> dict[str, int]:
    """The analysis jobs a config asks for (README "Analyses"): one per analysis of the grid's
    runs it turns on (plus per-group accuracy, and theta/beta with an InCo method), and a config
    and a training job per study run."""
    a = exp.analyses
    grid = [a.cka_rounds, a.gradient_rounds, a.tsne_rounds]
    studies = {}
    if exp.robustness:
        rob = exp.robustness
        points = len({(b, 0.0) for b in rob.batch_sizes} | {(exp.batch_size, n) for n in rob.noise})
        seeds = len(rob.seeds or exp.seeds)
        studies["robustness"] = len(exp.datasets) * len(exp.alphas) * len(rob.methods) * points * seeds
    if exp.case_study:
        seeds = len(exp.case_study.seeds or exp.seeds)
        studies["case_study"] = len(exp.datasets) * len(exp.case_study.families) * 4 * seeds
    if not any(grid) and not studies:
        return {}
    inco = any(m.startswith("InCo") for m in exp.methods)
    runs = sum(studies.values())
    names = [n for n, rounds in zip(("cka", "gradients", "tsne"), grid, strict=True) if rounds]
    names += ["groups", *(["theta_beta"] if inco else []), *studies]  # one job of the rule named for each
    return dict.fromkeys(names, 1) | ({"study_config": runs, "study_train": runs} if runs else {})


# --- schema and configs (fast) -----------------------------------------------------------
# The schema is generated from the pydantic models (python -m incofl.schema --write):
# tests/test_schema.py checks it is not stale, holds no defaults and agrees with pydantic.


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_are_valid(path):
    raw = yaml.safe_load(path.read_text())
    jsonschema.validate(raw, SCHEMA)
    validate_experiment(raw, str(path))


@pytest.mark.slow
@pytest.mark.parametrize(
    "path",
    [
        REPO / "config" / f"{name}.yaml"
        for name in (
            "config",
            "paper-resnet",
            "fedpart",
            "fedpart-cpu",
            "fedlag-cpu",
            "hetero-split-cpu",
            "scalefl-cpu",
            "analysis",
            "analysis-cpu",
        )
    ]
    + [TINY_ANALYSIS],
    ids=lambda p: p.name,
)
def test_dry_run_plans_exactly_the_grid(tmp_path, path):
    assert planned_jobs(tmp_path, config=path) == grid_jobs(yaml.safe_load(path.read_text()))


@pytest.mark.slow
def test_a_method_of_a_new_family_folder_is_planned(tmp_path):
    """No regeneration step: a method registered only by a new family folder's spec passes the
    workflow's validation (schema, then the package's) and is planned like any other."""
    config = tmp_path / "new.yaml"
    config.write_text(yaml.safe_dump({**yaml.safe_load(TINY.read_text()), "methods": ["FedAvgNew"]}))
    env = {**ENV, "PYTHONPATH": str(package_with_family(tmp_path))}
    cmd = snakemake_cmd(tmp_path / "work", "--dry-run", "--quiet", "rules", config=config)
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^train\s+1\s*$", proc.stdout + proc.stderr, re.M), proc.stdout + proc.stderr


@pytest.mark.slow
def test_release_config_plans_its_grid_from_the_release_partitions(tmp_path):
    """config/paper-resnet-release.yaml runs from the workflow once the release's partition files
    are there (every data set x alpha, FMNIST reading CIFAR-10's), and stops naming the first
    missing file before any job otherwise."""
    path = REPO / "config" / "paper-resnet-release.yaml"
    folder = tmp_path / "fix_distribution"
    folder.mkdir()
    for prefix in ("", "SVHN_", "cinic10_"):
        for alpha in ("0.5", "1.0"):
            (folder / f"{prefix}hetero-fix-100-{alpha}.npy").write_bytes(b"")
    (folder / "cinic10_hetero-fix-100-1.0.npy").rename(folder / "kept-aside.npy")
    proc = run_snakemake(tmp_path, "--dry-run", "--config", f"release_partitions={folder}", config=path)
    assert proc.returncode == 2 and "release_partitions: " in proc.stderr, proc.stderr
    assert "cinic10_hetero-fix-100-1.0.npy: release partition file not found" in proc.stderr
    (folder / "kept-aside.npy").rename(folder / "cinic10_hetero-fix-100-1.0.npy")
    raw = {**yaml.safe_load(path.read_text()), "release_partitions": str(folder)}
    assert planned_jobs(tmp_path, "--config", f"release_partitions={folder}", config=path) == grid_jobs(raw)


@pytest.mark.slow
@pytest.mark.parametrize(
    "override,key",
    [
        ("alphas=[0.5,-1.0]", "alphas"),
        ("methods=[FedAvg,NoSuchMethod]", "methods"),
        ("datasets=[imagenet]", "datasets"),
        ("ratio=1.5", "ratio"),
        ("clients=1", "clients"),  # 1 client cannot fill the 2 model groups
        ("per_method={InCoAvg: {rounds: 0}}", "per_method"),
        ("learning_rate=0.1", "learning_rate"),
        ("method_args={clip: 0.2}", "method_args.clip: not a parameter of FedAvg"),
        ("per_method={InCoAvg: {method_args: {clip: 0}}}", "per_method.InCoAvg.method_args.clip"),
    ],
)
def test_bad_config_stops_before_any_job(tmp_path, override, key):
    """Exit code 2 and one line naming the key, as `incofl train` gives; no traceback."""
    proc = run_snakemake(tmp_path, "--cores", "1", "--config", override)
    assert proc.returncode == 2, proc.stderr
    error = [line for line in proc.stderr.splitlines() if "tiny.yaml" in line]
    assert len(error) == 1 and key in error[0] and error[0].startswith("snakemake: error: "), proc.stderr
    assert "Traceback" not in proc.stderr and 'File "' not in proc.stderr
    assert not (tmp_path / "results").exists() and not (tmp_path / "resources").exists()


@pytest.mark.slow
def test_runs_per_gpu_plans_the_runs_as_one_group_job(tmp_path):
    """resources.runs_per_gpu 2 (README, "Several runs per GPU"): a dry run plans the tiny
    config's 2 training runs and their batch record as ONE group job (one SLURM job on a
    cluster: tests/test_slurm.py), the GPU as `gres`, a string, which a group asks for once
    (an integer `gpu` would be summed over its runs); 1, the default, plans no group and each
    training job asks for its GPU; 0 stops."""
    shared = "resources={mem_mb: 1000, runtime: 10, gpu: 1, runs_per_gpu: 2}"
    proc = run_snakemake(tmp_path, "--dry-run", "--cores", "2", "--config", shared)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    groups = (proc.stdout + proc.stderr).split("Group job ")[1:]
    assert len(groups) == 1 and groups[0].startswith("gpu "), proc.stdout
    group = re.split(r"\n\[", groups[0], maxsplit=1)[0]  # its jobs are indented, the next job is not
    assert group.count("rule train:") == 2 and group.count("rule train_batch:") == 1, group
    assert group.count("gres=gpu:1") == 2 and "gpu=" not in group and "mem_mb=1000," in group, group
    cfg = {**yaml.safe_load(TINY.read_text()), "resources": {"mem_mb": 1000, "runs_per_gpu": 2}}
    assert planned_jobs(tmp_path, "--config", shared) == {**grid_jobs(cfg), "train_batch": 1}

    # one run per job (the default): each training job asks for the GPU itself (sbatch --gpus=1
    # through the SLURM plugin), with its own memory, time and CPU
    proc = run_snakemake(
        tmp_path, "--dry-run", "--cores", "2", "--config", "resources={gpu: 1, runtime: 10, mem_mb: 1000}"
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Group job" not in text, proc.stderr
    train = [job for job in text.split("rule ")[1:] if job.startswith("train:")]
    assert len(train) == 2 and all("gpu=1, runtime=10, cpus_per_task=1, mem_mb=1000," in job for job in train), train
    proc = run_snakemake(tmp_path, "--dry-run", "--cores", "2", "--config", "resources={runs_per_gpu: 0}")
    assert proc.returncode == 2 and "resources.runs_per_gpu: 0 is less than the minimum of 1" in proc.stderr


# --- local end-to-end run (slow): conftest.py's tiny_run ------------------------------------
TINY_RUN = pytest.mark.xdist_group("tiny_run")
# The README's test table names the end-to-end tests, with their times; a test that is first to
# use tiny_run on its worker also pays for making it.
END_TO_END = pytest.mark.timeout(1800)


@pytest.mark.slow
@TINY_RUN
@END_TO_END
def test_local_run_writes_tables_figures_metrics(tiny_run):
    results = tiny_run / "results"
    table = pd.read_csv(results / "tables" / "table2.csv")
    assert list(table["method"]) == ["FedAvg", "InCoAvg"] and list(table["n_seeds"]) == [1, 1]
    assert table["mean"].between(0, 100).all()
    assert "| Method |" in (results / "tables" / "table2.md").read_text()
    assert r"\begin{tabular}" in (results / "tables" / "table2.tex").read_text()
    metrics = json.loads((results / "metrics.json").read_text())
    assert set(metrics["synthetic"]["a0.5"]) == {"FedAvg", "InCoAvg"}
    for name in ("curves_synthetic_a0.5", "ablation"):
        for ext in ("png", "pdf"):
            assert (results / "figures" / f"{name}.{ext}").stat().st_size > 1000
    curves = pd.read_csv(results / "plots" / "curves.csv")
    assert len(curves) == 2 * 2 and set(curves.columns) >= {"round", "accuracy", "method"}
    for method in ("FedAvg", "InCoAvg"):  # the run's own config file, per_method applied
        run = yaml.safe_load((results / "runs" / "synthetic" / "a0.5" / method / "s0" / "config.yaml").read_text())
        assert run["methods"] == [method] and run["rounds"] == 2
    assert (results / "benchmarks" / "train" / "synthetic" / "a0.5" / "FedAvg" / "s0.tsv").exists()
    assert planned_jobs(tiny_run) == {}  # all done


@pytest.mark.slow
@TINY_RUN
@END_TO_END
def test_report_html(tiny_run):
    proc = run_snakemake(tiny_run, "--report", "results/report.html")
    assert proc.returncode == 0, proc.stderr[-3000:]
    html = (tiny_run / "results" / "report.html").read_text()
    for name in ("table2.md", "table2.csv", "curves_synthetic_a0.5.png", "ablation.png", "Table 2 of the paper"):
        assert name in html


@pytest.mark.slow
@TINY_RUN
@END_TO_END  # the first of these may be the one that makes tiny_run
@pytest.mark.parametrize(
    "override,expected",
    [
        ("rounds=3", {"experiment_config": 1, "run_config": 2, "train": 2, "table": 1, "figures": 1, "plot_data": 1}),
        (
            "per_method={InCoAvg: {lr: 0.01}}",
            {"experiment_config": 1, "run_config": 1, "train": 1, "table": 1, "figures": 1, "plot_data": 1},
        ),
        (
            "seeds=[0,1]",
            {"experiment_config": 1, "run_config": 2, "train": 2, "table": 1, "figures": 1, "plot_data": 1},
        ),
        (
            "min_size=5",
            {
                "experiment_config": 1,
                "partition": 1,
                "run_config": 2,
                "train": 2,
                "table": 1,
                "figures": 1,
                "plot_data": 1,
            },
        ),
        ("table_metric=best_acc", {"experiment_config": 1, "table": 1, "figures": 1}),
        (
            "eval_batch_size=500",
            {"experiment_config": 1, "run_config": 2, "train": 2, "table": 1, "figures": 1, "plot_data": 1},
        ),
        ("threads=2", {"experiment_config": 1, "table": 1, "figures": 1}),
        ("resources={mem_mb: 2000}", {"experiment_config": 1, "table": 1, "figures": 1}),
    ],
)
def test_a_config_change_reruns_exactly_what_it_affects(tiny_run, override, expected):
    assert planned_jobs(tiny_run, "--config", override) == {**expected, "all": 1}


@pytest.mark.slow
@END_TO_END
def test_analysis_workflow_writes_every_analysis(tmp_path):
    """tests/data/tiny-analysis.yaml end to end: the grid's runs write their probes' files, the
    studies' runs land under results/studies, every analysis folder gets its figures and tables,
    and the report shows them."""
    proc = run_snakemake(tmp_path, "--cores", "2", config=TINY_ANALYSIS, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = tmp_path / "results"
    run = results / "runs" / "synthetic" / "a0.5" / "InCoAvg" / "s0"
    for name in ("cka.csv", "update_similarity.csv", "gradients.csv", "tsne.csv", "inco.csv"):
        assert len(pd.read_csv(run / name)) > 0, name
    studies = sorted(
        p.parent.relative_to(results / "studies").as_posix() for p in (results / "studies").rglob("summary.json")
    )
    assert studies == sorted(
        [f"robustness/synthetic/a0.5/InCoAvg/{p}/s0" for p in ("b32-n0.0", "b64-n0.5")]
        + [f"case_study/synthetic/resnet-{i}-{h}/s0" for i in ("iid", "noniid") for h in ("homo", "hetero")]
    )
    noisy = json.loads(
        (
            results / "studies" / "robustness" / "synthetic" / "a0.5" / "InCoAvg" / "b64-n0.5" / "s0" / "summary.json"
        ).read_text()
    )
    assert noisy["config"]["update_noise"] == 0.5 and noisy["config"]["batch_size"] == 64
    homo = json.loads(
        (results / "studies" / "case_study" / "synthetic" / "resnet-iid-homo" / "s0" / "summary.json").read_text()
    )["config"]
    assert homo["models"] == ["resnet26"] and homo["partition"] == "iid" and homo["clients"] == 5
    analysis = results / "analysis"
    assert sorted(p.name for p in analysis.iterdir()) == [
        "case_study",
        "cka",
        "gradients",
        "groups",
        "robustness",
        "theta_beta",
        "tsne",
    ]
    for folder in analysis.iterdir():
        assert any(f.suffix in (".png", ".md") and f.stat().st_size > 100 for f in folder.iterdir()), folder
    assert planned_jobs(tmp_path, config=TINY_ANALYSIS) == {}  # all done
    proc = run_snakemake(tmp_path, "--report", "results/report.html", config=TINY_ANALYSIS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    html = (results / "report.html").read_text()
    assert "Linear CKA between the models" in html and "cka_layers.png" in html


# --- interrupt and resume (slow) ---------------------------------------------------------
@pytest.mark.slow
@TINY_RUN
@END_TO_END
def test_interrupted_workflow_resumes_without_redoing_finished_runs(tiny_run):
    """tiny_run was killed with -9 (once one run had finished and the other had a checkpoint), then
    interrupted with Ctrl-C (once that other run had resumed): the reruns kept the finished run
    and resumed the other from its checkpoint each time."""
    record = json.loads((tiny_run / "interruptions.json").read_text())
    runs = tiny_run / "results" / "runs" / "synthetic" / "a0.5"
    first, second = runs / record["first"] / "s0", runs / record["second"] / "s0"
    assert str((first / "summary.json").stat().st_mtime_ns) == record["mtime"]
    assert (first / "train.log").read_text().count("rounds 1..") == 1  # trained once
    log = (second / "train.log").read_text()
    assert log.count("resumed from") == 2 and (second / "summary.json").exists()
    assert not (first / "ckpt.pt").exists() and not (second / "ckpt.pt").exists()
