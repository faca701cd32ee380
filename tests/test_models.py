"""The model families: the paper's parameter counts and name-subset nesting."""

import pytest
import torch

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
