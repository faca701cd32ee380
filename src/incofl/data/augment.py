"""Training augmentation on normalised image tensors: no PIL, no DataLoader workers.

`augment: auto` is ours (random crop with 4-pixel padding and flip for natural images, crop for
SVHN); `augment: release` is the InCo release's per data set (docs/methods.md, "Fidelity"):
CIFAR-10 crop + flip + Cutout(16), SVHN Cutout(16) only, CINIC-10 crop + flip, FMNIST none,
and on ViTs RandomResizedCrop to 224 + flip (FMNIST none). Every draw comes from the client's
generator, so a seed fixes the augmentation too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torchvision.transforms.v2.functional import resized_crop

from incofl.data.dataset import ImageDataset
from incofl.data.tensors import TensorSplit, normalisation
from incofl.models.names import VITS

PAD = 4  # random crop: pixels of padding on each side


@dataclass(frozen=True)
class Augmentation:
    """What a training batch gets, in this order: padded crop, resized crop, flip, cutout.
    `black_pad`: crop padding is black in pixel space (the release's PIL pad); else it is the
    mean colour (zero after normalisation)."""

    crop: bool = False
    flip: bool = False
    resized_crop: int = 0  # RandomResizedCrop to this side (scale 0.08-1, ratio 3/4-4/3); 0: off
    cutout: int = 0  # side of a zeroed square (DeVries & Taylor 2017) centred anywhere; 0: off
    black_pad: bool = False

    @property
    def active(self) -> bool:
        return self.crop or self.flip or self.resized_crop > 0 or self.cutout > 0

    def __call__(self, x: torch.Tensor, gen: torch.Generator, fill: torch.Tensor) -> torch.Tensor:
        """A training batch augmented (a TensorSplit's `augmenter`): `augment`."""
        return augment(x, self, gen, fill)


_CROP_FLIP = Augmentation(crop=True, flip=True)
OURS = {"cifar10": _CROP_FLIP, "cinic10": _CROP_FLIP, "svhn": Augmentation(crop=True)}
RELEASE = {
    "cifar10": Augmentation(crop=True, flip=True, cutout=16),
    "cinic10": _CROP_FLIP,
    "svhn": Augmentation(cutout=16),
}
RELEASE_VIT = {name: Augmentation(resized_crop=224, flip=True) for name in ("cifar10", "cinic10", "svhn")}
MODES = {"none": Augmentation(), "crop": Augmentation(crop=True), "crop_flip": _CROP_FLIP}


def resolve_augment(
    mode: str, dataset: str, *, model: str = "", cutout: int | None = None, pad_fill: str = "mean"
) -> Augmentation:
    """The augmentation a config asks for, for its (first) model; `cutout` (if set) replaces the
    mode's square size. The release trains ViTs on 224-pixel random resized crops."""
    if mode == "auto":
        aug = OURS.get(dataset, Augmentation())
    elif mode == "release":
        aug = (RELEASE_VIT if model in VITS else RELEASE).get(dataset, Augmentation())
    else:
        aug = MODES[mode]
    if cutout is not None:
        aug = replace(aug, cutout=cutout)
    return replace(aug, black_pad=pad_fill == "black")


def random_crop(x: torch.Tensor, gen: torch.Generator, fill: torch.Tensor | None = None) -> torch.Tensor:
    """Per-sample random crop of a padded batch back to its size; padding is `fill` per channel
    (shape (1, C, 1, 1)) or zero."""
    n, c, h, w = x.shape
    padded = F.pad(x, (PAD,) * 4) if fill is None else F.pad(x - fill, (PAD,) * 4) + fill
    dy = torch.randint(0, 2 * PAD + 1, (n,), generator=gen).to(x.device)
    dx = torch.randint(0, 2 * PAD + 1, (n,), generator=gen).to(x.device)
    rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
    cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
    batch = torch.arange(n, device=x.device)[:, None, None, None]
    chan = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[batch, chan, rows, cols]


def random_flip(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    flip = (torch.rand(x.shape[0], generator=gen) < 0.5).to(x.device)[:, None, None, None]
    return torch.where(flip, x.flip(3), x)


def cutout(x: torch.Tensor, size: int, gen: torch.Generator) -> torch.Tensor:
    """Zero a size x size square per sample, centred on a uniform pixel and clipped at the
    border (as the release's Cutout: the square can be partly outside the image)."""
    n, _, h, w = x.shape
    cy = torch.randint(0, h, (n, 1), generator=gen)
    cx = torch.randint(0, w, (n, 1), generator=gen)
    rows, cols = torch.arange(h)[None, :], torch.arange(w)[None, :]
    inside_y = (rows >= cy - size // 2) & (rows < cy + size // 2)
    inside_x = (cols >= cx - size // 2) & (cols < cx + size // 2)
    mask = ~(inside_y[:, :, None] & inside_x[:, None, :])
    return x * mask[:, None].to(device=x.device, dtype=x.dtype)


def _resized_crop_box(h: int, w: int, gen: torch.Generator) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params (scale 0.08-1, ratio 3/4-4/3), drawn from `gen`."""
    area, log_ratio = h * w, (math.log(3 / 4), math.log(4 / 3))
    for _ in range(10):
        target = area * (0.08 + 0.92 * torch.rand(1, generator=gen).item())
        ratio = math.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * torch.rand(1, generator=gen).item())
        cw, ch = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < cw <= w and 0 < ch <= h:
            top = int(torch.randint(0, h - ch + 1, (1,), generator=gen))
            left = int(torch.randint(0, w - cw + 1, (1,), generator=gen))
            return top, left, ch, cw
    side = min(h, w)  # fallback: the central square (the ratio is clamped to 1 for square images)
    return (h - side) // 2, (w - side) // 2, side, side


def random_resized_crop(x: torch.Tensor, size: int, gen: torch.Generator) -> torch.Tensor:
    crops = [resized_crop(img, *_resized_crop_box(*img.shape[-2:], gen), [size, size], antialias=True) for img in x]
    return torch.stack(crops)


def augment(x: torch.Tensor, aug: Augmentation, gen: torch.Generator, fill: torch.Tensor | None = None) -> torch.Tensor:
    """`fill`: the pixel-space black in normalised units, for `black_pad`."""
    if aug.crop:
        x = random_crop(x, gen, fill if aug.black_pad else None)
    if aug.resized_crop:
        x = random_resized_crop(x, aug.resized_crop, gen)
    if aug.flip:
        x = random_flip(x, gen)
    if aug.cutout:
        x = cutout(x, aug.cutout, gen)
    return x


def to_device(
    data: ImageDataset,
    device: torch.device,
    input_size: int,
    augmentation: Augmentation | None = None,
    normalize: str = "stats",
) -> tuple[TensorSplit, TensorSplit]:
    """Train split (augmented) and test split, both normalised alike: a client side's data."""
    mean, std = normalisation(data, normalize)
    augmenter = augmentation if augmentation is not None and augmentation.active else None
    train = TensorSplit(data.x_train, data.y_train, mean, std, device, input_size, augmenter)
    test = TensorSplit(data.x_test, data.y_test, mean, std, device, input_size)
    return train, test
