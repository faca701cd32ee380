"""Models that normalise with batch statistics are scored, and static BN gathered, on batches
that mix classes, whatever the order of the data set (the CIFAR-10 archive here lists each
class together)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from incofl.data.tensors import TensorSplit
from incofl.fl.methods.width.levels import gather_statistics, statistics_indices
from incofl.fl.stages.evaluation import batch_statistics, score
from incofl.models.family import build_model

PER_CLASS = 200


def _class_sorted_split() -> TensorSplit:
    """Two classes, all of class 0 first: 4x4 grey images of brightness about 60 and 190."""
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1], PER_CLASS)
    x = np.clip(np.where(y == 0, 60, 190)[:, None, None, None] + rng.normal(0, 10, (len(y), 1, 4, 4)), 0, 255)
    return TensorSplit(x.astype(np.uint8), y, np.zeros(1), np.ones(1), torch.device("cpu"), 4)


def _brightness_classifier(track_stats: bool) -> nn.Module:
    """Brightness relative to the BN statistics decides the class: BN, mean pool, linear."""
    bn = nn.BatchNorm2d(1, affine=False, momentum=None, track_running_stats=track_stats)
    fc = nn.Linear(1, 2)
    with torch.no_grad():
        fc.weight.copy_(torch.tensor([[-1.0], [1.0]]))
        fc.bias.zero_()
    return nn.Sequential(bn, nn.AdaptiveAvgPool2d(1), nn.Flatten(), fc)


def test_a_batch_statistics_model_is_scored_on_mixed_batches():
    data = _class_sorted_split()
    scores = score(_brightness_classifier(track_stats=False), data, batch_size=50)
    correct, n = scores.correct, scores.n
    # in the data set's order every batch is one class and its own mean erases the brightness
    assert n == 2 * PER_CLASS and correct[0] / n > 0.95


@pytest.mark.parametrize(
    ("name", "kwargs", "batch"),
    [
        ("resnet110", {}, True),
        ("preresnet18", {}, True),
        ("preresnet18", {"track_stats": True}, False),
        ("resnet18", {}, False),
        ("resnet10", {}, False),
    ],
)
def test_only_models_without_running_statistics_are_scored_in_the_mixed_order(name, kwargs, batch):
    assert batch_statistics(build_model(name, 10, 3, scale=0.25, **kwargs)) is batch


@pytest.mark.parametrize("samples", [None, 300])
def test_static_bn_gathers_the_variance_of_the_pool_not_of_one_class(samples):
    data = _class_sorted_split()
    parts = [np.arange(0, 2 * PER_CLASS, 2), np.arange(1, 2 * PER_CLASS, 2)]  # each client both classes
    indices = statistics_indices(parts, samples, seed=3)
    assert torch.equal(indices, statistics_indices(parts, samples, seed=3))  # the same at every evaluation
    assert len(indices) == (samples or 2 * PER_CLASS) and len(set(indices.tolist())) == len(indices)
    model = _brightness_classifier(track_stats=True)
    gather_statistics(model, data, indices, batch_size=50)
    pixels = data.batch(indices)[0]
    assert float(model[0].running_var) == pytest.approx(float(pixels.var()), rel=0.1)
