"""Shared fixtures. Real data is found through INCOFL_DATA_DIR (the Makefile points it at
../shared/data); tests that need CIFAR-10 skip with a reason when it is not there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def data_dir() -> Path:
    root = os.environ.get("INCOFL_DATA_DIR")
    if not root or not (Path(root) / "cifar10-jpeg.tar.xz").exists():
        pytest.skip("real CIFAR-10 not found: set INCOFL_DATA_DIR to a folder holding cifar10-jpeg.tar.xz")
    return Path(root)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """One decoded-data cache per test session, so CIFAR-10 is decoded once."""
    return tmp_path_factory.mktemp("cache")


# Directories that may change while the tests run: caches of tools, and evidence runs that a
# person may be running beside the suite (results/runs-*, never written by a test).
_NOT_WATCHED = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".snakemake"}


def _repo_files() -> set[Path]:
    files = set()
    for root, dirs, names in os.walk(REPO):
        rel = Path(root).relative_to(REPO)
        dirs[:] = [d for d in dirs if d not in _NOT_WATCHED and not d.endswith(".egg-info")
                   and not (rel == Path("results") and d.startswith("runs-"))]  # fmt: skip
        files.update(rel / n for n in names)
    return files


@pytest.fixture(scope="session", autouse=True)
def nothing_written_into_the_repository():
    """Every test writes under a temporary directory, never into the checkout."""
    before = _repo_files()
    yield
    new = sorted(map(str, _repo_files() - before))
    assert not new, f"tests wrote into the repository: {new[:10]}"
