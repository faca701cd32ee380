"""cnn20, FedLAG's released CNN (docs/methods.md, FedLAG; khanhkhanhlele/FedLAG,
system/flcore/trainmodel/models.py `FedAvgCNN20`): its layers and parameter count, input sizes,
MOON's interface, the config's family rules, and real runs of the engine on it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import assert_trained, learned, seen
from torch import nn

from incofl.config import ConfigError, RunConfig, load_run_config
from incofl.data.partition import Partition, iid_partition
from incofl.data.sources import load_dataset
from incofl.fl.engine.simulator import simulator, train
from incofl.models.cnn import flat_features
from incofl.models.family import build_model, check_nested, num_parameters
from incofl.registry import METHODS

TINY = {
    "dataset": "synthetic",
    "clients": 2,
    "ratio": 1.0,
    "models": ["cnn20"],
    "batch_size": 16,
    "partition": "iid",
    "rounds": 2,
    "eval_every": 1,
    "checkpoint_every": 1,
    "progress": False,
    "threads": 1,
    "device": "cpu",
}
# the release's state-dict entries (FedLAG wraps them as base.* and head.*), input to output
RELEASE_NAMES = [
    *(f"conv{b}.{i}.{p}" for b in (1, 2, 3) for i in (0, 2) for p in ("weight", "bias")),
    "fc1.0.weight",
    "fc1.0.bias",
    "fc.weight",
    "fc.bias",
]


def _conv(cin: int, cout: int) -> int:
    return cin * cout * 3 * 3 + cout  # 3x3 kernel with bias


def _linear(fin: int, fout: int) -> int:
    return fin * fout + fout


def release_count(in_channels: int = 3, classes: int = 10, side: int = 32) -> int:
    """FedAvgCNN20's parameters, layer by layer."""
    convs = _conv(in_channels, 32) + _conv(32, 32) + _conv(32, 64) + _conv(64, 64) + _conv(64, 128) + _conv(128, 128)
    return convs + _linear(128 * (side // 8) ** 2, 512) + _linear(512, classes)


@pytest.fixture(scope="module")
def data():
    """64 training images of the synthetic set (32 a client, 2 steps a round), the first 32 also its test split."""
    torch.set_num_threads(1)  # the machine's cores are shared
    return seen(load_dataset("synthetic", cache_dir=None), 64, 32)


# --- the model ---------------------------------------------------------------------------------


def test_parameter_count_is_the_releases():
    model = build_model("cnn20", 10, 3)
    assert num_parameters(model) == release_count() == 1_341_226
    assert flat_features(32) == 2048 and model.fc1[0].in_features == 2048
    assert num_parameters(build_model("cnn20", 10, 1)) == release_count(in_channels=1)  # grey: 1 input channel


def test_layers_are_the_releases():
    """Six 3x3 convolutions with bias and padding 1, ReLU after each, a 2x2 max-pool after each
    pair; FC 2048 -> 512 with ReLU, head 512 -> 10; no batch norm, no dropout; the release's names."""
    model = build_model("cnn20", 10, 3)
    assert list(model.state_dict()) == RELEASE_NAMES  # parameters only: no BN buffers
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert [(c.in_channels, c.out_channels) for c in convs] == [
        (3, 32),
        (32, 32),
        (32, 64),
        (64, 64),
        (64, 128),
        (128, 128),
    ]
    assert all(c.kernel_size == (3, 3) and c.padding == (1, 1) and c.stride == (1, 1) for c in convs)
    for block in (model.conv1, model.conv2, model.conv3):
        assert [type(m) for m in block] == [nn.Conv2d, nn.ReLU, nn.Conv2d, nn.ReLU, nn.MaxPool2d]
        assert block[4].kernel_size == 2 and block[4].stride == 2
    assert [type(m) for m in model.fc1] == [nn.Linear, nn.ReLU]
    assert (model.fc.in_features, model.fc.out_features) == (512, 10)
    kinds = {type(m) for m in model.modules()}
    assert kinds == {type(model), nn.Sequential, nn.Conv2d, nn.ReLU, nn.MaxPool2d, nn.Linear}


def test_pytorch_default_initialisation():
    """The release initialises nothing itself: every layer has PyTorch's default (a seeded build
    draws what plain nn.Conv2d / nn.Linear layers built in the same order draw)."""
    torch.manual_seed(3)
    model = build_model("cnn20", 10, 3)
    torch.manual_seed(3)
    plain = [nn.Conv2d(a, b, 3, padding=1) for a, b in [(3, 32), (32, 32), (32, 64), (64, 64), (64, 128), (128, 128)]]
    plain += [nn.Linear(2048, 512), nn.Linear(512, 10)]
    expected = [t for layer in plain for t in (layer.weight, layer.bias)]
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), expected, strict=True))


@pytest.mark.parametrize("channels,side,classes", [(3, 32, 10), (1, 32, 10), (1, 28, 7), (3, 8, 4)])
def test_output_shape_and_input_sizes(channels, side, classes):
    """fc1's width follows the input side (28x28 FMNIST: 128*3*3), so any side >= 8 runs."""
    model = build_model("cnn20", classes, channels, image_size=side)
    x = torch.randn(2, channels, side, side)
    assert model(x).shape == (2, classes)
    assert model.features(x).shape == (2, 512)
    assert model.fc1[0].in_features == 128 * (side // 8) ** 2
    assert num_parameters(model) == release_count(channels, classes, side)


def test_images_too_small_are_refused():
    with pytest.raises(ValueError, match="cnn20: images of side 7 vanish"):
        build_model("cnn20", 10, 3, image_size=7)


def test_moon_interface():
    """MOON's projection head between features and head: forward = classify(embed(x)); without
    one, embed is the features and the head reads them."""
    torch.manual_seed(0)
    x = torch.randn(4, 3, 32, 32)
    moon = build_model("cnn20", 10, 3, projection_dim=256).eval()
    assert torch.equal(moon(x), moon.classify(moon.embed(x)))
    assert moon.embed(x).shape == (4, 256) and moon.features(x).shape == (4, 512)
    assert (moon.fc.in_features, moon.fc.out_features) == (256, 10)
    assert [k for k in moon.state_dict() if k.startswith("proj.")] == [
        "proj.0.weight",
        "proj.0.bias",
        "proj.2.weight",
        "proj.2.bias",
    ]
    plain = build_model("cnn20", 10, 3, projection_dim=0).eval()
    assert plain.proj is None and torch.equal(plain.embed(x), plain.features(x))
    assert torch.equal(plain(x), plain.classify(plain.features(x)))
    assert check_nested([plain]) == 0


# --- config ------------------------------------------------------------------------------------


def test_config_takes_cnn20_alone():
    assert RunConfig(models=["cnn20"], method="FedAvg").models == ["cnn20"]
    with pytest.raises(ConfigError, match="all models must come from one family"):
        load_run_config(None, {"models": ["resnet10", "cnn20"]})


def test_fedpart_is_refused_on_cnn20():
    with pytest.raises(ConfigError, match="layer groups are defined for ResNets, not cnn20"):
        load_run_config(None, {"models": ["cnn20"], "method": "FedPart"})


# --- the engine --------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("method", ["FedAvg", "MOON"])
def test_two_round_run(tmp_path, data, method):
    """A real run (incofl.fl.engine.run.train): two rounds, evaluated, the weights moved and the loss fell."""
    cfg = RunConfig(**TINY, method=method)
    summary = train(cfg, tmp_path / method, data=data)
    assert summary["status"] == "completed" and summary["rounds"] == 2
    assert 0.0 <= summary["final_acc"] <= 100.0
    assert_trained(summary, cfg, data)
    assert len((tmp_path / method / "metrics.csv").read_text().splitlines()) == 1 + 2  # header, two rounds
    engine = simulator(cfg, data, Partition(iid_partition(64, 2, seed=0), np.zeros((2, 0)), {}), torch.device("cpu"))
    names = list(engine.server.weights[0])
    assert {"fc.weight", "fc.bias"} <= set(names)  # the head FedPer keeps personal
    assert any(n.startswith("proj.") for n in names) == (method == "MOON")
    learned(engine, rounds=2)
    assert engine.server.models[0](engine.transport.clients.training.train.batch(torch.arange(4))[0]).shape == (4, 10)


FULL_METHODS = [m for m, spec in METHODS.items() if not spec.partial and not spec.width]  # width: own models


@pytest.mark.parametrize("method", FULL_METHODS)
def test_every_method_trains_a_round_on_cnn20(data, method):
    """Every registered method but the partial ones (ResNet layer groups) trains on cnn20."""
    personal = method in ("Local", "FedPer", "FedLAG")  # tested on each client's held-out share
    cfg = RunConfig(**TINY, method=method, holdout=0.25 if personal else 0.0)
    engine = simulator(cfg, data, Partition(iid_partition(64, 2, seed=0), np.zeros((2, 0)), {}), torch.device("cpu"))
    assert np.isfinite(learned(engine)["mean_acc"])
