"""Partitions: complete, disjoint, seeded, balanced, skewed as alpha says, bounded retries."""

import numpy as np
import pytest

from incofl.data.partition import Partition, PartitionError, dirichlet_partition, iid_partition, make_partition


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
