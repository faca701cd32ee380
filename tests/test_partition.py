"""Partitions: complete, disjoint, seeded, balanced, skewed as alpha says, bounded retries; label shards."""

import numpy as np
import pytest

from incofl.config import ConfigError, RunConfig, load_run_config, validate_experiment
from incofl.data.partition import (
    Partition,
    PartitionError,
    check_provenance,
    dirichlet_partition,
    iid_partition,
    make_partition,
)


def _labels(n_per_class=500, classes=10):
    return np.random.default_rng(123).permutation(np.repeat(np.arange(classes), n_per_class))


def _check_complete_disjoint(parts, n):
    allidx = np.concatenate(parts)
    assert len(allidx) == n and len(np.unique(allidx)) == n


def test_iid_is_complete_disjoint_and_near_equal():
    parts = iid_partition(1003, 10, seed=1)
    _check_complete_disjoint(parts, 1003)
    assert {len(p) for p in parts} <= {100, 101}


@pytest.mark.parametrize("alpha", [0.1, 0.5, 1.0, 100.0])
def test_dirichlet_complete_disjoint_min_size(alpha):
    labels = _labels()
    parts = dirichlet_partition(labels, 20, alpha, seed=0, min_size=10)
    _check_complete_disjoint(parts, len(labels))
    assert min(len(p) for p in parts) >= 10


def test_dirichlet_is_seeded():
    labels = _labels()
    a = dirichlet_partition(labels, 20, 0.5, seed=7)
    b = dirichlet_partition(labels, 20, 0.5, seed=7)
    c = dirichlet_partition(labels, 20, 0.5, seed=8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def _mean_skew(labels, alpha, seeds=range(3)):
    """Mean total-variation distance between client label distributions and the global one."""
    out = []
    for s in seeds:
        part = make_partition(labels, kind="dirichlet", num_clients=20, alpha=alpha, seed=s)
        dist = part.histogram / part.histogram.sum(1, keepdims=True)
        out.append(0.5 * np.abs(dist - 0.1).sum(1).mean())
    return float(np.mean(out))


def test_smaller_alpha_means_more_label_skew():
    labels = _labels()
    skews = [_mean_skew(labels, a) for a in (0.1, 0.5, 1.0, 100.0)]
    assert skews == sorted(skews, reverse=True), skews
    assert skews[-1] < 0.15 < skews[0]


def test_balancing_caps_client_size():
    """With balancing, a client stops receiving once it holds N/K samples, so no client can end
    far above N/K: at most N/K plus one class's share."""
    labels = _labels()
    parts = dirichlet_partition(labels, 20, 0.1, seed=0)
    assert max(len(p) for p in parts) <= len(labels) / 20 + 500


def test_class_count_comes_from_labels():
    labels = np.repeat(np.arange(3), 200)
    part = make_partition(labels, kind="dirichlet", num_clients=5, alpha=1.0, seed=0)
    assert part.histogram.shape == (5, 3)
    assert part.histogram.sum() == 600


def test_impossible_partition_fails_clearly_after_bounded_retries():
    labels = _labels(n_per_class=20)
    with pytest.raises(PartitionError, match="min_size|>= 50 samples"):
        dirichlet_partition(labels, 20, 0.5, seed=0, min_size=50, max_retries=5)


def test_partition_artifact_round_trips(tmp_path):
    labels = _labels()
    part = make_partition(labels, kind="dirichlet", num_clients=20, alpha=0.5, seed=3, dataset="x")
    part.save(tmp_path / "p.npz")
    back = Partition.load(tmp_path / "p.npz")
    assert all(np.array_equal(a, b) for a, b in zip(part.parts, back.parts, strict=True))
    assert np.array_equal(part.histogram, back.histogram)
    assert back.meta["alpha"] == 0.5 and back.meta["dataset"] == "x" and back.meta["clients"] == 20


# --- partition: shards (HeteroFL's label shards, docs/methods.md, hetero splitting) ----------------------------------


def _held(part):
    """Each client's classes, from the histogram."""
    return [set(np.flatnonzero(row).tolist()) for row in part.histogram]


def _shards(labels, clients, shard_classes=2, seed=0):
    return make_partition(labels, kind="shards", num_clients=clients, alpha=0.5, seed=seed, shard_classes=shard_classes)


@pytest.mark.parametrize("clients,shard_classes", [(5, 2), (10, 1), (2, 5), (1, 10)])
def test_shards_without_repeats_give_exactly_shard_classes_and_cover_all(clients, shard_classes):
    """One shard per class (clients x shard_classes = classes) or one class per client: no client
    can be dealt a class twice, so each holds exactly `shard_classes` and every sample is dealt."""
    labels = _labels()
    part = _shards(labels, clients, shard_classes)
    _check_complete_disjoint(part.parts, len(labels))
    assert all(len(held) == shard_classes for held in _held(part))


@pytest.mark.parametrize("clients,shard_classes", [(100, 2), (25, 4), (20, 5)])
def test_shards_dealt_twice_collapse_and_leave_their_shard_unassigned(clients, shard_classes):
    """The release's `np.unique` over a client's dealt labels: a client holds at most
    `shard_classes` classes, one whole shard of each; every shard not given out is left out."""
    labels = _labels()
    part = _shards(labels, clients, shard_classes)
    per_class = shard_classes * clients // 10
    shard = 500 // per_class
    allidx = np.concatenate(part.parts)
    assert len(np.unique(allidx)) == len(allidx)  # disjoint
    held = _held(part)
    assert all(1 <= len(h) <= shard_classes for h in held)
    assert np.isin(part.histogram, [0, shard]).all()  # one whole shard of each class held
    assert len(allidx) == sum(len(h) for h in held) * shard
    assert part.histogram.astype(bool).sum(0).max() <= per_class


def test_shards_collapse_happens_at_the_release_setting():
    """100 clients x 2 of 10 classes: some clients are dealt one class twice (the release's ~10%)."""
    labels = _labels()
    short = [sum(len(h) < 2 for h in _held(_shards(labels, 100, seed=s))) for s in range(3)]
    assert all(0 < n < 25 for n in short), short


def test_a_shard_is_a_contiguous_run_of_its_class_in_data_set_order():
    labels = _labels()
    by_class = [np.flatnonzero(labels == k) for k in range(10)]
    for idx in _shards(labels, 100).parts:
        for k in np.unique(labels[idx]):
            pos = np.searchsorted(by_class[k], np.sort(idx[labels[idx] == k]))
            assert np.array_equal(pos, np.arange(pos[0], pos[0] + 25))


def test_shard_leftovers_go_one_each_to_the_first_shards():
    """7 samples in 2 shards: positions 0-2 plus the leftover 6, and 3-5."""
    labels = np.array([0] * 7 + [1] * 6)
    part = _shards(labels, 4, shard_classes=1)
    got = sorted(tuple(p.tolist()) for p in part.parts)
    assert got == [(0, 1, 2, 6), (3, 4, 5), (7, 8, 9), (10, 11, 12)]


def test_shards_are_seeded():
    labels = _labels()
    a, b, c = (_shards(labels, 100, seed=s).parts for s in (7, 7, 8))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_shard_histogram_matches_the_parts_and_classes_come_from_labels():
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(3), 40))
    part = _shards(labels, 6, shard_classes=2)
    assert part.histogram.shape == (6, 3)
    assert all(
        np.array_equal(row, np.bincount(labels[p], minlength=3))
        for row, p in zip(part.histogram, part.parts, strict=True)
    )
    assert part.meta["kind"] == "shards" and part.meta["shard_classes"] == 2


@pytest.mark.parametrize(
    "labels,clients,shard_classes,message",
    [
        (np.repeat(np.arange(10), 50), 10, 11, "shard_classes: 11 exceeds the 10 classes in the labels"),
        (np.repeat(np.arange(10), 50), 7, 2, "shard_classes: 2 x 7 clients = 14 shards is not a multiple of the 10"),
        (np.repeat(np.arange(10), 5), 100, 2, "shard_classes: class 0 has 5 samples, fewer than the 20 shards"),
        (np.array([0, 0, 2, 2]), 3, 1, "shard_classes: class 1 has 0 samples, fewer than the 1 shards"),
    ],
)
def test_impossible_shards_fail_naming_the_problem(labels, clients, shard_classes, message):
    with pytest.raises(PartitionError, match=message):
        _shards(labels, clients, shard_classes)


def test_shards_provenance_checks_shard_classes_and_ignores_alpha():
    labels = _labels(n_per_class=10)
    cfg = RunConfig(dataset="synthetic", clients=10, partition="shards", alpha=1.0)
    part = make_partition(labels, kind="shards", num_clients=10, alpha=0.5, seed=0, dataset="synthetic")
    check_provenance(part, cfg, labels, "p.npz")  # alpha differs: shards ignore it, as iid does
    with pytest.raises(PartitionError, match="made for shard_classes=2, this run has shard_classes=1"):
        check_provenance(part, cfg.model_copy(update={"shard_classes": 1}), labels, "p.npz")


def test_config_accepts_shards_and_refuses_zero_shard_classes(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("partition: shards\n")
    cfg = load_run_config(path)
    assert cfg.partition == "shards" and cfg.shard_classes == 2
    path.write_text("partition: shards\nshard_classes: 0\n")
    with pytest.raises(ConfigError, match="shard_classes: Input should be greater than or equal to 1"):
        load_run_config(path)
    with pytest.raises(ConfigError, match="per_method.FedProx.shard_classes: data and partition settings"):
        validate_experiment({"methods": ["FedAvg"], "per_method": {"FedProx": {"shard_classes": 3}}}, "c.yaml")
