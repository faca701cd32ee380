"""Data sources: offline sets, image-folder trees and archives, torchvision files, cache, errors."""

from __future__ import annotations

import io
import tarfile
import time
import urllib.error
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from incofl.data import sources
from incofl.data.sources import DATASETS, DataNotFoundError, load_dataset, resolve_data_dir

ARRAYS = ("x_train", "y_train", "x_test", "y_test")


def assert_same(a, b) -> None:
    for k in ARRAYS:
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k), err_msg=k)


def assert_well_formed(ds, channels: int, size: int) -> None:
    for x, y in ((ds.x_train, ds.y_train), (ds.x_test, ds.y_test)):
        assert x.dtype == np.uint8 and y.dtype == np.int64
        assert x.shape[1:] == (channels, size, size) and len(x) == len(y)


# --- offline data sets ---------------------------------------------------------------------


def test_digits_shapes_range_and_stratified_split():
    ds = load_dataset("digits", cache_dir=None)
    assert_well_formed(ds, 1, 32)
    assert (len(ds.x_train), len(ds.x_test)) == (1437, 360)
    assert ds.num_classes == 10 and set(ds.y_test) == set(range(10))
    assert ds.x_train.min() == 0 and ds.x_train.max() == 255
    train, test = np.bincount(ds.y_train), np.bincount(ds.y_test)
    np.testing.assert_allclose(test / (train + test), 0.2, atol=0.01)  # every class split 80/20
    # each test image is an 8x8 original upsampled bilinearly (numpy reference below), with its label
    from sklearn.datasets import load_digits

    d = load_digits()
    ref = bilinear_x4(d.images * 255 / 16)
    pool = lambda a: a.reshape(len(a), 8, 4, 8, 4).mean(axis=(2, 4)).reshape(len(a), 64)  # noqa: E731
    match = np.abs(pool(ds.x_test[:, 0].astype(float))[:, None] - pool(ref)[None]).sum(-1).argmin(1)
    assert np.abs(ds.x_test[:, 0] - ref[match]).max() <= 0.5 + 1e-6  # rounding only
    np.testing.assert_array_equal(d.target[match], ds.y_test)


def bilinear_x4(images: np.ndarray) -> np.ndarray:
    """(N, 8, 8) -> (N, 32, 32), bilinear with half-pixel centres (align_corners=False), edges clamped."""
    src = np.maximum((np.arange(32) + 0.5) / 4 - 0.5, 0)
    i0 = np.floor(src).astype(int)
    i1, w = np.minimum(i0 + 1, 7), src - i0
    rows = images[:, i0] * (1 - w)[:, None] + images[:, i1] * w[:, None]
    return rows[:, :, i0] * (1 - w) + rows[:, :, i1] * w


def test_digits_and_synthetic_are_deterministic(tmp_path):
    for name in ("digits", "synthetic"):
        assert_same(load_dataset(name, cache_dir=None), load_dataset(name, cache_dir=tmp_path / name))


def test_synthetic_shapes_classes_and_learnable():
    ds = load_dataset("synthetic", cache_dir=None)
    assert_well_formed(ds, 3, 32)
    assert (len(ds.x_train), len(ds.x_test)) == (2000, 500)
    assert np.all(np.bincount(ds.y_train) == 200) and np.all(np.bincount(ds.y_test) == 50)
    assert ds.x_train.std() > 30  # not constant images
    # nearest class mean on the training set classifies the test set: the classes are learnable
    x_tr, x_te = ds.x_train.reshape(2000, -1) / 255.0, ds.x_test.reshape(500, -1) / 255.0
    means = np.stack([x_tr[ds.y_train == c].mean(0) for c in range(10)])
    pred = ((x_te[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert (pred == ds.y_test).mean() > 0.9


# --- cache ------------------------------------------------------------------------------


def test_cache_is_written_once_then_read(tmp_path, monkeypatch):
    first = load_dataset("digits", cache_dir=tmp_path)
    with np.load(tmp_path / "digits.npz") as f:
        assert sorted(f.files) == sorted([*ARRAYS, "order", "sha256"])  # the arrays, their order and hash
    assert [p.name for p in tmp_path.iterdir()] == ["digits.npz"]  # no temporary left behind

    def boom():
        raise AssertionError("decoded again instead of reading the cache")

    monkeypatch.setattr(sources, "_digits", boom)
    assert_same(load_dataset("digits", cache_dir=tmp_path), first)


# --- image-folder trees and archives ----------------------------------------------------

CLASSES = ("zebra", "ant", "moth")  # made in unsorted order; labels must follow sorted order


def class_colour(cls: str) -> tuple[int, int, int]:
    return {"ant": (250, 0, 0), "moth": (0, 250, 0), "zebra": (0, 0, 250)}[cls]


def make_tree(root: Path, splits=("train", "test", "valid")) -> None:
    """Per class: 3 PNGs (solid class colour, a row index in pixel [0,0]) and 1 JPEG, per split."""
    for split in splits:
        for cls in CLASSES:
            (root / split / cls).mkdir(parents=True)
            for i in range(3):
                a = np.zeros((8, 8, 3), np.uint8) + np.array(class_colour(cls), np.uint8)
                a[0, 0] = (i, 100 if split == "train" else 200, 0)
                Image.fromarray(a).save(root / split / cls / f"{i:02d}.png")
            Image.fromarray(np.full((8, 8), 128, np.uint8)).save(root / split / cls / "99.jpg")  # grey JPEG
        (root / split / "notes.txt").write_text("not an image")


def make_tar(tree: Path, archive: Path, top: str | None) -> None:
    with tarfile.open(archive, "w:xz") as tar:
        for path in sorted(tree.rglob("*"), reverse=True):  # an order unlike the sorted one
            rel = path.relative_to(tree)
            tar.add(path, arcname=str(Path(top) / rel) if top else str(rel), recursive=False)


def test_image_folder_tree_labels_follow_sorted_class_names(tmp_path):
    make_tree(tmp_path / "cinic10")
    ds = load_dataset("cinic10", data_dir=tmp_path, cache_dir=None)
    assert_well_formed(ds, 3, 8)
    assert (len(ds.x_train), len(ds.x_test)) == (12, 12)  # valid/ is not used
    for x, y, marker in ((ds.x_train, ds.y_train, 100), (ds.x_test, ds.y_test, 200)):
        np.testing.assert_array_equal(y, np.repeat([0, 1, 2], 4))
        for label, cls in enumerate(sorted(CLASSES)):
            pngs, jpg = x[y == label][:3], x[y == label][3]  # sorted by file name: 00 01 02 .png, 99.jpg
            colour = np.array(class_colour(cls), np.uint8)[None, :, None, None]
            np.testing.assert_array_equal(pngs[:, :, 1:, 1:], np.broadcast_to(colour, (3, 3, 7, 7)))
            np.testing.assert_array_equal(pngs[:, :, 0, 0], [[i, marker, 0] for i in range(3)])
            assert np.all(np.abs(jpg.astype(int) - 128) <= 2)  # grey JPEG decoded to 3 equal channels


@pytest.mark.parametrize("top", [None, "cifar10-jpeg"])
def test_archive_gives_the_same_arrays_as_the_tree(tmp_path, top):
    make_tree(tmp_path / "trees" / "cifar10", splits=("train", "test"))
    (tmp_path / "archives").mkdir()
    make_tar(tmp_path / "trees" / "cifar10", tmp_path / "archives" / "cifar10-jpeg.tar.xz", top)
    from_tree = load_dataset("cifar10", data_dir=tmp_path / "trees", cache_dir=None)
    from_tar = load_dataset("cifar10", data_dir=tmp_path / "archives", cache_dir=None)
    assert_same(from_tree, from_tar)
    assert len(from_tar.x_train) == 12


def test_tree_with_a_test_class_missing_from_train_is_rejected(tmp_path):
    make_tree(tmp_path / "cifar10", splits=("train", "test"))
    (tmp_path / "cifar10" / "test" / "yak").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "cifar10" / "test" / "yak" / "0.png")
    with pytest.raises(ValueError, match="test"):
        load_dataset("cifar10", data_dir=tmp_path, cache_dir=None)


# --- real CIFAR-10 ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.xdist_group("cifar10")  # the tests that read CIFAR-10 on one worker: its cache_dir decodes it once
def test_real_cifar10(data_dir, cache_dir, monkeypatch):
    ds = load_dataset("cifar10", data_dir=data_dir, cache_dir=cache_dir, download=False)
    assert_well_formed(ds, 3, 32)
    assert (len(ds.x_train), len(ds.x_test)) == (50_000, 10_000)
    assert np.all(np.bincount(ds.y_train) == 5000) and np.all(np.bincount(ds.y_test) == 1000)
    # class 0 is airplane and class 9 truck: compare with those JPEGs read straight from the archive
    wanted = {"train/airplane/0000.jpg": ds.x_train[0], "train/truck/4999.jpg": ds.x_train[-1]}
    with tarfile.open(data_dir / "cifar10-jpeg.tar.xz", "r|*") as tar:
        for member in tar:
            if member.name in wanted:
                img = np.asarray(Image.open(io.BytesIO(tar.extractfile(member).read())).convert("RGB"))
                np.testing.assert_array_equal(wanted.pop(member.name), img.transpose(2, 0, 1))
                if not wanted:
                    break
    assert not wanted
    assert (ds.y_train[0], ds.y_train[-1]) == (0, 9)
    # a later load reads the cache (hash checked): no decoding, and fast (the session's cache may
    # already have held CIFAR-10 for the first load, when another test loaded it before)
    monkeypatch.setattr(sources, "_read_image_folder", lambda *a: pytest.fail("decoded twice"))
    start = time.perf_counter()
    again = load_dataset("cifar10", data_dir=data_dir, cache_dir=cache_dir, download=False)
    assert time.perf_counter() - start < 5.0
    assert_same(ds, again)


# --- torchvision formats ------------------------------------------------------------------


def write_idx(path: Path, a: np.ndarray) -> None:
    """The idx format (big-endian header: 0, 0, type 0x08 = uint8, ndim; then the dims)."""
    header = bytes([0, 0, 0x08, a.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in a.shape)
    path.write_bytes(header + a.astype(np.uint8).tobytes())


def test_fmnist_from_idx_files(tmp_path):
    rng = np.random.default_rng(1)
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    arrays = {}
    for prefix, n in (("train", 7), ("t10k", 5)):
        arrays[prefix] = rng.integers(0, 256, (n, 28, 28)), rng.integers(0, 10, n)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", arrays[prefix][0])
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", arrays[prefix][1])
    ds = load_dataset("fmnist", data_dir=tmp_path, cache_dir=None, download=False)
    assert_well_formed(ds, 1, 28)
    np.testing.assert_array_equal(ds.x_train[:, 0], arrays["train"][0])
    np.testing.assert_array_equal(ds.y_train, arrays["train"][1])
    np.testing.assert_array_equal(ds.x_test[:, 0], arrays["t10k"][0])
    np.testing.assert_array_equal(ds.y_test, arrays["t10k"][1])


# --- errors and the data directory --------------------------------------------------------


@pytest.mark.parametrize("name", ["cifar10", "cinic10", "fmnist", "svhn"])
def test_missing_data_is_a_one_line_error_naming_the_directory(tmp_path, name):
    with pytest.raises(DataNotFoundError) as info:
        load_dataset(name, data_dir=tmp_path, cache_dir=tmp_path / "cache", download=False)
    msg = str(info.value)
    assert "\n" not in msg and str(tmp_path) in msg and "INCOFL_DATA_DIR" in msg
    assert isinstance(info.value, FileNotFoundError)
    assert not (tmp_path / "cache").exists()  # nothing cached on failure


def test_failed_download_is_a_data_not_found_error(tmp_path, monkeypatch):
    import torchvision.datasets.cifar

    calls = []

    def offline(url, *args, **kwargs):
        calls.append(url)
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(torchvision.datasets.cifar, "download_and_extract_archive", offline)
    with pytest.raises(DataNotFoundError, match="download failed") as info:
        load_dataset("cifar10", data_dir=tmp_path, cache_dir=None, download=True)
    assert calls and "cifar-10-batches-py" in str(info.value) and "\n" not in str(info.value)


def test_unknown_dataset_name():
    with pytest.raises(ValueError, match="imagenet") as info:
        load_dataset("imagenet", cache_dir=None)
    assert all(name in str(info.value) for name in DATASETS)


def test_resolve_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("INCOFL_DATA_DIR", str(tmp_path / "env"))
    assert resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"
    assert resolve_data_dir(None) == tmp_path / "env"
    monkeypatch.delenv("INCOFL_DATA_DIR")
    assert resolve_data_dir(None) == Path("data")
