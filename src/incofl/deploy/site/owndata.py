"""A site's own data (a node config's `data-folder` or `data-npz`), served in place of a share
an operator exported (sitedata.py):

- `data-folder`: an image folder laid out by class, `<folder>/<class index>/<image>.png|.jpg|.jpeg`
  (torchvision's ImageFolder convention, each class folder named by the class's index in the run's
  data set); grey images (mode L) for a one-channel data set, RGB for a three-channel one;
- `data-npz`: an .npz of `x`, uint8 images N x C x H x W or N x H x W x C, and `y`, their integer labels.

Samples are trained in the order they are read: an .npz's order, a folder's by file name (across
its class folders), so a site fixes its order by naming its files. The data must fit the run, as
its schedule tells the data set (wire/schedule.py: the class count, an image's shape): anything else is
refused in one line naming the file before any round (a folder's image by its path in the folder:
`3/00042.png: image file is truncated`). The site normalises with the schedule's
normalisation (the data set's, which no site can compute from its share), and holds no test split.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from incofl.config import ConfigError
from incofl.data.dataset import ShareDataset
from incofl.data.facts import Facts
from incofl.deploy import DATA_FOLDER, DATA_NPZ

OWN = (DATA_FOLDER, DATA_NPZ)  # the node config's keys of a site's own data
EXTENSIONS = (".png", ".jpg", ".jpeg")
MODES = {1: "L", 3: "RGB"}  # PIL's mode of an image with that many channels


def read_image(path: Path, folder: Path) -> np.ndarray:
    """One image of a site's folder; a ValueError names it by its path in the folder and says why it
    cannot be read (cut short, no image, another mode: whatever PIL raises)."""
    from PIL import Image, UnidentifiedImageError

    name = path.relative_to(folder).as_posix()[:80]
    try:
        with Image.open(path) as image:
            if image.mode not in MODES.values():
                raise ValueError(f"mode {image.mode}, not grey (L) or RGB")
            return np.asarray(image)  # decoded here: a file cut short raises now
    except UnidentifiedImageError:  # its text holds the absolute path
        raise ValueError(f"{name}: not an image PIL reads") from None
    except Exception as err:  # noqa: BLE001 (PIL raises OSError, SyntaxError, ValueError, zlib.error ...)
        why = (str(err).replace(str(path), name).strip().splitlines() or [type(err).__name__])[0][:120]
        raise ValueError(f"{name}: {why}") from None


def read_folder(folder: Path, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, H, W[, C]) and labels of an image folder by class index (module docstring)."""
    from torchvision.datasets import DatasetFolder

    found = DatasetFolder(str(folder), loader=str, extensions=EXTENSIONS, allow_empty=True)  # ImageFolder's layout
    names = {str(c) for c in range(classes)}
    if stray := sorted(set(found.classes) - names):
        raise ValueError(f"class folder {stray[0][:20]!r} is not a class index 0..{classes - 1}")
    samples = sorted(found.samples, key=lambda s: (Path(s[0]).name, s[0]))  # by file name: the site's order
    images = [read_image(Path(path), folder) for path, _ in samples]
    if not images or len({i.shape for i in images}) != 1:
        raise ValueError("no image, or images of different sizes or modes")
    labels = [int(found.classes[index]) for _, index in samples]
    return np.stack(images), np.array(labels, dtype=np.int64)


def read_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path, allow_pickle=False) as f:
        if not {"x", "y"} <= set(f.files):
            raise ValueError("no arrays x (images) and y (labels)")
        return f["x"], f["y"]


def fitted(x: np.ndarray, y: np.ndarray, data: Facts) -> tuple[np.ndarray, np.ndarray]:
    """`x` as uint8 (N, C, H, W) of the data set's image shape and `y` as int64, if they fit `data`;
    a ValueError says what does not."""
    channels, height, width = data.shape
    if x.ndim == 3 and channels == 1:  # grey images without a channel axis (a folder's, or an .npz's)
        x = x[:, None]
    elif x.ndim == 4 and x.shape[1:] == (height, width, channels):
        x = x.transpose(0, 3, 1, 2)
    data.check(x, y)
    if not len(x):
        raise ValueError("no image")
    # a fresh C-order copy: a transposed one-channel array passes as contiguous with a channel stride of 1,
    # which torch takes for channels_last (and convolves with other kernels: other bits than the simulator's)
    return x.copy(order="C"), y.astype(np.int64)


def load_own(key: str, path: str, dataset: str, data: Facts | None) -> ShareDataset:
    """A site's own data under `key` (module docstring) as a share of a run on `dataset`, checked
    against the data set's facts its schedule told (`data`); refused in one line naming `key` and
    `path` otherwise. Every image of it is its client's."""
    if data is None:
        raise ConfigError(f"{key} {path}: the run's schedule tells no data set to check it against (an older server?)")
    try:
        raw = read_folder(Path(path), data.classes) if key == DATA_FOLDER else read_npz(Path(path))
        x, y = fitted(*raw, data)
    except (OSError, ValueError) as err:  # a bad zip or image too
        why = str(err).splitlines()[0][:160] if isinstance(err, ValueError) else type(err).__name__
        raise ConfigError(f"{key} {path}: not data of this run ({why})") from None
    mean, std = data.normalisation()
    return ShareDataset(dataset, x, y, x[:0], y[:0], "unknown", data.classes, mean, std)
