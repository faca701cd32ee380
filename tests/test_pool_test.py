"""`pool_test` (FedLAG's released data setting, docs/methods.md, FedLAG): the train and test images pooled
into one training set (train first, then test) with an empty test split, partitioned over the
clients; `incofl partition` and training index the same pooled set, and a partition made
without pooling is refused for a pooled run (and the other way round) through its labels' hash."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml
from pydantic import ValidationError
from workflows import BIN, TINY, run_snakemake

from incofl.config import ConfigError, RunConfig, load_run_config, validate_experiment
from incofl.data.partition import Partition, PartitionError, labels_hash, partition_for
from incofl.data.sources import dataset_for, load_dataset

SIZES = {"synthetic": (2000, 500), "digits": (1437, 360)}  # (train, test) images


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


def _cfg(cache: Path, dataset: str = "digits", **settings) -> RunConfig:
    base = {"dataset": dataset, "cache_dir": str(cache), "clients": 10, "alpha": 0.5, "progress": False}
    return RunConfig(**{**base, **settings})


# --- the pooled data set -----------------------------------------------------------------------


@pytest.mark.parametrize("name", SIZES)
def test_pooled_is_train_then_test_with_an_empty_test_split(cache, name):
    data = load_dataset(name, cache_dir=cache)
    pooled = data.pooled()
    n_train, n_test = SIZES[name]
    assert (len(data.y_train), len(data.y_test)) == (n_train, n_test)
    assert len(pooled.y_train) == len(pooled.x_train) == n_train + n_test
    assert np.array_equal(pooled.x_train[:n_train], data.x_train)
    assert np.array_equal(pooled.x_train[n_train:], data.x_test)
    assert np.array_equal(pooled.y_train, np.concatenate([data.y_train, data.y_test]))
    assert pooled.x_test.shape == (0, *data.x_test.shape[1:]) and pooled.y_test.shape == (0,)
    assert (pooled.x_train.dtype, pooled.y_train.dtype) == (np.uint8, np.int64)
    assert (pooled.x_test.dtype, pooled.y_test.dtype) == (np.uint8, np.int64)
    assert pooled.name == data.name and pooled.order == data.order
    assert (pooled.channels, pooled.image_size, pooled.num_classes) == (data.channels, data.image_size, 10)
    assert np.array_equal(np.bincount(pooled.y_train), np.bincount(data.y_train) + np.bincount(data.y_test))
    mean, std = pooled.channel_stats()  # over the 60k-like pooled set
    assert mean.shape == std.shape == (data.channels,) and np.all(std > 0)
    assert len(data.y_test) == n_test  # the loaded set is untouched


def test_dataset_for_pools_exactly_under_pool_test(cache):
    plain = dataset_for(_cfg(cache))
    pooled = dataset_for(_cfg(cache, pool_test=True, holdout=0.25))
    assert (len(plain.y_train), len(plain.y_test)) == SIZES["digits"]
    assert (len(pooled.y_train), len(pooled.y_test)) == (sum(SIZES["digits"]), 0)


def test_pool_test_needs_holdout():
    with pytest.raises(ConfigError, match="pool_test: needs holdout > 0"):
        load_run_config(None, {"pool_test": True})


def test_pool_test_is_shared_by_all_methods():
    with pytest.raises(ConfigError, match="per_method.FedAvg.pool_test: data and partition settings are shared"):
        validate_experiment({"holdout": 0.25, "per_method": {"FedAvg": {"pool_test": True}}})


# --- partitions over the pooled set ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["dirichlet", "iid"])
def test_partition_covers_train_and_test(cache, kind):
    """Every one of the train + test images goes to exactly one client (CIFAR-10: 60,000)."""
    cfg = _cfg(cache, pool_test=True, holdout=0.25, partition=kind)
    data = dataset_for(cfg)
    part = partition_for(cfg, data)
    everything = np.sort(np.concatenate(part.parts))
    assert np.array_equal(everything, np.arange(sum(SIZES["digits"])))
    assert part.histogram.sum() == sum(SIZES["digits"])
    assert np.array_equal(part.histogram.sum(0), np.bincount(data.y_train))
    assert part.meta["labels_sha256"] == labels_hash(data.y_train)


def test_provenance_refuses_a_partition_made_without_pooling(cache, tmp_path):
    plain, pooled = _cfg(cache), _cfg(cache, pool_test=True, holdout=0.25)
    plain_file, pooled_file = tmp_path / "plain.npz", tmp_path / "pooled.npz"
    partition_for(plain, dataset_for(plain)).save(plain_file)
    partition_for(pooled, dataset_for(pooled)).save(pooled_file)
    for cfg, wrong in ((pooled, plain_file), (plain, pooled_file)):
        cfg = cfg.model_copy(update={"partition_file": str(wrong)})
        with pytest.raises(PartitionError, match="made for other training labels than this run's data"):
            partition_for(cfg, dataset_for(cfg))
    for cfg, right in ((pooled, pooled_file), (plain, plain_file)):
        cfg = cfg.model_copy(update={"partition_file": str(right)})
        assert len(partition_for(cfg, dataset_for(cfg)).parts) == 10


def test_release_partitions_are_refused_with_pool_test(cache, tmp_path):
    """The release's files index the training set alone: refused when the config is validated."""
    with pytest.raises(ValidationError, match="pool_test: the release's partition files index the training set alone"):
        _cfg(cache, pool_test=True, holdout=0.25, partition="release", release_partitions=str(tmp_path))


@pytest.mark.slow
def test_cli_partition_over_the_pooled_set(cache, tmp_path):
    """The workflow's partition job: `incofl partition --set pool_test=true holdout=0.25 ...`;
    a pooled run accepts its artifact."""
    out = tmp_path / "p.npz"
    sets = ["dataset=digits", "pool_test=true", "holdout=0.25", "clients=10", "alpha=0.5", f"cache_dir={cache}"]
    cmd = [str(BIN / "incofl"), "partition", "--set", *sets, "--out", str(out)]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"{out}: dirichlet alpha=0.5 seed=0, 10 clients" in proc.stdout
    part = Partition.load(out)
    assert np.array_equal(np.sort(np.concatenate(part.parts)), np.arange(sum(SIZES["digits"])))
    run = _cfg(cache, pool_test=True, holdout=0.25, partition_file=str(out))
    read = partition_for(run, dataset_for(run))
    assert all(np.array_equal(a, b) for a, b in zip(read.parts, part.parts, strict=True))
    with pytest.raises(PartitionError, match="other training labels"):
        plain = _cfg(cache, partition_file=str(out))
        partition_for(plain, dataset_for(plain))


def _partition_commands(workdir: Path, **settings) -> list[str]:
    """The shell commands of the partition jobs a dry run of tests/data/tiny.yaml (with `settings`) plans."""
    config = workdir / "config.yaml"
    workdir.mkdir()
    tiny = yaml.safe_load(TINY.read_text())
    config.write_text(yaml.safe_dump({**tiny, **settings}))
    proc = run_snakemake(workdir, "--dry-run", "--printshellcmds", config=config, timeout=300)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return [line for line in proc.stdout.splitlines() if "incofl partition" in line]


@pytest.mark.slow
def test_workflow_partition_job_pools(tmp_path):
    """The partition job gets `pool_test` (and the `holdout` it needs) only when pooling, so the
    partition jobs of a config without it keep their params."""
    (pooled,) = _partition_commands(tmp_path / "a", pool_test=True, holdout=0.25)
    assert "pool_test=true" in pooled and "holdout=0.25" in pooled
    (plain,) = _partition_commands(tmp_path / "b")
    assert "pool_test" not in plain and "holdout" not in plain
