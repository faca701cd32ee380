"""The Makefile's venv target: a Python other than 3.11 to 3.13 is refused in one line before anything
is made (saying how to pick one); without PYTHON the first suitable one on PATH is taken, and none
is refused in one line saying how to get one; a suitable one makes the venv, and once made the
target is a no-op. Run on a copy of the Makefile with fake Pythons (no real venv, no network)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# A fake `python`: prints its version; `-m venv DIR` makes DIR/bin/pip, which logs its arguments.
FAKE_PYTHON = """#!/bin/sh
if [ "$1" = --version ]; then echo "Python {version}"; exit 0; fi
if [ "$1 $2" = "-m venv" ]; then
  mkdir -p "$3/bin" && printf '#!/bin/sh\\necho "$@" >> "%s/pip.log"\\n' "$PWD" > "$3/bin/pip" && chmod +x "$3/bin/pip"
  exit 0
fi
exit 1
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    return tmp_path


def _python(folder: Path, version: str) -> Path:
    path = folder / f"python{version}"
    path.write_text(FAKE_PYTHON.format(version=version))
    path.chmod(0o755)
    return path


def _make(project: Path, *args: str, path: Path | None = None) -> subprocess.CompletedProcess:
    """make in `project`; `path`: the only folder of PATH besides the tools the fake Pythons use."""
    env = None
    if path is not None:
        tools = path.parent / "tools"
        tools.mkdir(exist_ok=True)
        for tool in ("mkdir", "chmod", "touch"):
            (tools / tool).symlink_to(shutil.which(tool))
        env = {"PATH": f"{path}:{tools}"}
    return subprocess.run(
        [shutil.which("make"), "-C", str(project), "--no-print-directory", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.mark.parametrize("version", ["3.14.0", "3.10.14"])
def test_another_python_is_refused_in_one_line(project, tmp_path, version):
    proc = _make(project, ".venv/bin/.installed", f"PYTHON={_python(tmp_path, version)}")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    needs = "this project needs Python 3.11, 3.12 or 3.13: PYTHON=python3.13 make .venv/bin/.installed"
    assert f"is Python {version}; {needs}" in lines[0]
    assert not (project / ".venv").exists()


def test_a_missing_python_is_named(project, tmp_path):
    proc = _make(project, ".venv/bin/.installed", f"PYTHON={tmp_path / 'no-such-python'}")
    assert proc.returncode == 2 and "no-such-python was not found; this project needs Python 3.11" in proc.stderr


@pytest.mark.parametrize("version", ["3.11.9", "3.12.1", "3.13.0"])
def test_a_supported_python_makes_the_venv_once(project, tmp_path, version):
    python = f"PYTHON={_python(tmp_path, version)}"
    proc = _make(project, ".venv/bin/.installed", python)
    assert proc.returncode == 0, proc.stderr
    assert (project / ".venv/bin/.installed").exists() and "-e .[test,flower]" in (project / "pip.log").read_text()
    assert _make(project, "-q", ".venv/bin/.installed", python).returncode == 0  # up to date: nothing to do


def _named(folder: Path, name: str, version: str) -> None:
    """A fake Python of `version` on PATH as `name` (python3, python3.12, ...)."""
    folder.mkdir(exist_ok=True)
    _python(folder, version).rename(folder / name)


def test_without_python_the_first_suitable_one_on_path_makes_the_venv(project, tmp_path):
    path = tmp_path / "bin"
    for name, version in (("python3.13", "3.10.1"), ("python3.11", "3.11.4"), ("python3", "3.12.2")):
        _named(path, name, version)  # python3.13 answering 3.10 is passed over; python3.11 comes before python3
    proc = _make(project, ".venv/bin/.installed", path=path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "python3.11 -m venv .venv"


def test_without_a_suitable_python_make_says_how_to_get_one(project, tmp_path):
    path = tmp_path / "bin"
    _named(path, "python3", "3.10.12")
    proc = _make(project, ".venv/bin/.installed", path=path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "none of python3.13 python3.12 python3.11 python3 on PATH is Python 3.11 to 3.13" in lines[0]
    assert "brew install python@3.13" in lines[0] and "PYTHON=/path/to/python3.13 make .venv/bin/.installed" in lines[0]
    assert not (project / ".venv").exists()
