"""The authors' input pipeline as options (issue 12, docs/methods.md, "Fidelity"): every option is a
validated key that reaches the data pipeline (augmentation, crop padding, normalisation,
resize, incomplete batches, the test set scored, the partition), defaults stay ours, and the
release's partition files are read safely. Also the collapse hypotheses' switches: FedProx's
fixed anchor and the ViT epoch scale for every method."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import engine_on, small_synthetic

from incofl.config import ConfigError, RunConfig, validate_experiment
from incofl.data.augment import Augmentation, augment, cutout, random_resized_crop, resolve_augment, to_device
from incofl.data.dataset import ImageDataset
from incofl.data.partition import Partition, iid_partition, make_partition, partition_for
from incofl.data.release import ReleasePartitionError, read_release_partition, release_file
from incofl.data.sources import load_dataset
from incofl.data.tensors import TensorSplit
from incofl.fl.contracts import Round, RoundContext, Setup
from incofl.fl.engine.simulator import simulator
from incofl.fl.methods.inco.step import InCoStep
from incofl.fl.stages.evaluation import score
from incofl.fl.stages.local import client_batches
from incofl.fl.stages.transforms import EpochScale
from incofl.models.family import build_model
from incofl.registry import METHODS
from incofl.sides import ServerSettings

CPU = torch.device("cpu")


def _images(n: int, channels: int = 3, size: int = 8, seed: int = 0) -> ImageDataset:
    rng = np.random.default_rng(seed)
    x = rng.integers(1, 256, (n, channels, size, size), dtype=np.uint8)  # no black pixel
    y = np.arange(n, dtype=np.int64) % 10
    return ImageDataset("synthetic", x, y, x.copy(), y.copy())


# --- augmentation --------------------------------------------------------------------------
def test_release_augmentation_per_data_set_and_family():
    assert resolve_augment("auto", "cifar10") == Augmentation(crop=True, flip=True)
    assert resolve_augment("release", "cifar10") == Augmentation(crop=True, flip=True, cutout=16)
    assert resolve_augment("release", "svhn") == Augmentation(cutout=16)  # no crop, no flip
    assert resolve_augment("release", "cinic10") == Augmentation(crop=True, flip=True)
    assert resolve_augment("release", "fmnist") == Augmentation()
    assert resolve_augment("release", "cifar10", model="vit_d8") == Augmentation(resized_crop=224, flip=True)
    assert resolve_augment("crop", "cifar10", cutout=8, pad_fill="black") == Augmentation(
        crop=True, cutout=8, black_pad=True
    )
    assert resolve_augment("release", "cifar10", cutout=0).cutout == 0


def test_cutout_zeroes_one_clipped_square_per_image():
    x = torch.ones(200, 3, 32, 32)
    out = cutout(x, 16, torch.Generator().manual_seed(0))
    zeros = (out[:, 0] == 0).sum((1, 2))
    assert (out[:, 0] == out[:, 2]).all()  # the same square on every channel
    assert zeros.max() == 256 and zeros.min() >= 64  # 16 x 16 inside; at least 8 x 8 at a corner
    assert (zeros < 256).any()  # squares are clipped at the border, as released
    rows = (out[:, 0] == 0).any(2).sum(1)
    assert (rows <= 16).all()


@pytest.mark.parametrize("fill,expected", [("mean", 0.5), ("black", 0.0)])
def test_crop_padding_colour_in_pixel_space(fill, expected):
    """Pixels of 0.5 normalised with mean 0.5: `mean` pads with the mean colour (0 after
    normalising), `black` with pixel 0 as the release's PIL pad does."""
    data = ImageDataset(
        "x",
        np.full((64, 3, 8, 8), 128, np.uint8),
        np.zeros(64, np.int64),
        np.zeros((1, 3, 8, 8), np.uint8),
        np.zeros(1, np.int64),
    )
    train, _ = to_device(data, CPU, 8, resolve_augment("crop", "x", pad_fill=fill), normalize="half")
    x, _ = train.batch(torch.arange(64), torch.Generator().manual_seed(1))
    pixels = x * 0.5 + 0.5  # back to [0, 1]
    border = pixels[(pixels - 128 / 255).abs() > 1e-3]
    assert len(border) > 0 and torch.allclose(border, torch.tensor(expected))


def _crop_then_flip(x: torch.Tensor, seed: int) -> torch.Tensor:
    """The default augmentation restated image by image: the generator's row offsets, column
    offsets (0..8 in the 4-pixel zero-padded image), then a coin per image for a left-right flip."""
    gen = torch.Generator().manual_seed(seed)
    n, _, h, w = x.shape
    dy, dx = torch.randint(0, 9, (n,), generator=gen), torch.randint(0, 9, (n,), generator=gen)
    flips = torch.rand(n, generator=gen) < 0.5
    out = []
    for img, top, left, flip in zip(x, dy.tolist(), dx.tolist(), flips.tolist(), strict=True):
        crop = F.pad(img, (4, 4, 4, 4))[:, top : top + h, left : left + w]
        out.append(crop.flip(2) if flip else crop)
    return torch.stack(out)


def test_default_augmentation_draws_are_unchanged():
    """crop then flip from the client's generator, as before the options existed (the golden
    run pins the rest): against the augmentation restated image by image."""
    x = torch.randn(16, 3, 8, 8)
    a = augment(x, Augmentation(crop=True, flip=True), torch.Generator().manual_seed(3))
    assert torch.equal(a, _crop_then_flip(x, 3)) and not torch.equal(a, _crop_then_flip(x, 4))
    b = augment(x, Augmentation(crop=True, flip=True, black_pad=True), torch.Generator().manual_seed(3), None)
    assert torch.equal(a, b)  # no fill given: zero padding, same draws


def test_random_resized_crop_gives_224_and_is_seeded():
    x = torch.randn(4, 3, 32, 32)
    a = random_resized_crop(x, 224, torch.Generator().manual_seed(0))
    b = random_resized_crop(x, 224, torch.Generator().manual_seed(0))
    assert a.shape == (4, 3, 224, 224) and torch.equal(a, b)


# --- normalisation, resize, incomplete batches ------------------------------------------------
@pytest.mark.parametrize("mode,lo,hi", [("none", 0.0, 1.0), ("half", -1.0, 1.0)])
def test_normalisation_modes(mode, lo, hi):
    data = _images(32)
    train, test = to_device(data, CPU, 8, normalize=mode)
    x, _ = test.batch(torch.arange(32))
    ref = torch.from_numpy(data.x_test).float() / 255
    assert torch.allclose(x, ref if mode == "none" else ref * 2 - 1)
    assert lo <= x.min() and x.max() <= hi


def test_drop_last_keeps_only_full_batches():
    split = TensorSplit(*(_images(100).x_train, _images(100).y_train), np.zeros(3), np.ones(3), CPU, 8)
    gen = torch.Generator().manual_seed(0)
    assert [len(y) for _, y in client_batches(split, np.arange(100), 2, 32, gen)] == [32, 32, 32, 4] * 2
    assert [len(y) for _, y in client_batches(split, np.arange(100), 2, 32, gen, drop_last=True)] == [32] * 6
    assert list(client_batches(split, np.arange(20), 1, 32, gen, drop_last=True)) == []  # no step


def test_drop_last_scores_the_test_sets_full_batches():
    """As released: CIFAR-10's 10,000 test images in batches of 512 score 9,728."""
    n = 10_000
    x = np.zeros((n, 1, 2, 2), np.uint8)
    x[9728:] = 255  # the tail the release never scores
    split = TensorSplit(x, np.zeros(n, np.int64), np.zeros(1), np.ones(1), CPU, 2)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
    with torch.no_grad():
        model[1].weight.zero_()
        model[1].weight[1] = 1.0  # class 1 for a bright image, else class 0
        model[1].bias.copy_(torch.tensor([0.5, 0.0]))
    assert score(model, split, 512, drop_last=True).accuracy() == 100.0
    assert score(model, split, 512).accuracy() == pytest.approx(100.0 * 9728 / n)


# --- the options reach the engine --------------------------------------------------------------
def _engine(data, **settings):
    base = {
        "dataset": "synthetic",
        "clients": 4,
        "ratio": 0.5,
        "models": ["resnet10", "resnet14"],
        "rounds": 1,
        "partition": "iid",
        "progress": False,
        "device": "cpu",
    }
    cfg = RunConfig(**{**base, **settings})
    parts = iid_partition(len(data.y_train), cfg.clients, seed=0)
    return simulator(cfg, data, Partition(parts, np.zeros((cfg.clients, 0)), {}), CPU)


def test_every_pipeline_option_reaches_the_engine():
    data = _images(40, channels=1, size=28)
    default = _engine(data)
    assert default.transport.clients.training.train.augmenter is None  # synthetic: no augmentation by default
    assert (
        default.transport.clients.training.train.input_size == 28
        and not default.transport.clients.runner.trainer.settings.drop_last
    )
    engine = _engine(
        data,
        augment="crop_flip",
        cutout=6,
        pad_fill="black",
        normalize="none",
        resize=32,
        drop_last=True,
        eval_batch_size=16,
    )
    assert engine.transport.clients.training.train.augmenter == Augmentation(
        crop=True, flip=True, cutout=6, black_pad=True
    )
    assert engine.server.test.augmenter is None  # the test set is never augmented
    assert engine.transport.clients.training.train.input_size == engine.server.test.input_size == 32
    assert engine.server.test.batch(torch.arange(2))[0].shape == (2, 1, 32, 32)
    assert torch.equal(engine.server.test.mean, torch.zeros(1, 1, 1, 1)) and torch.equal(
        engine.server.test.std, torch.ones(1, 1, 1, 1)
    )
    assert engine.server.layout.evaluator.drop_last and engine.server.layout.evaluator.batch_size == 16
    batches = client_batches(
        engine.transport.clients.training.train,
        engine.transport.clients.training.parts[0],
        1,
        4,
        torch.Generator(),
        engine.server.settings.drop_last,
    )
    assert all(len(y) == 4 for _, y in batches)


def test_per_dataset_overrides_apply_to_that_data_set_only():
    exp = validate_experiment(
        {
            "datasets": ["fmnist", "svhn"],
            "methods": ["InCoAvg", "MOON"],
            "per_dataset": {"fmnist": {"resize": 32, "normalize": "none"}},
            "per_method": {"MOON": {"rounds": 7}},
        }
    )
    fm = exp.run_config("fmnist", 0.5, "MOON", 0)
    sv = exp.run_config("svhn", 0.5, "InCoAvg", 0)
    assert (fm.resize, fm.normalize, fm.rounds) == (32, "none", 7)
    assert (sv.resize, sv.normalize, sv.rounds) == (None, "stats", 50)


@pytest.mark.parametrize(
    "raw,message",
    [
        ({"per_dataset": {"fmnist": {"resize": 2}}}, "per_dataset.fmnist.resize: Input should be greater than"),
        ({"per_dataset": {"imagenet": {"resize": 32}}}, "per_dataset.imagenet: unknown dataset"),
        ({"per_dataset": {"fmnist": {"no_such": 1}}}, "per_dataset.fmnist.no_such: unknown key"),
        ({"augment": "cutout"}, "augment: Input should be"),
        ({"cutout": -1}, "cutout: Input should be greater than or equal to 0"),
        ({"pad_fill": "white"}, "pad_fill: Input should be 'mean' or 'black'"),
        ({"normalize": "imagenet"}, "normalize: Input should be"),
        ({"drop_last": "yes please"}, "drop_last: Input should be a valid boolean"),
        ({"fmnist_partition": "svhn"}, "fmnist_partition: Input should be 'own' or 'cifar'"),
        ({"partition": "release"}, "release_partitions: needed with partition: release"),
        ({"vit_epoch_scale": "some"}, "vit_epoch_scale: Input should be 'inco' or 'all'"),
        ({"methods": ["FedProx"], "method_args": {"anchor": "first"}}, "method_args.anchor: Input should be 'round'"),
    ],
)
def test_bad_pipeline_values_name_the_key(raw, message):
    with pytest.raises(ConfigError) as err:
        validate_experiment(raw)
    assert message in str(err.value) and "\n" not in str(err.value)


# --- partitions: the release's files and FMNIST drawn over CIFAR-10 ------------------------------
def _release_npy(path, mapping):
    """A file in the release's format: np.save of a dict {client: list of indices}."""
    np.save(path, np.array(mapping, dtype=object), allow_pickle=True)


def test_release_partition_files_are_read_and_checked(tmp_path):
    mapping = {0: [4, 0, 2], 1: [1, 5], 2: [3]}
    assert release_file(tmp_path, "svhn", 3, 1) == tmp_path / "SVHN_hetero-fix-3-1.0.npy"
    assert release_file(tmp_path, "fmnist", 3, 0.5) == tmp_path / "hetero-fix-3-0.5.npy"  # CIFAR-10's file
    _release_npy(tmp_path / "hetero-fix-3-0.5.npy", mapping)
    parts = read_release_partition(tmp_path / "hetero-fix-3-0.5.npy", 6)
    assert [p.tolist() for p in parts] == [[4, 0, 2], [1, 5], [3]]
    with pytest.raises(ReleasePartitionError, match="outside the 5 training samples"):
        read_release_partition(tmp_path / "hetero-fix-3-0.5.npy", 5)
    _release_npy(tmp_path / "twice.npy", {0: [0, 1], 1: [1]})
    with pytest.raises(ReleasePartitionError, match="two clients"):
        read_release_partition(tmp_path / "twice.npy", 6)
    with pytest.raises(ReleasePartitionError, match="not found"):
        read_release_partition(tmp_path / "missing.npy", 6)


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_release_partition_reader_runs_no_code(tmp_path, monkeypatch):
    """A pickle can call anything on load: the reader builds numpy arrays and nothing else."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.npy"
    with path.open("wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": "|O", "fortran_order": False, "shape": ()})
        pickle.dump(_Exploit(), fh)
    with pytest.raises(ReleasePartitionError, match="refused global posix.system|refused global os.system"):
        read_release_partition(path, 10)
    assert not (tmp_path / "pwned").exists()


def test_partition_release_through_the_config(tmp_path):
    data = _images(12)
    _release_npy(tmp_path / "hetero-fix-3-0.5.npy", {0: list(range(0, 4)), 1: list(range(4, 8)), 2: list(range(8, 12))})
    cfg = RunConfig(
        dataset="cifar10",
        clients=3,
        models=["resnet10"],
        partition="release",
        release_partitions=str(tmp_path),
        alpha=0.5,
    )
    part = partition_for(cfg, data)
    assert [p.tolist() for p in part.parts] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert part.meta["kind"] == "release" and part.histogram.sum() == 12
    (tmp_path / "hetero-fix-3-0.5.npy").rename(tmp_path / "hetero-fix-4-0.5.npy")
    with pytest.raises(ReleasePartitionError, match="3 clients, config has clients=4"):
        partition_for(cfg.model_copy(update={"clients": 4}), data)
    folder = dataclasses.replace(data, order="folder")
    with pytest.raises(ReleasePartitionError, match="published order"):
        partition_for(cfg, folder)  # an image-folder CIFAR-10 is in class order: indices would mean other images


@pytest.mark.slow
@pytest.mark.xdist_group("cifar10")  # the tests that read CIFAR-10 on one worker: its cache_dir decodes it once
def test_fmnist_partition_drawn_over_cifar10_labels(data_dir, cache_dir):
    """The release's FMNIST clients get the CIFAR-10 partition: Dirichlet over CIFAR-10's labels,
    applied to FMNIST's first 50,000 images (10,000 unused)."""
    cifar = load_dataset("cifar10", data_dir, cache_dir)
    fmnist_labels = np.random.default_rng(0).integers(0, 10, 60_000)
    fake_fmnist = ImageDataset(
        "fmnist",
        np.zeros((60_000, 1, 1, 1), np.uint8),
        fmnist_labels,
        np.zeros((1, 1, 1, 1), np.uint8),
        np.zeros(1, np.int64),
    )
    cfg = RunConfig(
        dataset="fmnist",
        fmnist_partition="cifar",
        data_dir=str(data_dir),
        cache_dir=str(cache_dir),
        clients=20,
        models=["resnet10"],
        alpha=0.5,
    )
    part = partition_for(cfg, fake_fmnist)
    want = make_partition(cifar.y_train, kind="dirichlet", num_clients=20, alpha=0.5, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(part.parts, want.parts, strict=True))
    assert sum(map(len, part.parts)) == 50_000
    assert part.histogram.sum(1).tolist() == [len(p) for p in part.parts]  # FMNIST's own labels counted
    assert np.array_equal(part.histogram[0], np.bincount(fmnist_labels[part.parts[0]], minlength=10))
    own = partition_for(cfg.model_copy(update={"fmnist_partition": "own"}), fake_fmnist)
    assert sum(map(len, own.parts)) == 60_000


# --- the collapse hypotheses' switches ---------------------------------------------------------
def _prox_run(rounds: int, anchor: str) -> str:
    torch.set_num_threads(1)
    full = load_dataset("synthetic", cache_dir=None)
    data = ImageDataset("synthetic", full.x_train[:160], full.y_train[:160], full.x_test[:40], full.y_test[:40])
    engine = _engine(data, method="FedProx", rounds=rounds, ratio=1.0, method_args={"anchor": anchor, "mu": 1.0})
    for r in Round.upto(rounds):
        engine.run_round(r)
    h = hashlib.sha256()
    for state in engine.server.weights:
        for k, v in sorted(state.items()):
            h.update(k.encode() + v.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


@pytest.mark.slow
def test_fedprox_initial_anchor_is_the_round_anchor_in_round_one_only():
    """Round 1 starts from the initial model, so both anchors coincide (bit-identical); after
    that the fixed anchor pulls elsewhere."""
    assert _prox_run(1, "initial") == _prox_run(1, "round")
    assert _prox_run(2, "initial") != _prox_run(2, "round")


def test_vit_epoch_scale_for_every_method_or_inco_only():
    """By default only InCo's official ViT step divides by E; `vit_epoch_scale: all` (the
    release) has the engine's EpochScale do it for every method, on ViTs only, and InCo's step
    then does not divide again."""
    names = list(build_model("vit_d8", 10, 3, image_size=32).state_dict())
    hetero, inco = METHODS["HeteroAvg"].parse_args({}), METHODS["InCoAvg"].parse_args({})
    paper = METHODS["InCoAvg-paper"].parse_args({})
    ours = RunConfig(models=["vit_d8"], local_epochs=4)
    release = ours.model_copy(update={"vit_epoch_scale": "all"})
    assert not ours.scales_epochs and release.scales_epochs
    assert not RunConfig(local_epochs=4, vit_epoch_scale="all").scales_epochs  # ViTs only
    on_ours, on_release = (Setup(ServerSettings.of(cfg), names) for cfg in (ours, release))
    assert InCoStep(inco, on_ours).scale == 0.25  # InCo's official ViT form
    assert InCoStep(paper, on_ours).scale == 1.0  # ours: the paper's variant and baselines unscaled
    assert EpochScale(hetero, on_release).scale == 0.25  # the release: every method
    assert InCoStep(inco, on_release).scale == 1.0  # divided once
    average = {"w": torch.ones(3)}
    scaled = EpochScale(hetero, on_release)(average, RoundContext(Round(1), 0, 1, 1))
    assert torch.equal(scaled["w"], torch.full((3,), 0.25))


def test_the_engine_puts_the_release_epoch_scale_first_on_vits_only():
    data = small_synthetic(8, 4)

    def posts(**settings):
        engine = engine_on(data, method="InCoAvg", clients=2, ratio=1.0, local_epochs=4, partition="iid", **settings)
        return [(type(t).__name__, t.scale) for t in engine.server.post]

    assert posts(models=["vit_d8"]) == [("InCoStep", 0.25)]
    assert posts(models=["vit_d8"], vit_epoch_scale="all") == [("EpochScale", 0.25), ("InCoStep", 1.0)]
    assert posts(models=["resnet10"], vit_epoch_scale="all") == [("InCoStep", 1.0)]  # ViTs only
