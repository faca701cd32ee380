"""One site's data in a real federation: a client's own training samples and nothing of the
other clients', exported once from the run's partition (`incofl federation export`) and read by
that client's node.

The file holds the client's images in the order of their index in the training set, the
positions of its partition entry among them (so local training draws the simulator's batches,
and `holdout` holds out the same samples), the data set's class count and normalisation (the
whole training set's, which a node cannot compute from its share) and the settings its
partition was drawn with: a node refuses a run whose config would partition otherwise. With
`test`, it also holds the data set's test split, on which the node of a client that keeps
entries of its model scores that model when the run's evaluation asks (each model group's first
client's, as the simulator reports it); the server checks its digest (exported.test_sha256) against its own.
It carries the server's public key too (`server_key`, OpenSSH): the node acts only on
instructions signed with it (wire/signing.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from incofl.atomic import atomic_path
from incofl.config import ConfigError, RunConfig
from incofl.data.dataset import ImageDataset, ShareDataset
from incofl.data.partition import Partition
from incofl.data.tensors import normalisation
from incofl.deploy.wire.exported import check_digest, partition_settings


def export_client(
    cfg: RunConfig,
    data: ImageDataset,
    partition: Partition,
    client: int,
    out: str | Path,
    test: bool = False,
    server_key: bytes = b"",
) -> int:
    """Write `client`'s share of `data` to `out` (.npz, atomically), with `test` the test split
    too, and the server's public key (module docstring); returns its sample count."""
    if not 0 <= client < cfg.clients:
        raise ConfigError(f"--client {client}: the config has clients 0..{cfg.clients - 1}")
    part = partition.parts[client]
    order = np.sort(part)
    mean, std = normalisation(data, cfg.normalize)
    with atomic_path(out, mode=0o600) as tmp, open(tmp, "wb") as fh:  # a site's samples: its owner's only
        np.savez(
            fh,
            x=data.x_train[order],
            y=data.y_train[order],
            part=np.searchsorted(order, part),
            mean=mean,
            std=std,
            classes=data.num_classes,
            client=client,
            x_test=data.x_test if test else data.x_test[:0],
            y_test=data.y_test if test else data.y_test[:0],
            settings=json.dumps(partition_settings(cfg)),
            server_key=np.bytes_(server_key),
        )
    return len(part)


def site_server_key(path: str | Path) -> bytes:
    """The server's public key a site's data file carries (b'' if none: it was exported without one)."""
    try:
        with np.load(path) as f:
            return bytes(f["server_key"].item()) if "server_key" in f.files else b""
    except (OSError, ValueError) as err:
        why = f"not a site data file ({err})"
        raise ConfigError(f"data-path {path}: {why}; make one with incofl federation export") from None


def load_site(path: str | Path, dataset: str, client: int, partition: str) -> tuple[ShareDataset, np.ndarray]:
    """A node's data for `client` of a run on `dataset`: its share, and its training indices into it.
    A file of another client or drawn with other partition settings than those whose digest the
    run told (`partition`), or that group or others may read, is refused in one line."""
    from incofl.deploy.wire.credentials import check_private

    if Path(path).exists():
        check_private(Path(path))
    try:
        with np.load(path) as f:
            site = {k: f[k] for k in f.files}
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"data-path {path}: not a site data file ({err}); make one with incofl federation export"
        ) from None
    if int(site["client"]) != client:
        raise ConfigError(f"data-path {path}: holds client {int(site['client'])}'s data, this node is client {client}")
    check_digest(f"data-path {path}", json.loads(str(site["settings"])), partition)
    data = ShareDataset(
        dataset,
        site["x"],
        site["y"],
        site["x_test"],
        site["y_test"],
        order="unknown",
        classes=int(site["classes"]),
        mean=site["mean"],
        std=site["std"],
    )
    return data, site["part"].astype(np.int64)
