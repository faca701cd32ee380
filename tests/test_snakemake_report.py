"""`snakemake --report` on the default experiment (config/config.yaml: digits, the 18 runs
committed under results/runs by DVC's digits-train stage), built from the committed results
without training anything: the report holds Table 2 and every figure, each with its caption."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import time
from pathlib import Path

import yaml
from workflows import REPO, planned_jobs, run_snakemake

DEFAULT = REPO / "config" / "config.yaml"
COMMITTED = ("results/partitions", "results/runs", "results/tables", "results/figures", "results/metrics.json")


def _age(path: Path) -> int:
    """Where a file comes in the workflow (data, partition, run config, run, report outputs):
    Snakemake reruns a job whose output is older than an input, and a git checkout leaves
    files' times in any order."""
    parts = path.parts
    if "resources" in parts:
        return 0
    if "partitions" in parts:
        return 1
    if "runs" in parts:
        return 2 if path.name == "config.yaml" else 3
    return 4


def stage_default_run(workdir: Path) -> None:
    """The default experiment's committed results in `workdir`, their times in the order the
    workflow makes them, and an empty stand-in for the digits data cache (no job reads it: the
    dry run shows that nothing that reads it would run)."""
    for name in COMMITTED:
        source, target = REPO / name, workdir / name
        shutil.copytree(source, target) if source.is_dir() else shutil.copy2(source, target)
    cache = workdir / "resources" / "data" / "digits.npz"
    cache.parent.mkdir(parents=True)
    cache.touch()
    start = time.time() - 1000
    for path in (p for p in workdir.rglob("*") if p.is_file()):
        os.utime(path, (start + _age(path), start + _age(path)))


def report_results(html: str) -> dict[str, dict]:
    """The report's entries (file -> name, caption, data_uri, ...): its `var results = {...}`."""
    match = re.search(r"var results = (\{)", html)
    assert match, "no results in the report"
    results, _ = json.JSONDecoder().raw_decode(html, match.start(1))
    return results


def test_the_report_of_the_default_run_holds_table_2_and_every_figure_with_captions(tmp_path):
    work = tmp_path / "work"
    stage_default_run(work)
    # up to date but for the curve data for `dvc plots` (not committed, not in the report)
    assert planned_jobs(work, config=DEFAULT) == {"plot_data": 1, "all": 1}
    proc = run_snakemake(work, "--report", str(tmp_path / "report.html"), config=DEFAULT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = report_results((tmp_path / "report.html").read_text())

    config = yaml.safe_load(DEFAULT.read_text())
    curves = [f"results/figures/curves_{d}_a{float(a)}.png" for d in config["datasets"] for a in config["alphas"]]
    figures = sorted(str(p.relative_to(REPO)) for p in (REPO / "results" / "figures").glob("*.png"))
    assert figures == sorted([*curves, "results/figures/ablation.png"])  # every committed figure ...
    tables = [f"results/tables/table2.{ext}" for ext in ("md", "csv", "html")]  # html: the one the report shows
    assert sorted(results) == sorted([*figures, *tables])  # ... shown
    for path, entry in results.items():
        assert re.sub(r"<[^>]+>|\s", "", entry["caption"]), f"{path} has no caption"
        data = base64.b64decode(entry["data_uri"].split("base64,", 1)[1])
        assert data == (REPO / path).read_bytes(), f"{path}: the report embeds another file"
    assert "Table 2 of the paper" in results["results/tables/table2.md"]["caption"]
    assert "± 1" in results["results/figures/ablation.png"]["caption"]
