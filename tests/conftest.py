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
