"""Set-up files and docs agree: environment.yml pins what pyproject.toml pins, the CLI is wired,
and the README shows the committed evidence."""

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
    for command in ("prepare", "partition", "train", "table", "figures", "paired", "fedpart", "bench", "methods"):
        assert command in out.stdout


def test_readme_evidence_is_the_committed_table():
    """The README's evidence table is `incofl table`'s output, copied verbatim, and every file
    it links exists: numbers in the README cannot drift from the results they claim."""
    readme = (REPO / "README.md").read_text()
    evidence = readme.split("<!-- EVIDENCE START -->")[1].split("<!-- EVIDENCE END -->")[0]
    assert (REPO / "results/evidence-cifar10-mini/table2.md").read_text().strip() in evidence
    for link in re.findall(r"\]\((results/[^)]+)\)", evidence):
        assert (REPO / link).is_file(), link


def test_readme_paired_comparison_is_the_committed_one():
    """The README's InCoAvg-vs-HeteroAvg table is `incofl paired`'s output, verbatim."""
    readme = (REPO / "README.md").read_text()
    assert (REPO / "results/evidence-inco-vs-heteroavg/paired.md").read_text().strip() in readme
