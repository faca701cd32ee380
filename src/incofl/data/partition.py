"""Client partitions (docs/workflow.md), saved as artifacts that training only reads."""

from __future__ import annotations

import hashlib
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from incofl.atomic import atomic_path
from incofl.config import Affects, run_settings
from incofl.data.release import ReleasePartitionError, read_release_partition, release_file
from incofl.streams import Stream, generator, seed_int

if TYPE_CHECKING:
    from incofl.config import RunConfig
    from incofl.data.dataset import ImageDataset


class PartitionError(RuntimeError):
    """No valid partition could be drawn within the retry budget."""


def iid_partition(num_samples: int, num_clients: int, seed: int) -> list[np.ndarray]:
    """A random permutation cut into `num_clients` near-equal parts."""
    perm = generator(seed, Stream.PARTITION).permutation(num_samples)
    return [part.astype(np.int64) for part in np.array_split(perm, num_clients)]


def iid_draw_partition(num_samples: int, num_clients: int, client_samples: int, seed: int) -> list[np.ndarray]:
    """Each client draws `client_samples` distinct images independently of the others, so two
    clients may hold the same image (FedPart's release, Fling's `iid` sampling)."""
    if client_samples > num_samples:
        raise PartitionError(f"client_samples: {client_samples} exceeds the {num_samples} training images")
    rng = generator(seed, Stream.PARTITION)
    draws = (rng.choice(num_samples, client_samples, replace=False) for _ in range(num_clients))
    return [np.sort(draw).astype(np.int64) for draw in draws]


def dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    seed: int,
    min_size: int = 10,
    *,
    balance: bool = True,
    max_retries: int = 1000,
) -> list[np.ndarray]:
    """NIID-Bench label skew: per class, proportions ~ Dir(alpha * 1_K), redrawn until every
    client holds >= min_size samples. With `balance`, clients already holding >= N/K samples
    get no more. The class count comes from the labels."""
    labels = np.asarray(labels)
    rng = generator(seed, Stream.PARTITION)
    n, cap = len(labels), len(labels) / num_clients
    by_class = [np.flatnonzero(labels == k) for k in range(int(labels.max()) + 1)]
    for _ in range(max_retries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients, dtype=np.int64)
        for idx in by_class:
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(num_clients, alpha))
            if balance:
                p = p * (sizes < cap)
            cuts = (np.cumsum(p / p.sum()) * len(idx)).astype(np.int64)[:-1]
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].append(chunk)
                sizes[client] += len(chunk)
        if sizes.min() >= min_size:
            return [rng.permutation(np.concatenate(p)).astype(np.int64) for p in parts]
    raise PartitionError(
        f"dirichlet partition: no draw gave every one of {num_clients} clients >= {min_size} samples "
        f"in {max_retries} tries (alpha={alpha}, {n} samples); lower min_size or clients, or raise alpha"
    )


def shard_partition(labels: np.ndarray, num_clients: int, shard_classes: int, seed: int) -> list[np.ndarray]:
    """HeteroFL's label shards (its release's `non_iid`): each class's samples, in data set order,
    are cut into S = shard_classes * clients / classes contiguous shards (its last n mod S samples
    go one each to the first shards); the S copies of every class label are shuffled and dealt
    `shard_classes` to a client, and a client gets one random remaining shard of each distinct
    class dealt to it. As in the release (whose reported accuracies come from this split), a class
    dealt to a client twice gives it one shard only: the client holds fewer classes and the shard
    left over goes to nobody. The class count comes from the labels."""
    labels = np.asarray(labels)
    num_classes = int(labels.max()) + 1
    if shard_classes > num_classes:
        raise PartitionError(f"shard_classes: {shard_classes} exceeds the {num_classes} classes in the labels")
    if shard_classes * num_clients % num_classes:
        raise PartitionError(
            f"shard_classes: {shard_classes} x {num_clients} clients = {shard_classes * num_clients} shards is not "
            f"a multiple of the {num_classes} classes, so the classes cannot be cut into equally many shards"
        )
    per_class = shard_classes * num_clients // num_classes
    counts = np.bincount(labels, minlength=num_classes)
    if counts.min() < per_class:
        k = int(counts.argmin())
        raise PartitionError(
            f"shard_classes: class {k} has {counts[k]} samples, fewer than the {per_class} shards each class is "
            f"cut into (shard_classes x clients / classes); lower shard_classes or clients"
        )
    shards = []
    for k in range(num_classes):
        idx = np.flatnonzero(labels == k)
        cut = len(idx) // per_class * per_class
        rest = idx[cut:]
        shards.append([np.append(row, rest[j : j + 1]) for j, row in enumerate(np.split(idx[:cut], per_class))])
    rng = generator(seed, Stream.PARTITION)
    dealt = rng.permutation(np.repeat(np.arange(num_classes), per_class)).reshape(num_clients, shard_classes)
    parts = []
    for classes in dealt:
        held = [shards[k].pop(int(rng.integers(len(shards[k])))) for k in np.unique(classes)]
        parts.append(np.concatenate(held).astype(np.int64))
    return parts


def holdout_split(
    parts: list[np.ndarray], labels: np.ndarray, share: float, seed: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each client's indices split into (train, held out): `hold_out` of each."""
    split = [hold_out(idx, labels, share, seed, client) for client, idx in enumerate(parts)]
    return [train for train, _ in split], [held for _, held in split]


def hold_out(
    idx: np.ndarray, labels: np.ndarray, share: float, seed: int, client: int
) -> tuple[np.ndarray, np.ndarray]:
    """Client `client`'s indices split into (train, held out) with `share` held out, stratified by
    label where every class of the client has two samples or more (else a plain random split);
    a client with fewer than two samples holds nothing out. Seeded per client by `seed`."""
    from sklearn.model_selection import train_test_split

    if len(idx) < 2:
        return idx, idx[:0]
    state = seed_int(seed, Stream.HOLDOUT, client)
    try:
        a, b = train_test_split(idx, test_size=share, random_state=state, stratify=labels[idx])
    except ValueError:  # a class with one sample, or fewer held-out slots than classes
        a, b = train_test_split(idx, test_size=share, random_state=state)
    return np.sort(a), np.sort(b)


def class_histogram(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """(clients, classes) sample counts."""
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])


@dataclass(frozen=True)
class Partition:
    """Client index arrays into the training set, with how they were made."""

    parts: list[np.ndarray]
    histogram: np.ndarray
    meta: dict[str, str | float | int]

    def save(self, path: str | os.PathLike) -> None:
        offsets = np.cumsum([0] + [len(p) for p in self.parts])
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as fh:
                np.savez(
                    fh,
                    indices=np.concatenate(self.parts),
                    offsets=offsets,
                    histogram=self.histogram,
                    **{f"meta_{k}": np.asarray(v) for k, v in self.meta.items()},
                )

    @classmethod
    def load(cls, path: str | os.PathLike) -> Partition:
        try:
            with np.load(Path(path)) as z:
                idx, off = z["indices"], z["offsets"]
                meta = {k[5:]: z[k].item() for k in z.files if k.startswith("meta_")}
                return cls([idx[a:b] for a, b in zip(off[:-1], off[1:], strict=True)], z["histogram"], meta)
        except FileNotFoundError:
            raise PartitionError(f"{path}: partition file not found") from None
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
            raise PartitionError(f"{path}: not a partition artifact ({type(err).__name__}); make it again") from None


def make_partition(
    labels: np.ndarray,
    *,
    kind: str,
    num_clients: int,
    alpha: float,
    seed: int,
    min_size: int = 10,
    max_retries: int = 1000,
    dataset: str = "",
    draw_labels: np.ndarray | None = None,
    client_samples: int | None = None,
    shard_classes: int = 2,
) -> Partition:
    """The partition a config asks for, with its class histogram. `draw_labels`: draw the
    Dirichlet or shard split over another data set's labels (the release's FMNIST reads CIFAR-10's)."""
    draw = labels if draw_labels is None else draw_labels
    if kind == "iid":
        parts = iid_partition(len(labels), num_clients, seed)
    elif kind == "iid_draw":
        parts = iid_draw_partition(len(labels), num_clients, client_samples or 0, seed)
    elif kind == "shards":
        parts = shard_partition(draw, num_clients, shard_classes, seed)
    else:
        parts = dirichlet_partition(draw, num_clients, alpha, seed, min_size, max_retries=max_retries)
    meta = {
        "kind": kind,
        "alpha": alpha,
        "seed": seed,
        "clients": num_clients,
        "dataset": dataset,
        "min_size": min_size,
        "labels_sha256": labels_hash(labels),
    }
    if kind == "iid_draw":
        meta["client_samples"] = client_samples or 0
    if kind == "shards":
        meta["shard_classes"] = shard_classes
    return Partition(parts, class_histogram(labels, parts, int(labels.max()) + 1), meta)


def labels_hash(labels: np.ndarray) -> str:
    """What a partition indexes: the training labels, in order."""
    return hashlib.sha256(np.ascontiguousarray(labels, dtype=np.int64).tobytes()).hexdigest()


# The names an artifact's meta records partition settings under, where not their own.
META_NAMES = {"partition": "kind", "partition_seed": "seed"}
# Partition settings a kind is drawn without, though its artifact records them (alpha).
UNUSED = {"iid": {"alpha"}, "iid_draw": {"alpha"}, "shards": {"alpha"}}


def _differs(key: str, made: object, ours: object) -> str:
    if key == "labels_sha256":
        return "made for other training labels than this run's data"
    name = {meta: setting for setting, meta in META_NAMES.items()}.get(key, key)
    return f"made for {name}={made!r}, this run has {name}={ours!r}"


def check_provenance(part: Partition, cfg: RunConfig, labels: np.ndarray, path: str) -> Partition:
    """Refuse a partition artifact made for another run: its training labels, or any setting the
    partition depends on (config.Affects.PARTITION) that the artifact records (make_partition
    records each where its kind uses it)."""
    settings = sorted(run_settings(Affects.PARTITION) - UNUSED.get(cfg.partition, set()))
    want = {META_NAMES.get(key, key): getattr(cfg, key) for key in settings}
    want["labels_sha256"] = labels_hash(labels)
    for key, value in want.items():
        if key in part.meta and part.meta[key] != value:
            raise PartitionError(f"{path}: {_differs(key, part.meta[key], value)}; delete it to make it again")
    if len(part.parts) != cfg.clients:
        raise PartitionError(f"{path}: holds {len(part.parts)} clients, this run has clients={cfg.clients}")
    return part


def partition_for(cfg: RunConfig, data: ImageDataset) -> Partition:
    """The config's partition artifact if given, else the partition it describes: drawn here,
    or read from the release's files (`partition: release`), which index the training set in
    its published order (torchvision's), not the class-sorted order of an image folder."""
    labels = data.y_train
    if cfg.partition_file:
        return check_provenance(Partition.load(cfg.partition_file), cfg, labels, cfg.partition_file)
    if cfg.partition == "release":
        path = release_file(cfg.release_partitions or "", cfg.dataset, cfg.clients, cfg.alpha)
        if data.order != "original":
            raise ReleasePartitionError(
                f"partition: release indexes {cfg.dataset} in its published order; these images are in "
                f"{data.order} order (an image folder, or a cache from before this check: delete it to rebuild)"
            )
        parts = read_release_partition(path, len(labels))
        if len(parts) != cfg.clients:
            raise ReleasePartitionError(f"{path}: {len(parts)} clients, config has clients={cfg.clients}")
        meta = {"kind": "release", "file": path.name, "alpha": cfg.alpha, "clients": cfg.clients}
        meta |= {"dataset": cfg.dataset, "labels_sha256": labels_hash(labels)}
        return Partition(parts, class_histogram(labels, parts, int(labels.max()) + 1), meta)
    draw_labels = None
    if cfg.dataset == "fmnist" and cfg.fmnist_partition == "cifar":
        from incofl.data.sources import load_dataset

        cifar = load_dataset("cifar10", cfg.data_dir, cfg.cache_dir)
        draw_labels = (cifar.pooled() if cfg.pool_test else cifar).y_train  # pool_test: CIFAR-10's 60,000
    part = make_partition(
        labels,
        kind=cfg.partition,
        num_clients=cfg.clients,
        alpha=cfg.alpha,
        seed=cfg.partition_seed,
        min_size=cfg.min_size,
        max_retries=cfg.max_retries,
        dataset=cfg.dataset,
        draw_labels=draw_labels,
        client_samples=cfg.client_samples,
        shard_classes=cfg.shard_classes,
    )
    if cfg.dataset == "fmnist":
        part.meta["fmnist_partition"] = cfg.fmnist_partition
    return part
