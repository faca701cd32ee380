"""Width- and depth-split models (docs/methods.md, hetero splitting): HeteroFL's pre-activation ResNet-18 and
ScaleFL's ResNet-110 with early exits, and the per-sample forward FLOPs that price their levels."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from incofl.models.family import build_model, exit_count, exit_logits
from incofl.models.flops import forward_flops
from incofl.models.preresnet import preresnet18
from incofl.models.resnet110 import resnet110

RATES = (1, 1 / 2, 1 / 4, 1 / 8, 1 / 16)
SCALEFL_LEVELS = {(0.7, 1): 0.255, (0.7, 2): 0.331, (0.75, 3): 0.485, (1, 4): 1.0}  # MACs vs full, METHODS 5.4


def _capture(module: nn.Module, store: dict, key: str, what: str = "output") -> None:
    def hook(_, inputs, output):
        store[key] = inputs[0] if what == "input" else output

    module.register_forward_hook(hook)


# ---- preresnet18 ----


def _cut_shape(name: str, full: torch.Size, rate: float) -> tuple[int, ...]:
    """A sub-model's shape: ceil(rate * C) on every channel dim, but not the image channels or class rows."""
    cut = [math.ceil(rate * d) for d in full]
    if name == "conv1.weight":
        cut[1] = full[1]
    if name.startswith("fc."):
        cut[0] = full[0]
    if len(full) == 4:
        cut[2:] = full[2:]
    return tuple(cut)


@pytest.fixture(scope="module")
def full_preresnet():
    torch.manual_seed(0)
    return preresnet18(10)


def test_preresnet_full_model_shapes(full_preresnet):
    shapes = {k: tuple(v.shape) for k, v in full_preresnet.state_dict().items()}
    assert sum(p.numel() for p in full_preresnet.parameters()) == 11_172_170
    assert len(shapes) == 56  # stem, 8 blocks x (2 BN x 2 + 2 conv), 3 shortcuts, final BN x 2, fc x 2
    assert [k for k in shapes if "shortcut" in k] == [f"layer{s}.0.shortcut.weight" for s in (2, 3, 4)]
    assert shapes["conv1.weight"] == (64, 3, 3, 3)
    assert shapes["layer1.0.bn1.weight"] == (64,)
    assert shapes["layer2.0.conv1.weight"] == (128, 64, 3, 3)
    assert shapes["layer2.0.shortcut.weight"] == (128, 64, 1, 1)
    assert shapes["layer4.1.conv2.weight"] == (512, 512, 3, 3)
    assert shapes["bn.weight"] == (512,)
    assert shapes["fc.weight"] == (10, 512) and shapes["fc.bias"] == (10,)
    assert not any(k.endswith("conv1.bias") or k.endswith("conv2.bias") for k in shapes)


@pytest.mark.parametrize("rate", RATES)
def test_preresnet_rates_cut_channels_only(rate, full_preresnet):
    full = full_preresnet.state_dict()
    sub = preresnet18(10, rate=rate).state_dict()
    assert list(sub) == list(full)
    for name, tensor in sub.items():
        assert tuple(tensor.shape) == _cut_shape(name, full[name].shape, rate), name
    if rate == 1 / 16:
        assert sub["conv1.weight"].shape == (4, 3, 3, 3) and sub["fc.weight"].shape == (10, 32)


def test_preresnet_batch_statistics_or_cumulative_running_averages():
    plain = preresnet18(10, rate=1 / 8)
    assert set(plain.state_dict()) == {n for n, _ in plain.named_parameters()}  # no buffers at all
    tracked = preresnet18(10, rate=1 / 8, track_stats=True)
    extra = set(tracked.state_dict()) - set(plain.state_dict())
    bns = [n for n, m in tracked.named_modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(bns) == 17
    assert extra == {f"{n}.{b}" for n in bns for b in ("running_mean", "running_var", "num_batches_tracked")}
    seen: dict = {}
    _capture(tracked.layer1[0].bn1, seen, "x", "input")
    means = []
    for seed in (1, 2):  # batches of different mean: momentum None gives their plain average
        torch.manual_seed(seed)
        tracked(torch.randn(4, 3, 32, 32) * seed + seed)
        means.append(seen["x"].mean(dim=(0, 2, 3)))
    torch.testing.assert_close(tracked.layer1[0].bn1.running_mean, (means[0] + means[1]) / 2)


@pytest.mark.parametrize("rate,channels", [(1, 3), (1 / 4, 1)])
def test_preresnet_outputs_and_features(rate, channels):
    model = preresnet18(10, in_channels=channels, rate=rate)
    x = torch.randn(2, channels, 32, 32)
    assert model.classifier_name == "fc"
    assert model(x).shape == (2, 10)
    assert model.features(x).shape == (2, math.ceil(512 * rate))
    torch.testing.assert_close(model(x), model.fc(model.features(x)))


def test_preresnet_blocks_are_pre_activation_with_shortcut_on_the_activation():
    torch.manual_seed(0)
    model = preresnet18(10, rate=1 / 8)
    seen: dict = {}
    _capture(model.conv1, seen, "stem")
    _capture(model.layer1[0].bn1, seen, "bn_in", "input")
    block = model.layer2[0]
    _capture(block.bn1, seen, "bn1")
    _capture(block.conv1, seen, "conv1_in", "input")
    _capture(block.shortcut, seen, "shortcut_in", "input")
    model(torch.randn(2, 3, 32, 32))
    assert torch.equal(seen["bn_in"], seen["stem"])  # no BN or pooling after the stem
    assert torch.equal(seen["conv1_in"], F.relu(seen["bn1"]))
    assert torch.equal(seen["shortcut_in"], F.relu(seen["bn1"]))


# ---- resnet110 ----


@pytest.fixture(scope="module")
def levels():
    """Full width at every depth level."""
    torch.manual_seed(0)
    return {k: resnet110(10, exits=k) for k in range(1, 5)}


def _blocks(model: nn.Module) -> dict[int, int]:
    """Blocks per stage, from the state-dict names."""
    names = {tuple(k.split(".")[:2]) for k in model.state_dict() if k.startswith("layer")}
    return {s: sum(n[0] == f"layer{s}" for n in names) for s in (1, 2, 3)}


def test_a_models_exit_count_is_the_logits_its_forward_returns(levels):
    """What the server expects of a client's scores (one entry per exit) without running the model."""
    x = torch.randn(2, 3, 32, 32)
    for model in [*levels.values(), build_model("resnet10", 10, 3, scale=0.25)]:
        model.eval()
        assert exit_count(model) == len(exit_logits(model(x)))
    assert [exit_count(m) for m in levels.values()] == [1, 2, 3, 4]


def test_resnet110_levels_are_nested(levels):
    for k in (1, 2, 3):
        small, big = levels[k].state_dict(), levels[k + 1].state_dict()
        assert set(small) < set(big)
        assert all(small[n].shape == big[n].shape for n in small)
    release = [resnet110(10, width=w, exits=k) for w, k in SCALEFL_LEVELS]
    for small, big in zip(release, release[1:], strict=False):
        assert set(small.state_dict()) < set(big.state_dict())


def test_resnet110_blocks_and_exits_per_level(levels):
    assert [sum(_blocks(levels[k]).values()) for k in (1, 2, 3, 4)] == [30, 38, 46, 54]
    assert _blocks(levels[1]) == {1: 18, 2: 12, 3: 0}
    assert _blocks(levels[3]) == {1: 18, 2: 18, 3: 10}
    for k, model in levels.items():
        names = model.state_dict()
        assert len(model.exits) == min(k, 3)
        assert ("fc.weight" in names) == (k == 4)
        assert not any("running" in n or "num_batches" in n for n in names)  # batch statistics only
    full = levels[4].state_dict()
    assert {n.rsplit(".", 2)[0] for n in full if "shortcut" in n} == {"layer2.0.shortcut", "layer3.0.shortcut"}
    assert full["layer2.0.shortcut.0.weight"].shape == (32, 16, 1, 1)
    assert full["layer2.0.shortcut.1.bias"].shape == (32,)
    for e, c in enumerate((32, 64, 64)):
        exit_names = sorted(n for n in full if n.startswith(f"exits.{e}."))
        assert [n for n in exit_names if "convs" in n] == [f"exits.{e}.convs.{i}.weight" for i in range(3)]
        assert all(full[f"exits.{e}.convs.{i}.weight"].shape == (c, c, 3, 3) for i in range(3))
        assert full[f"exits.{e}.bns.2.weight"].shape == (c,) and full[f"exits.{e}.fc.weight"].shape == (10, c)
        assert len(exit_names) == 3 + 6 + 2


@pytest.mark.parametrize("width,channels", [(0.7, (11, 22, 44)), (0.75, (12, 24, 48))])
def test_resnet110_width_rounds_down(width, channels):
    names = resnet110(10, width=width).state_dict()
    a, b, c = channels
    assert names["conv1.weight"].shape == (a, 3, 3, 3)
    assert names["layer1.17.conv2.weight"].shape == (a, a, 3, 3)
    assert names["layer2.0.conv1.weight"].shape == (b, a, 3, 3)
    assert names["layer3.0.shortcut.0.weight"].shape == (c, b, 1, 1)
    assert names["exits.0.convs.0.weight"].shape == (b, b, 3, 3)
    assert names["exits.2.fc.weight"].shape == (10, c)
    assert names["fc.weight"].shape == (10, c)


def test_resnet110_exits_read_the_documented_blocks(levels):
    model = levels[4]
    seen: dict = {}
    for e, (stage, block) in enumerate([(2, 11), (3, 1), (3, 9)]):  # blocks 30, 38, 46 counted from 1
        _capture(getattr(model, f"layer{stage}")[block], seen, f"block{e}")
        _capture(model.exits[e], seen, f"exit{e}", "input")
    torch.manual_seed(0)
    out = model(torch.randn(2, 3, 32, 32))
    assert len(out) == 4 and all(o.shape == (2, 10) for o in out)
    for e in range(3):
        assert seen[f"exit{e}"] is seen[f"block{e}"]


@pytest.mark.slow
def test_resnet110_sub_model_is_the_full_model_cut_at_its_exit(levels):
    full = levels[4]
    torch.manual_seed(1)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = full(x)
        for k in (1, 2, 3):
            sub = resnet110(10, exits=k)
            sub.load_state_dict({n: full.state_dict()[n] for n in sub.state_dict()})
            out = sub(x)
            assert len(out) == k
            for a, b in zip(out, expected[:k], strict=True):
                torch.testing.assert_close(a, b)


def test_resnet110_rejects_unknown_levels():
    for exits in (0, 5):
        with pytest.raises(ValueError, match="exits"):
            resnet110(10, exits=exits)


def test_scalefl_level_costs_match_the_release(levels):
    """Relative tolerance: |ratio - target| <= 2% of the target."""
    full = forward_flops(levels[4])
    for (width, exits), target in SCALEFL_LEVELS.items():
        ratio = forward_flops(resnet110(10, width=width, exits=exits)) / full
        assert ratio == pytest.approx(target, rel=0.02), (width, exits)


# ---- forward_flops ----


def test_forward_flops_counts_one_sample_and_restores_the_mode():
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 5))
    assert forward_flops(model, image_size=4) == 2 * 48 * 5  # multiply-adds of one image, bias not counted
    assert model.training
    conv = nn.Conv2d(1, 2, 3, padding=1).eval()
    assert forward_flops(conv, image_size=8, in_channels=1) == 2 * 2 * 9 * 64
    assert not conv.training
