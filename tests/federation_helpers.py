"""Builders the federation tests share: a tiny run's config file, its sites' data files, and
the same run through `incofl train`'s path and through the in-process Flower federation."""

from __future__ import annotations

import json
import os
import random
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn
from unittest.mock import patch

import pandas as pd
import yaml

from incofl.config import RunConfig, load_run_config
from incofl.data.partition import partition_for
from incofl.data.sources import dataset_for
from incofl.fl.engine.simulator import train

# Digits, 4 clients of which 2 train a round, 2 rounds on two thin ResNets: about a second a run.
TINY = {
    "datasets": ["digits"],
    "alphas": [0.5],
    "methods": ["InCoAvg"],
    "seeds": [0],
    "clients": 4,
    "ratio": 0.5,
    "models": ["resnet10", "resnet14"],
    "model_scale": 0.25,
    "rounds": 2,
    "batch_size": 32,
    "eval_every": 1,
    "checkpoint_every": 1,
    "threads": 1,
    "progress": False,
    "device": "cpu",
}
TIMING = ("seconds",)  # metrics.csv's columns that measure time, not what was computed


def write_config(folder: Path, **settings: Any) -> Path:
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump({**TINY, "cache_dir": str(folder / "cache"), **settings}))
    return path


def server_facts(cfg: RunConfig, folder: Path) -> Path:
    """The server's key and facts file in `folder/keys`, as `incofl federation export` writes them; the key's path."""
    from incofl.data.facts import TestSplit
    from incofl.data.shares import shares
    from incofl.deploy.server.serverdata import FACTS, export_facts
    from incofl.deploy.wire.signing import private_key, server_key_pair

    key = server_key_pair(folder / "keys")[0]
    data = dataset_for(cfg)
    facts = shares(data, partition_for(cfg, data), cfg.holdout, cfg.partition_seed, cfg.normalize)[1]
    export_facts(cfg, TestSplit(data.x_test, data.y_test), facts, folder / "keys" / FACTS, private_key(key))
    return key


def export_sites(cfg: RunConfig, folder: Path) -> list[dict[str, int | str]]:
    """Every client's data file (with the test split where the run needs it), and the server's
    facts (`server_facts`); the node configs that point at them."""
    from incofl.deploy.site.sitedata import export_client
    from incofl.fl.stages.layout import tested_on_clients as tested_on_nodes

    server_facts(cfg, folder)
    data = dataset_for(cfg)
    partition = partition_for(cfg, data)
    nodes = []
    for client in range(cfg.clients):
        path = folder / f"site{client}.npz"
        export_client(cfg, data, partition, client, path, test=client in tested_on_nodes(cfg, cfg.pool_test))
        nodes.append({"client": client, "data-path": str(path)})
    return nodes


def signed_sites(cfg: RunConfig, folder: Path) -> tuple[list[dict[str, int | str]], dict[int, bytes]]:
    """As export_sites, signed both ways as `incofl federation export --keys` makes a federation:
    the server's key pair and each client's node key in `folder/keys`, every file carrying the
    server's public key, every node config its node's private key (`node-key`); and each node's
    public key as a SuperLink holds it (PEM, by the node ids of a DirectGrid over them)."""
    from cryptography.hazmat.primitives import serialization

    from incofl.deploy.flower.directgrid import FIRST_NODE
    from incofl.deploy.site.sitedata import export_client
    from incofl.deploy.wire.credentials import node_key
    from incofl.deploy.wire.signing import private_key, server_key_pair
    from incofl.fl.stages.layout import tested_on_clients as tested_on_nodes

    keys = folder / "keys"
    server_facts(cfg, folder)
    server = server_key_pair(keys)[1].read_bytes()
    data, partition = dataset_for(cfg), partition_for(cfg, dataset_for(cfg))
    nodes, pems = [], {}
    for client in range(cfg.clients):
        path, (private, _) = folder / f"site{client}.npz", node_key(keys, client)
        export_client(
            cfg, data, partition, client, path, client in tested_on_nodes(cfg, cfg.pool_test), server_key=server
        )
        nodes.append({"client": client, "data-path": str(path), "node-key": str(private)})
        pem = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        pems[FIRST_NODE + client] = private_key(private).public_key().public_bytes(*pem)
    return nodes, pems


def run_both(tmp: Path, grid_apps: dict | None = None, **settings: Any) -> tuple[dict, dict, Path, Path]:
    """The run of `settings` by the simulator and by the in-process federation, whose server
    cannot read the data set (only its facts file; the nodes their site files): both summaries and folders."""
    from incofl.deploy.server.serverapp import AppSettings, serve

    config = write_config(tmp, **settings)
    cfg = load_run_config(config)
    sim, fed = tmp / "simulator", tmp / "federation"
    simulated = train(cfg, sim)
    grid = direct_grid(export_sites(cfg, tmp), apps=grid_apps)
    with no_data_set():
        federated = serve(grid, AppSettings(str(config), {}, fed, join_timeout=5.0, server_key=tmp / "keys" / "server"))
    return simulated, federated, sim, fed


def direct_grid(nodes: list[dict[str, int | str]], **options: Any) -> Any:
    """The test transport (flower/directgrid.py) over `nodes`, each answering with incofl's ClientApp
    unless `options` (DirectGrid's) give it another."""
    from incofl.deploy.flower.directgrid import DirectGrid
    from incofl.deploy.site.clientapp import app

    return DirectGrid(nodes, app, **options)


@contextmanager
def no_data_set() -> Iterator[None]:
    """Every data set unreadable in this process (as on a server that holds none): a load raises."""

    def unreadable(name: str, *args: Any, **kwargs: Any) -> NoReturn:
        raise PermissionError(f"{name}: this process may not read a data set")

    with patch("incofl.data.sources.load_dataset", unreadable):
        yield


def scheduled(round_: int) -> list[int]:
    """The clients the tiny run trains in `round_` (0-based): incofl's seeded schedule."""
    from incofl.fl.stages.sampling import sample_schedule

    return [int(c) for c in sample_schedule(TINY["seeds"][0], TINY["clients"], TINY["ratio"], TINY["rounds"])[round_]]


def silent_from(round_: int) -> Callable[[Any, Any], Any]:
    """A node that dies before replying to its round-`round_` (1-based) training message."""
    from incofl.deploy.site.clientapp import app

    def node(message: Any, context: Any) -> Any:
        dead = message.metadata.message_type == "train" and int(message.metadata.group_id) >= round_
        return None if dead else app(message, context)

    return node


def metrics(folder: Path) -> pd.DataFrame:
    return pd.read_csv(folder / "metrics.csv").drop(columns=list(TIMING))


def summary_of(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "summary.json").read_text())


# The width models' tiny run: colour images (digits are grey), batch BN at evaluation (static
# gathers it from every client's data) and 48 images a client (iid draws) to keep the deep resnet110 fast
WIDTH = {
    "datasets": ["synthetic"],
    "models": ["preresnet18"],
    "model_scale": 0.25,
    "width_rates": [1.0, 0.5],
    "eval_bn": "batch",
    "partition": "iid_draw",
    "client_samples": 48,
}


def free_port(n: int) -> int:
    """The first of `n` consecutive free ports on 127.0.0.1 (a SuperLink's, then its nodes'), below
    the kernel's ephemeral range: a port of that range, free when picked, can be any outgoing
    connection's own before `up` binds it (seen: a node's port taken while a test beside it dialled)."""
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    below, pick = low - n > 10000, random.SystemRandom()  # not the tests' seeded `random`
    for _ in range(50):
        first = pick.randrange(10000, low - n) if below else pick.randrange(high + 1, 65536 - n)
        if all(_free(first + i) for i in range(n)):
            return first
    raise RuntimeError("no free ports")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def flower_env(root: Path, repo: Path, **extra: str) -> dict[str, str]:
    """This process's environment for Flower's tools and `up` run from `root`: its own Flower home
    (`root/flwr-home`, made), this checkout's incofl, this venv's commands first; and `extra`."""
    (root / "flwr-home").mkdir()
    venv = Path(sys.executable).parent
    return {
        **os.environ,
        "FLWR_HOME": str(root / "flwr-home"),
        "PYTHONPATH": str(repo / "src"),
        "PATH": f"{venv}{os.pathsep}{os.environ['PATH']}",
        **extra,
    }


def read_site(path: Path | str, cfg: RunConfig, client: int):
    """A node's read of its site file (load_site), told the partition settings' digest of `cfg`."""
    from incofl.deploy.site.sitedata import load_site
    from incofl.sides import PartitionSettings

    return load_site(path, cfg.dataset, client, PartitionSettings.of(cfg).digest())
