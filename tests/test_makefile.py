"""The Makefile's venv target: a Python other than 3.11 is refused in one line before anything is
made (saying how to pick one); 3.11 makes the venv, and once made the target is a no-op. Run on a
copy of the Makefile with fake Pythons (no real venv, no network)."""

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


def _make(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-C", str(project), "--no-print-directory", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("version", ["3.12.1", "3.10.14"])
def test_another_python_is_refused_in_one_line(project, tmp_path, version):
    proc = _make(project, ".venv/bin/.installed", f"PYTHON={_python(tmp_path, version)}")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"is Python {version}; this project needs 3.11: PYTHON=python3.11 make .venv/bin/.installed" in lines[0]
    assert not (project / ".venv").exists()


def test_a_missing_python_is_named(project, tmp_path):
    proc = _make(project, ".venv/bin/.installed", f"PYTHON={tmp_path / 'no-such-python'}")
    assert proc.returncode == 2 and "no-such-python was not found; this project needs 3.11" in proc.stderr


def test_python_311_makes_the_venv_once(project, tmp_path):
    python = f"PYTHON={_python(tmp_path, '3.11.9')}"
    proc = _make(project, ".venv/bin/.installed", python)
    assert proc.returncode == 0, proc.stderr
    assert (project / ".venv/bin/.installed").exists() and "-e .[test,flower]" in (project / "pip.log").read_text()
    assert _make(project, "-q", ".venv/bin/.installed", python).returncode == 0  # up to date: nothing to do
