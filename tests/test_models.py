"""The model families: the paper's parameter counts and name-subset nesting."""

import math

import pytest
import torch

from incofl.config import RunConfig
from incofl.models.family import build_model, check_nested, num_parameters

PAPER_COUNTS = {
    "resnet10": 4_910_922,
    "resnet14": 10_812_234,
    "resnet18": 11_181_642,
    "resnet22": 17_082_954,
    "resnet26": 17_452_362,
}  # 4.91M / 10.81M / 11.18M / 17.08M / 17.45M


@pytest.mark.parametrize("name,count", PAPER_COUNTS.items())
def test_resnet_parameter_counts(name, count):
    assert num_parameters(build_model(name, 10, 3)) == count


def test_resnet_family_is_nested_by_name_and_shape():
    models = [build_model(n, 10, 3) for n in PAPER_COUNTS]
    for small, big in zip(models, models[1:], strict=False):
        s, b = small.state_dict(), big.state_dict()
        assert set(s) < set(b)
        assert all(s[k].shape == b[k].shape for k in s)
    assert check_nested(models) == 4


@pytest.mark.parametrize("scale", [0.25, 0.5])
def test_model_scale_thins_every_resnet_stage_alike_and_keeps_the_family_nested(scale):
    """Each stage's convs and BNs have scale x torchvision's channels, the classifier reads the last
    stage's; the members stay name-and-shape nested; scale 1 is the paper's model."""
    models = [build_model(n, 10, 3, scale=scale) for n in PAPER_COUNTS]
    assert check_nested(models) == 4
    big, full = models[-1].state_dict(), build_model("resnet26", 10, 3).state_dict()
    assert set(big) == set(full)
    for name, tensor in full.items():  # every channel dimension (not the input image's, not the classes) is scaled
        want = [round(d * scale) if d >= 64 else d for d in tensor.shape]
        assert list(big[name].shape) == want, name
    assert models[0](torch.randn(2, 3, 32, 32)).shape == (2, 10)
    eight = build_model("resnet8", 10, 3, scale=scale, stem="cifar")
    assert eight.fc.in_features == round(256 * scale) and eight(torch.randn(2, 3, 8, 8)).shape == (2, 10)
    assert num_parameters(build_model("resnet10", 10, 3, scale=1.0)) == PAPER_COUNTS["resnet10"]


@pytest.mark.parametrize("models", [["cnn20"], ["vit_d8", "vit_d12"]])
def test_model_scale_is_refused_for_models_it_does_not_thin(models):
    with pytest.raises(ValueError, match=f"model_scale: thins ResNets and width models .*not {models[0]}"):
        RunConfig(models=models, model_scale=0.5)
    RunConfig(models=["resnet10", "resnet14"], model_scale=0.5)


@pytest.mark.parametrize("stem,channels,size", [("imagenet", 1, 28), ("cifar", 3, 32), ("imagenet", 3, 32)])
def test_resnet_stems_and_channels(stem, channels, size):
    model = build_model("resnet10", 7, channels, stem=stem)
    assert model(torch.randn(2, channels, size, size)).shape == (2, 7)
    assert model.features(torch.randn(2, channels, size, size)).shape == (2, 512)
    assert (model.conv1.kernel_size == (3, 3)) == (stem == "cifar")


def test_vit_depth_family_is_nested(tmp_path):
    models = [build_model(f"vit_d{d}", 10, 3, image_size=224) for d in (8, 12)]
    assert check_nested(models) == 1
    assert sum(k.endswith("norm1.weight") for k in models[0].state_dict()) == 8
    assert models[0](torch.randn(1, 3, 224, 224)).shape == (1, 10)


def test_vit_loads_local_pretrained_weights_with_fresh_head(tmp_path):
    donor = build_model("vit_d12", 100, 3, image_size=224)
    torch.save(donor.state_dict(), tmp_path / "vit.pt")
    model = build_model("vit_d8", 10, 3, pretrained=str(tmp_path / "vit.pt"), image_size=224)
    assert torch.equal(model.state_dict()["blocks.7.attn.qkv.weight"], donor.state_dict()["blocks.7.attn.qkv.weight"])
    assert model.head.weight.shape == (10, 384)


def test_unnested_models_are_rejected():
    with pytest.raises(ValueError, match="not nested"):
        check_nested([build_model("resnet10", 10, 3), build_model("resnet10", 5, 3)])


@pytest.mark.parametrize("stem,channels,kernel", [("cifar", 3, 3), ("cifar", 1, 3), ("imagenet", 1, 7)])
def test_a_replaced_first_conv_is_kaiming_initialised_like_the_rest(stem, channels, kernel):
    """The release (and torchvision) draw every conv kaiming-normal (fan_out, relu): std =
    sqrt(2 / (64 k^2)). PyTorch's default for a new conv is about 0.19 for a 1-channel 3x3."""
    torch.manual_seed(0)
    conv1 = build_model("resnet10", 10, channels, stem=stem).conv1.weight
    assert conv1.shape[1:] == (channels, kernel, kernel)
    assert conv1.std().item() == pytest.approx(math.sqrt(2 / (64 * kernel**2)), rel=0.15)
    assert abs(conv1.mean().item()) < 0.2 * conv1.std().item()  # normal around 0, not uniform in [0, b]


def test_vit_takes_grey_images_as_three_channels_with_pretrained_weights(tmp_path):
    """FMNIST with pretrained ViT weights: grey images are copied to 3 channels (as released)."""
    torch.save(build_model("vit_d8", 100, 3, image_size=224).state_dict(), tmp_path / "vit.pt")
    model = build_model("vit_d8", 10, 1, pretrained=str(tmp_path / "vit.pt"), image_size=224).eval()
    grey = torch.randn(2, 1, 224, 224)
    assert torch.equal(model(grey), model(grey.expand(-1, 3, -1, -1)))
