"""Shared fixtures. Real data is found through INCOFL_DATA_DIR (the Makefile points it at
../shared/data); tests that need CIFAR-10 skip with a reason when it is not there (fail under
CI=true: helpers.unavailable)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import unavailable
from workflows import REPO, run_interrupted

pytest_plugins = ["pins"]  # under CI, a run that checked no number training computes fails


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The end-to-end tests first (they raise their timeout), then the other slow ones: under
    `pytest -n` the workers then start the long tests early and fill the rest of their time
    with the short ones, instead of one worker finishing a late long test alone."""

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("timeout"):
            return 0
        return 1 if item.get_closest_marker("slow") else 2

    items.sort(key=rank)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    root = os.environ.get("INCOFL_DATA_DIR")
    if not root or not (Path(root) / "cifar10-jpeg.tar.xz").exists():
        unavailable("real CIFAR-10 not found: set INCOFL_DATA_DIR to a folder holding cifar10-jpeg.tar.xz")
    return Path(root)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """One decoded-data cache per test session, so CIFAR-10 is decoded once."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """The suite's one real local workflow run: tests/data/tiny.yaml (2 training runs, the
    tables, figures and metrics), killed with -9, interrupted with Ctrl-C and resumed on the way
    (workflows.run_interrupted; what it saw is in `interruptions.json`). Tests that read it share
    the xdist group "tiny_run", so under `pytest -n` it is made once, on one worker; they must not
    change it."""
    workdir = tmp_path_factory.mktemp("tiny")
    run_interrupted(workdir)
    return workdir


# Directories that may change while the tests run: caches of tools, and evidence runs that a
# person may be running beside the suite (results/runs-*, never written by a test).
_NOT_WATCHED = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".snakemake"}


def _repo_files() -> set[Path]:
    files = set()
    for root, dirs, names in os.walk(REPO):
        rel = Path(root).relative_to(REPO)
        dirs[:] = [
            d
            for d in dirs
            if d not in _NOT_WATCHED
            and not d.endswith(".egg-info")
            and not (rel == Path("results") and d.startswith("runs-"))
        ]
        files.update(rel / n for n in names if not n.startswith(".coverage"))  # `make coverage`'s data
    return files


@pytest.fixture(scope="session", autouse=True)
def nothing_written_into_the_repository():
    """Every test writes under a temporary directory, never into the checkout."""
    before = _repo_files()
    yield
    new = sorted(map(str, _repo_files() - before))
    assert not new, f"tests wrote into the repository: {new[:10]}"
