"""Set-up files agree: environment.yml pins what pyproject.toml pins, and the CLI is wired."""

import subprocess
import sys
import tomllib
from pathlib import Path

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


def test_cli_help_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "incofl.cli", "--help"], capture_output=True, text=True, check=True)
    for command in ("prepare", "partition", "train", "table", "figures", "bench", "methods"):
        assert command in out.stdout
