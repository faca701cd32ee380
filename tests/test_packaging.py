"""Set-up files and docs agree: environment.yml pins what pyproject.toml pins, the CLI is wired,
and the README shows the committed evidence, as the report stages of dvc.yaml make it."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def test_environment_yml_has_the_same_pins_as_pyproject():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = set(project["dependencies"]) | set(project["optional-dependencies"]["test"])
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert {p for p in pip if "==" in p} == pins
    assert all("==" in p for p in pins), "every dependency is pinned"


def test_ci_runs_the_readme_test_command():
    readme, ci = (REPO / "README.md").read_text(), (REPO / ".ci" / "run").read_text()
    assert "make test" in readme.split("\n## ")[0] and "make run" in readme.split("\n## ")[0]
    assert "\nmake test\n" in ci


@pytest.mark.slow
def test_cli_help_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "incofl.cli", "--help"], capture_output=True, text=True, check=True)
    for command in "prepare partition train table figures paired metrics fedpart bench methods".split():
        assert command in out.stdout


# The README's evidence tables and the report-stage outputs (dvc.yaml) they are copied from.
EVIDENCE_TABLES = [
    "results/evidence-inco-vs-heteroavg/paired.md",
    "results/evidence-inco-vs-heteroavg/paired-gpu.md",
    "results/evidence-inco-vs-heteroavg/paired-cpu-gpu.md",
    "results/evidence-inco-vs-heteroavg/paired-release.md",
    "results/evidence-fedpart/fedpart.md",
    "results/evidence-analysis/cka/cka.md",
    "results/evidence-analysis/theta_beta/table3.md",
    "results/evidence-hetero/table2.md",
    "results/evidence-hetero/paired-InCoHeteroFL.md",
    "results/evidence-hetero/paired-InCoRolex.md",
    "results/evidence-scalefl/table2.md",
    "results/evidence-scalefl/paired-InCoScaleFL.md",
    "results/evidence-fedlag/table2.md",
]


def _stage_outputs() -> set[str]:
    """Every output path of dvc.yaml's stages (a folder stands for the files under it)."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    return {path for stage in stages.values() for entry in stage.get("outs", []) for path in entry}


def test_readme_evidence_tables_are_the_committed_report_outputs():
    """Each evidence table in the README is a report stage's output, copied verbatim (each of its
    Markdown tables), and every results/ file the README links exists: numbers in the README
    cannot drift from the results they claim, and `dvc repro` regenerates each of them."""
    readme, outputs = (REPO / "README.md").read_text(), _stage_outputs()
    for name in EVIDENCE_TABLES:
        assert any(name == out or name.startswith(out + "/") for out in outputs), f"{name}: no stage makes it"
        tables = [b.strip() for b in (REPO / name).read_text().split("\n\n") if b.startswith("|")]
        assert tables and all(t in readme for t in tables), name
    for link in re.findall(r"\]\((results/[^)#]+)\)", readme):
        assert (REPO / link).is_file(), link
