"""Sites serving their own data (deploy/site/owndata.py, docs/federation.md "A site's own data"): an
image folder or an .npz named in the node config trains with the simulator's numbers where it
holds the partition's share in its order; its facts, declared at identify and signed with the
node key, take the place of the facts file's row; unfit data and an unsigned declaration are
refused before any round."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

if not os.environ.get("CI"):  # CI installs the extra: there a missing flwr fails
    pytest.importorskip("flwr", reason="the flower extra is not installed (pip install -e '.[flower]')")

from federation_helpers import (  # noqa: E402
    metrics,
    no_data_set,
    scheduled,
    signed_sites,
    silent_from,
    summary_of,
    write_config,
)

from incofl.config import ConfigError, load_run_config  # noqa: E402
from incofl.data.partition import partition_for  # noqa: E402
from incofl.data.sources import dataset_for  # noqa: E402
from incofl.fl.engine.simulator import train  # noqa: E402


def write_folder(folder: Path, x: np.ndarray, y: np.ndarray) -> None:
    """Images (N, 1, H, W) as grey PNGs by class, named by their position (the order they train in)."""
    from PIL import Image

    for i, (image, label) in enumerate(zip(x, y, strict=True)):
        (folder / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image[0]).save(folder / str(label) / f"{i:05d}.png")


def own_sites(tmp: Path, cfg, own: dict[int, str], keep: float = 1.0) -> tuple[list[dict], dict[int, bytes]]:
    """signed_sites' federation in which client c in `own` serves its share (its first `keep` of
    it), in the partition's order, as its own data: `own[c]` "folder" or "npz" (images N x H x W x C)."""
    nodes, pems = signed_sites(cfg, tmp)
    data = dataset_for(cfg)
    parts = partition_for(cfg, data).parts
    for client, layout in own.items():
        part = parts[client][: int(len(parts[client]) * keep)]
        x, y, node = data.x_train[part], data.y_train[part], nodes[client]
        del node["data-path"]
        node["server-key"] = str(tmp / "keys" / "server.pub")
        if layout == "folder":
            node["data-folder"] = str(tmp / f"own{client}")
            write_folder(tmp / f"own{client}", x, y)
        else:
            node["data-npz"] = str(tmp / f"own{client}.npz")
            np.savez(tmp / f"own{client}.npz", x=x.transpose(0, 2, 3, 1), y=y)
    return nodes, pems


def serve_sites(
    tmp: Path, config: Path, nodes: list[dict], pems: dict[int, bytes], timeout: float = 5.0, **grid: Any
) -> dict:
    """The run of `config` on `nodes` through the in-process federation with node-keys; `grid`:
    DirectGrid's (apps, run_id), and round_timeout: the server's (a silent node's wait)."""
    from federation_helpers import direct_grid

    from incofl.deploy.server.serverapp import AppSettings, serve

    waits = {"join_timeout": timeout, "round_timeout": grid.pop("round_timeout", AppSettings.round_timeout)}
    settings = AppSettings(str(config), {}, tmp / "federation", node_keys=tmp / "keys", **waits)
    with no_data_set():
        return serve(direct_grid(nodes, keys=pems, **grid), settings)


def export_declared(tmp: Path, config: Path) -> None:
    """`incofl federation export --declared` into `tmp`: the server's facts file, every row left to a declaration."""
    from incofl.cli import run

    assert run(["federation", "export", "--config", str(config), "--out", str(tmp), "--declared"]) == 0


def test_sites_serving_their_own_folders_equal_the_simulator(tmp_path):
    """Clients 0 and 1 read image folders, client 2 an .npz, client 3 its exported share: the
    federation's weights equal the simulator's, bit for bit."""
    config = write_config(tmp_path, methods=["FedAvg"])
    cfg = load_run_config(config)
    nodes, pems = own_sites(tmp_path, cfg, {0: "folder", 1: "folder", 2: "npz"})
    federated = serve_sites(tmp_path, config, nodes, pems)
    simulated = train(cfg, tmp_path / "simulator")
    assert federated["state_sha256"] == simulated["state_sha256"]
    assert summary_of(tmp_path / "federation")["state_sha256"] == simulated["state_sha256"]


def test_a_sites_declaration_takes_the_place_of_the_facts_files_row(tmp_path, caplog):
    """Client 0 serves half its share: the server logs that its declaration differs, checks its
    replies against it (not the facts file's row, which would refuse them) and the run trains."""
    caplog.set_level(logging.INFO, logger="incofl.deploy")
    config = write_config(tmp_path, methods=["FedAvg"], ratio=1.0, rounds=1)
    nodes, pems = own_sites(tmp_path, load_run_config(config), {0: "npz"}, keep=0.5)
    serve_sites(tmp_path, config, nodes, pems)  # allow-missing off: a refused reply would stop it
    assert "client 0 serves its own data: its declaration" in caplog.text
    assert (tmp_path / "federation" / "metrics.csv").exists()


def test_unfit_data_and_an_unsigned_declaration_are_refused_before_any_round(tmp_path, caplog):
    """Client 0's images of another size, or client 1's label outside the classes: the node refuses
    the run in one line naming its node config key, not its path, signed with its node key, and the
    run stops at once with that line; client 2's declaration signed with client 3's key is refused
    by the server, which waits for the rightful node; no round runs."""
    config = write_config(tmp_path, methods=["FedAvg"])
    cfg = load_run_config(config)
    nodes, pems = own_sites(tmp_path, cfg, {0: "folder", 1: "npz", 2: "npz", 3: "npz"})
    good = [dict(node) for node in nodes]
    write_folder(tmp_path / "unfit0", np.zeros((2, 1, 5, 5), np.uint8), np.zeros(2, np.int64))  # another size
    nodes[0]["data-folder"] = str(tmp_path / "unfit0")
    with pytest.raises(ConfigError) as refused:
        serve_sites(tmp_path, config, [nodes[0], *good[1:]], pems, timeout=60.0)
    why = str(refused.value)
    assert why.startswith("client 0's site refused the run: node 101: data-folder <data-folder>: not data of this run")
    assert "(images uint8 [2, 1, 5, 5], the run's are" in why and "\n" not in why and str(tmp_path) not in why
    with np.load(tmp_path / "own1.npz") as f:
        x, y = f["x"], f["y"]
    np.savez(tmp_path / "own1.npz", x=x, y=np.full_like(y, 10))
    with pytest.raises(ConfigError) as refused:
        serve_sites(tmp_path, config, good, pems, timeout=60.0, run_id=2)  # a run of its own: nodes read anew
    assert str(refused.value) == (
        "client 1's site refused the run: node 102: data-npz <data-npz>: not data of this run "
        "(label 10: the run has classes 0..9)"
    )
    np.savez(tmp_path / "own1.npz", x=x, y=y)
    nodes[2]["node-key"] = nodes[3]["node-key"]
    with pytest.raises(ConfigError) as refused:
        serve_sites(tmp_path, config, [*good[:2], nodes[2], good[3]], pems, timeout=2.0, run_id=3)
    assert str(refused.value) == "no node joined for client(s) 2 within 2 s (join-timeout)"
    assert "identify: node 103: refused: its signature is not client 2's site's" in caplog.text
    assert not (tmp_path / "federation" / "metrics.csv").exists()


def truncated(folder: Path) -> str:
    """The first image of `folder` (by file name, the site's order) cut to half its bytes; its path in the folder."""
    image = min(folder.glob("*/*.png"), key=lambda path: path.name)
    image.write_bytes(image.read_bytes()[: image.stat().st_size // 2])
    return image.relative_to(folder).as_posix()


def test_a_sites_truncated_image_is_named_in_the_one_line_it_refuses_the_run_with(tmp_path):
    """A PNG cut short in a site's folder: refused in one line naming the file (relative to the
    folder); so are a file that is no image and one of another mode. Before, the line named the
    folder and said only OSError."""
    from PIL import Image

    from incofl.data.facts import Facts
    from incofl.deploy.site.owndata import load_own

    cfg = load_run_config(write_config(tmp_path))
    facts = Facts((), 10, (1, 8, 8), (0.5,), (0.25,))
    folder = tmp_path / "own"
    write_folder(folder, np.random.default_rng(0).integers(0, 256, (3, 1, 8, 8), np.uint8), np.array([0, 3, 3]))
    bad = truncated(folder)
    assert bad == "0/00000.png"
    with pytest.raises(ConfigError) as refused:
        load_own("data-folder", str(folder), cfg.dataset, facts)
    assert str(refused.value) == f"data-folder {folder}: not data of this run (0/00000.png: image file is truncated)"
    (folder / bad).write_bytes(b"not an image")
    with pytest.raises(ConfigError, match=r"\(0/00000\.png: not an image PIL reads\)$"):
        load_own("data-folder", str(folder), cfg.dataset, facts)
    Image.new("RGBA", (8, 8)).save(folder / bad)
    with pytest.raises(ConfigError, match=r"\(0/00000\.png: mode RGBA, not grey \(L\) or RGB\)$"):
        load_own("data-folder", str(folder), cfg.dataset, facts)


def test_a_sites_signed_refusal_stops_the_run_at_once_with_its_line(tmp_path, caplog):
    """Client 0's folder holds a truncated PNG: its node logs the line naming the file, and refuses
    the run, signed with its node key; the server stops at once (not after join-timeout, 60 s here)
    with that line, the node's files by their node config keys."""
    config = write_config(tmp_path, methods=["FedAvg"])
    nodes, pems = own_sites(tmp_path, load_run_config(config), {0: "folder", 1: "folder", 2: "npz"})
    bad = truncated(tmp_path / "own0")
    start = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        serve_sites(tmp_path, config, nodes, pems, timeout=60.0)
    assert time.monotonic() - start < 30
    line = f"not data of this run ({bad}: image file is truncated)"
    assert str(refused.value) == f"client 0's site refused the run: node 101: data-folder <data-folder>: {line}"
    assert f"node 101: a query.identify message failed: data-folder {tmp_path / 'own0'}: {line}" in caplog.text


def test_the_serverapps_refusal_reaches_flowers_log_as_its_one_line(tmp_path):
    """What `flwr run --stream` and `flwr log` show of a refused run: Flower's ServerApp process logs
    what its `flwr` logger and its stdout and stderr carry, then a traceback of the exception the
    ServerApp raised (run_serverapp.py). The ServerApp logs the refusal's one line first, through
    Flower's logger, and raises it with no frame of incofl's below `main`: Flower's status details
    (`flwr ls`) carry the same line. No `<class ...NodeError>` wrapper anywhere."""
    import traceback

    from federation_helpers import direct_grid
    from flwr.app import Context, RecordDict

    from incofl.deploy.server.serverapp import app

    config = write_config(tmp_path, methods=["FedAvg"])
    nodes, pems = own_sites(tmp_path, load_run_config(config), {0: "folder"})
    bad = truncated(tmp_path / "own0")
    run_config = {"config": str(config), "out": str(tmp_path / "federation"), "node-keys": str(tmp_path / "keys")}
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append  # type: ignore[method-assign]
    flower = logging.getLogger("flwr")
    flower.addHandler(handler)
    try:
        with no_data_set(), pytest.raises(ConfigError) as refused:
            app(direct_grid(nodes, keys=pems), Context(1, 0, {}, RecordDict(), {**run_config, "join-timeout": 60}))
    finally:
        flower.removeHandler(handler)
    line = (
        "client 0's site refused the run: node 101: data-folder <data-folder>: not data of this run "
        f"({bad}: image file is truncated)"
    )
    assert str(refused.value) == line
    said = [(r.getMessage(), r.exc_info) for r in seen if r.levelno >= logging.WARNING]
    assert said == [(line, None)]
    frames = [frame.name for frame in traceback.extract_tb(refused.value.__traceback__)]
    assert frames[-1] == "main" and "identify" not in frames, frames


def test_a_declaration_is_taken_only_signed_and_within_the_data_sets_classes():
    """The server's reading of a declaration (already opened: its signature held): refused without
    node-keys, with a class outside the data set, unsorted classes or no samples; else its facts."""
    from flwr.app import ConfigRecord, RecordDict

    from incofl.data.facts import ClientFacts, Facts
    from incofl.deploy.server.serverapp import declared_facts

    facts = Facts((), 10, (1, 8, 8), (0.5,), (0.25,))

    def declaration(samples: int = 40, held_out: int = 0, classes: list[int] | None = None) -> RecordDict:
        record = {"samples": samples, "held_out": held_out, "classes": [1, 3] if classes is None else classes}
        return RecordDict({"declared": ConfigRecord(record)})

    assert declared_facts(declaration(), facts, signed=True) == ClientFacts(40, 0, (1, 3))
    assert declared_facts(RecordDict({}), facts, signed=False) is None  # an exported share declares nothing
    for content, signed, why in [
        (declaration(), False, "only a run with node-keys"),
        (declaration(classes=[3, 10]), True, "not sorted distinct classes"),
        (declaration(classes=[3, 1]), True, "not sorted distinct classes"),
        (declaration(samples=0), True, "0 samples"),
    ]:
        with pytest.raises(ValueError, match=why):
            declared_facts(content, facts, signed)


def test_a_folder_names_its_classes_by_index_and_a_node_names_its_data_once(tmp_path):
    """A class folder named other than by a class index is refused naming it; a node config naming
    two data sources, or none, is refused in one line."""
    from flwr.app import Context, RecordDict

    from incofl.data.facts import Facts
    from incofl.deploy.site.clientapp import node_data
    from incofl.deploy.site.owndata import load_own

    write_folder(tmp_path / "own", np.zeros((2, 1, 8, 8), np.uint8), np.zeros(2, np.int64))
    (tmp_path / "own" / "0").rename(tmp_path / "own" / "cat")
    cfg = load_run_config(write_config(tmp_path))
    facts = Facts((), 10, (1, 8, 8), (0.5,), (0.25,))
    with pytest.raises(ConfigError, match=r"^data-folder .*own: not data of this run \(class folder 'cat' is not"):
        load_own("data-folder", str(tmp_path / "own"), cfg.dataset, facts)
    for config in [{"data-folder": str(tmp_path / "own"), "data-npz": str(tmp_path / "x.npz")}, {}]:
        with pytest.raises(ConfigError, match="name the node's data by one of data-path, data-folder, data-npz"):
            node_data(Context(1, 101, {"client": 0, **config}, RecordDict(), {}))


def test_a_site_serving_its_own_data_where_the_run_scores_on_its_node_is_told_to_serve_an_export(tmp_path):
    """FedPer scores client 0's model on its node's test split, which a site's own data lacks."""
    config = write_config(tmp_path, methods=["FedPer"], holdout=0.2)
    nodes, pems = own_sites(tmp_path, load_run_config(config), {0: "npz"})
    with pytest.raises(ConfigError, match=r"\(client 0\): its data file lacks the test split .* serve an export$"):
        serve_sites(tmp_path, config, nodes, pems)
    assert not (tmp_path / "federation" / "metrics.csv").exists()


def test_sites_serving_their_own_data_with_holdout_equal_the_simulator(tmp_path):
    """holdout: a site splits its own data as the simulator splits a share (seeded by its client,
    stratified by its labels, in the order it serves them), declares its held-out count and scores
    the model on its held-out samples where the run asks. Served in the partition's order, the
    simulator's split: here a partition artifact whose shares are in index order, the order the
    simulator trains a split share in. Weights and every metric equal the simulator's, bit for bit."""
    from incofl.data.partition import Partition

    cfg = load_run_config(write_config(tmp_path, methods=["FedAvg"], holdout=0.2))
    drawn = partition_for(cfg, dataset_for(cfg))
    Partition([np.sort(p) for p in drawn.parts], drawn.histogram, drawn.meta).save(tmp_path / "sorted.npz")
    config = write_config(tmp_path, methods=["FedAvg"], holdout=0.2, partition_file=str(tmp_path / "sorted.npz"))
    cfg = load_run_config(config)
    nodes, pems = own_sites(tmp_path, cfg, {0: "folder", 1: "npz", 2: "npz", 3: "npz"})
    federated = serve_sites(tmp_path, config, nodes, pems)
    simulated = train(cfg, tmp_path / "simulator")
    assert federated["state_sha256"] == simulated["state_sha256"]
    assert metrics(tmp_path / "federation").equals(metrics(tmp_path / "simulator"))


def test_sites_all_serving_their_own_data_need_no_partition_and_resume_on_their_declarations(tmp_path):
    """export --declared: the server's facts file holds the data set's facts and the test split,
    no client's row; every site serves its share as its own data and declares it. Round 2's first
    client never answers: the run stops after round 1's checkpoint. Restarted, the nodes declare
    again (an undeclared row would refuse the run) and it ends with the simulator's weights and metrics."""
    from incofl.deploy.flower.directgrid import FIRST_NODE
    from incofl.fl.engine.exchange import MissingClients

    config = write_config(tmp_path, methods=["SCAFFOLD"])
    cfg = load_run_config(config)
    nodes, pems = own_sites(tmp_path, cfg, {0: "folder", 1: "npz", 2: "npz", 3: "npz"})
    export_declared(tmp_path, config)
    lost = scheduled(1)[0]
    silent = {"apps": {FIRST_NODE + lost: silent_from(2)}, "round_timeout": 1.0}
    with pytest.raises(MissingClients, match=f"round 2: no accepted reply from client\\(s\\) {lost} "):
        serve_sites(tmp_path, config, nodes, pems, **silent)
    assert (tmp_path / "federation" / "ckpt.pt").exists()
    resumed = serve_sites(tmp_path, config, nodes, pems, run_id=2)
    assert resumed["state_sha256"] == train(cfg, tmp_path / "simulator")["state_sha256"]
    assert metrics(tmp_path / "federation").equals(metrics(tmp_path / "simulator"))


def test_a_row_left_to_a_declaration_is_refused_undeclared_or_without_node_keys(tmp_path, capsys):
    """With export --declared's facts file, client 3 serving an exported share (which declares
    nothing) is refused by name in one line before any round; so is the file in a run without
    node-keys, and export --declared asked for one client's file."""
    from federation_helpers import direct_grid

    from incofl.cli import run
    from incofl.deploy.server.serverapp import AppSettings, serve

    config = write_config(tmp_path, methods=["FedAvg"])
    nodes, pems = own_sites(tmp_path, load_run_config(config), {0: "folder", 1: "npz", 2: "npz"})
    export_declared(tmp_path, config)
    with pytest.raises(ConfigError) as refused:
        serve_sites(tmp_path, config, nodes, pems)
    assert str(refused.value).startswith("client(s) 3: the facts file leaves their facts to their sites' declaration")
    assert "\n" not in str(refused.value)
    insecure = AppSettings(str(config), {}, tmp_path / "federation", server_key=tmp_path / "keys" / "server")
    with pytest.raises(ConfigError, match=r"^facts .*facts.npz: leaves .*which only a run with node-keys takes$"):
        serve(direct_grid(nodes), insecure)
    assert not (tmp_path / "federation" / "metrics.csv").exists()
    argv = ["federation", "export", "--config", str(config), "--out", str(tmp_path / "x.npz"), "--client", "0"]
    assert run([*argv, "--declared"]) == 2
    assert capsys.readouterr().err.endswith("--declared writes no site's data file: drop --client and --test\n")


class Started:
    """What `up` starts, recorded in place of processes: each command line by its name."""

    def __init__(self) -> None:
        self.args: dict[str, list[str]] = {}

    def start(self, name: str, args: list[str]) -> SimpleNamespace:
        self.args[name] = args
        return SimpleNamespace(pid=0)  # a process as its executor reads it

    def run(self, args: list[str]) -> None:  # flwr supernode register
        pass


def test_up_starts_a_node_on_a_sites_own_data_and_refuses_bad_site_data_in_one_line(tmp_path, capsys):
    """`up --site-data 0=FOLDER --site-data 2=FILE.npz`: client 0's node is told data-folder, client
    2's data-npz in place of its exported file, both the server's public key and their node key;
    client 1's its exported file (as Flower's SuperNode reads --node-config); with no exported file,
    the own data's nodes alone. Bad values, --insecure
    and a missing server key are refused in one line (exit 2) before anything starts."""
    from flwr.common.config import parse_config_args

    from incofl.cli import run
    from incofl.deploy.up import LocalFederation, site_data, start_nodes
    from incofl.deploy.wire.signing import server_key_pair

    sites, own = tmp_path / "sites", tmp_path / "own0"
    sites.mkdir()
    for client in (1, 2):  # exported files as up reads them (it reads their client only)
        np.savez(sites / f"site{client}.npz", client=client)
    for path in sites.iterdir():
        path.chmod(0o600)
    own.mkdir(mode=0o700)
    np.savez(tmp_path / "own2.npz", x=np.zeros((1, 8, 8), np.uint8), y=np.zeros(1, np.int64))
    (tmp_path / "own2.npz").chmod(0o600)
    given = ["--site-data", f"0={own}", "--site-data", f"2={tmp_path / 'own2.npz'}"]
    up = ["federation", "up", "--sites", str(sites)]
    assert run([*up, *given]) == 2  # no server key yet
    assert f"--site-data: no {sites.resolve()}/keys/server.pub, the server's public key" in capsys.readouterr().err
    public = server_key_pair(sites / "keys")[1]
    fed = LocalFederation(sites, own=site_data(given[1::2]))
    started = Started()
    start_nodes(fed, fed.node_data(), None, None, started)  # type: ignore[arg-type]
    told = {c: parse_config_args([started.args[f"supernode{c}"][-1]]) for c in range(3)}
    keys = {c: str(sites.resolve() / "keys" / f"node{c}") for c in range(3)}
    assert told[0] == {"client": 0, "data-folder": str(own), "server-key": str(public.resolve()), "node-key": keys[0]}
    assert told[1] == {"client": 1, "data-path": str((sites / "site1.npz").resolve()), "node-key": keys[1]}
    npz = str(tmp_path / "own2.npz")
    assert told[2] == {"client": 2, "data-npz": npz, "server-key": str(public.resolve()), "node-key": keys[2]}
    for path in sites.glob("*.npz"):  # sites that all serve their own data: no exported file
        path.unlink()
    assert {client: key for client, (key, _) in fed.node_data().items()} == {0: "data-folder", 2: "data-npz"}
    (tmp_path / "loose.npz").write_bytes(b"")
    (tmp_path / "loose.npz").chmod(0o644)
    for bad, why in [
        (["--site-data", "0"], "--site-data 0: not CLIENT=PATH"),
        (["--site-data", f"x={own}"], f"--site-data x={own}: not CLIENT=PATH"),
        (["--site-data", "0=nowhere.png"], "--site-data 0=nowhere.png: nowhere.png is not a folder or an .npz file"),
        ([*given, "--site-data", f"0={own}"], f"--site-data 0={own}: client 0's data named twice"),
        ([*given, "--insecure"], "--site-data with --insecure: a site's own data declares its facts"),
        (["--site-data", f"1={tmp_path / 'loose.npz'}"], f"{tmp_path / 'loose.npz'}: readable by group or others"),
    ]:
        assert run([*up, *bad]) == 2
        err = capsys.readouterr().err
        assert why in err and err.count("\n") == 1, err
