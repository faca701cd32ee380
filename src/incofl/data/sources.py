"""Data sources: load a named data set as uint8 NCHW arrays, decoding it once into an .npz cache.

Real data is looked for in a data directory (argument, else $INCOFL_DATA_DIR, else ./data):
an image-folder tree or an archive of one (CIFAR-10 as JPEGs, CINIC-10), or torchvision's own
files (CIFAR-10 batches, FashionMNIST, SVHN), downloaded by torchvision when allowed.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from incofl.atomic import atomic_path, remove_stale_temporaries
from incofl.config import DATASETS
from incofl.data.dataset import ImageDataset
from incofl.streams import DIGITS_SPLIT_SEED, SYNTHETIC_SEED, fixed_generator

if TYPE_CHECKING:
    from incofl.config import RunConfig

ENV_DATA_DIR = "INCOFL_DATA_DIR"
log = logging.getLogger(__name__)
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
_ARCHIVE_SUFFIXES = (".tar.xz", ".tar.gz", ".tgz", ".tar")
# Names an image-folder tree (or, with an archive suffix, an archive of one) may have.
_FOLDER_STEMS = {"cifar10": ("cifar10", "cifar10-jpeg"), "cinic10": ("cinic10", "CINIC-10")}

Arrays = tuple[np.ndarray, np.ndarray]  # (uint8 NCHW images, int64 labels)


class DataNotFoundError(FileNotFoundError):
    """A data set is neither on disk nor downloadable; the message says where it looked."""


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path:
    """The data directory: the argument, else $INCOFL_DATA_DIR, else ./data."""
    return Path(data_dir or os.environ.get(ENV_DATA_DIR) or "data").expanduser()


def load_dataset(
    name: str,
    data_dir: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = "resources/data",
    download: bool = True,
) -> ImageDataset:
    """Load `name` from `cache_dir/<name>.npz`, building that cache on first use (None: no cache)."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    cache = Path(cache_dir) / f"{name}.npz" if cache_dir is not None else None
    if cache is not None and cache.exists():
        cached = _read_cache(cache, name)
        if cached is not None:
            return cached
    if name == "digits":
        ds = _digits()
    elif name == "synthetic":
        ds = _synthetic()
    else:
        ds = _from_disk(name, resolve_data_dir(data_dir), download)
    if cache is not None:
        remove_stale_temporaries(cache.parent)
        arrays = {k: getattr(ds, k) for k in ARRAYS}
        with atomic_path(cache) as tmp, open(tmp, "wb") as f:  # a file object: savez adds no suffix
            np.savez(f, **arrays, order=ds.order, sha256=content_hash(arrays))
    return ds


ARRAYS = ("x_train", "y_train", "x_test", "y_test")


def dataset_for(cfg: RunConfig) -> ImageDataset:
    """A run's data: its data set, with train and test pooled into one training set (and no
    test set) under `pool_test`. Training and `incofl partition` both read it, so a partition
    artifact indexes the images the run trains on (its labels' hash says which)."""
    data = load_dataset(cfg.dataset, cfg.data_dir, cfg.cache_dir)
    return data.pooled() if cfg.pool_test else data


def content_hash(arrays: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for key in ARRAYS:
        digest.update(key.encode() + str(arrays[key].shape).encode() + np.ascontiguousarray(arrays[key]).tobytes())
    return digest.hexdigest()


def _read_cache(path: Path, name: str) -> ImageDataset | None:
    """The cached data set, or None (with a warning) if the file is truncated or its content
    does not match the hash it was written with: the caller then decodes the source again."""
    try:
        with np.load(path) as f:
            arrays = {k: f[k] for k in ARRAYS}
            order = str(f["order"]) if "order" in f.files else "unknown"
            expected = str(f["sha256"]) if "sha256" in f.files else None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        log.warning("%s: unreadable data cache (%s); decoding %s again", path, type(err).__name__, name)
        return None
    if expected is not None and content_hash(arrays) != expected:
        log.warning("%s: data cache does not match its hash; decoding %s again", path, name)
        return None
    return ImageDataset(name, arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"], order)


# --- offline data sets -------------------------------------------------------------------


def _upsample(x: np.ndarray, size: int) -> np.ndarray:
    """Bilinear resize of float NCHW images in [0, 255] to size x size, rounded to uint8."""
    y = F.interpolate(torch.from_numpy(x).float(), size=(size, size), mode="bilinear", align_corners=False)
    return y.round().clamp(0, 255).to(torch.uint8).numpy()


def _digits() -> ImageDataset:
    """scikit-learn's 8x8 digits (values 0..16) as 1x32x32 uint8, stratified 80/20 split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = _upsample(d.images[:, None] * (255.0 / 16.0), 32)
    y = d.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, stratify=y, random_state=DIGITS_SPLIT_SEED)
    return ImageDataset("digits", x_tr, y_tr, x_te, y_te)


def _synthetic(classes: int = 10, n_train: int = 2000, n_test: int = 500, seed: int = SYNTHETIC_SEED) -> ImageDataset:
    """Each class a fixed smooth random 3x32x32 template; images are template plus Gaussian noise."""
    rng = fixed_generator(seed)
    templates = _upsample(rng.uniform(0, 255, (classes, 3, 8, 8)), 32).astype(np.float64)

    def sample(n: int) -> Arrays:
        y = rng.permutation(np.arange(n) % classes).astype(np.int64)
        x = templates[y] + rng.normal(0.0, 48.0, (n, 3, 32, 32))
        return np.clip(np.rint(x), 0, 255).astype(np.uint8), y

    return ImageDataset("synthetic", *sample(n_train), *sample(n_test))


# --- data on disk ----------------------------------------------------------------------


def _from_disk(name: str, root: Path, download: bool) -> ImageDataset:
    """An image-folder tree or archive if one is in `root`, else torchvision's files/download."""
    candidates = [root / stem for stem in _FOLDER_STEMS.get(name, ())]
    candidates += [root / f"{stem}{suf}" for stem in _FOLDER_STEMS.get(name, ()) for suf in _ARCHIVE_SUFFIXES]
    for path in candidates:
        if path.exists():
            return _read_image_folder(name, path, ("train", "test"))
    if name in _TORCHVISION:
        return _from_torchvision(name, root, download, candidates)
    raise DataNotFoundError(_not_found(name, root, candidates))


def _not_found(name: str, root: Path, tried: list[Path]) -> str:
    """One line: where we looked and how to get the data."""
    return (
        f"{name} not found in {root} (tried: {', '.join(map(str, tried))}); put one of these there, "
        f"let torchvision download it (download=True, needs internet), "
        f"or set {ENV_DATA_DIR} to the folder that holds the data"
    )


# Image-folder trees: <split>/<class>/<image>, below any top-level folder.


def _split_class(parts: tuple[str, ...], splits: tuple[str, ...]) -> tuple[str, str] | None:
    """(split, class) for an image path ending in <split>/<class>/<file>, else None."""
    if len(parts) >= 3 and parts[-3] in splits and parts[-1].lower().endswith(_IMAGE_SUFFIXES):
        return parts[-3], parts[-2]
    return None


def _image_files(source: Path, splits: tuple[str, ...]) -> Iterator[tuple[str, str, str, bytes]]:
    """(split, class, file name, bytes) for each image in a folder tree or, in one pass, a tar."""
    if source.is_dir():
        for path in source.rglob("*"):
            key = _split_class(path.relative_to(source).parts, splits)
            if key and path.is_file():
                yield *key, path.name, path.read_bytes()
        return
    with tarfile.open(source, "r|*") as tar:  # streaming: one sequential read of the archive
        for member in tar:
            key = _split_class(Path(member.name).parts, splits)
            if key and member.isfile():
                yield *key, Path(member.name).name, tar.extractfile(member).read()


def _decode(blob: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(blob)) as im:
        return np.asarray(im.convert("RGB"))


def _read_image_folder(name: str, source: Path, splits: tuple[str, str]) -> ImageDataset:
    """Decode `splits` (train, test) of an image-folder tree; labels = sorted class-folder order."""
    files = sorted(_image_files(source, splits))  # by split, class, file name: order-independent
    classes = sorted({c for s, c, _, _ in files if s == splits[0]})
    index = {c: i for i, c in enumerate(classes)}
    out: list[np.ndarray] = []
    for split in splits:
        part = [(c, blob) for s, c, _, blob in files if s == split]
        if not part or any(c not in index for c, _ in part):
            raise ValueError(f"{source}: split {split!r} is empty or has classes not in {splits[0]!r}")
        out.append(np.ascontiguousarray(np.stack([_decode(b) for _, b in part]).transpose(0, 3, 1, 2)))
        out.append(np.array([index[c] for c, _ in part], dtype=np.int64))
    return ImageDataset(name, *out, order="folder")


# torchvision data sets: (loader(root, train, download) -> arrays, what it looks for in root).


def _tv_cifar10(root: Path, train: bool, download: bool) -> Arrays:
    from torchvision.datasets import CIFAR10

    ds = CIFAR10(root, train=train, download=download)
    return np.ascontiguousarray(ds.data.transpose(0, 3, 1, 2)), np.asarray(ds.targets, dtype=np.int64)


def _tv_fmnist(root: Path, train: bool, download: bool) -> Arrays:
    from torchvision.datasets import FashionMNIST

    ds = FashionMNIST(root, train=train, download=download)
    return ds.data.numpy()[:, None], ds.targets.numpy().astype(np.int64)


def _tv_svhn(root: Path, train: bool, download: bool) -> Arrays:
    from torchvision.datasets import SVHN

    ds = SVHN(root, split="train" if train else "test", download=download)
    return np.ascontiguousarray(ds.data), ds.labels.astype(np.int64)  # label 10 is already 0


_TORCHVISION: dict[str, tuple[Callable[[Path, bool, bool], Arrays], str]] = {
    "cifar10": (_tv_cifar10, "cifar-10-batches-py"),
    "fmnist": (_tv_fmnist, "FashionMNIST/raw"),
    "svhn": (_tv_svhn, "{train,test}_32x32.mat"),
}


def _from_torchvision(name: str, root: Path, download: bool, tried: list[Path]) -> ImageDataset:
    """torchvision's files if present, else its download when allowed, else DataNotFoundError."""
    loader, looks_for = _TORCHVISION[name]
    tried = [*tried, root / looks_for]
    try:
        return ImageDataset(name, *loader(root, True, False), *loader(root, False, False))
    except RuntimeError:  # torchvision: "Dataset not found"
        if not download:
            raise DataNotFoundError(_not_found(name, root, tried)) from None
    try:
        return ImageDataset(name, *loader(root, True, True), *loader(root, False, True))
    except Exception as err:  # no network, bad checksum, ...: say what to do instead
        reason = f"download failed ({type(err).__name__}); "
        raise DataNotFoundError(reason + _not_found(name, root, tried)) from err
