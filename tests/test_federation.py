"""incofl's methods as a Flower app (docs/federation.md): the codec is exact, the in-process
federation (the real ServerApp and ClientApp, one Context per node) gives the simulator's
weights and metrics for a method of each family, bad replies and lost nodes are refused by
name, and what cannot run federated is refused before anything starts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

if not os.environ.get("CI"):  # CI installs the extra: there a missing flwr fails
    pytest.importorskip("flwr", reason="the flower extra is not installed (pip install -e '.[flower]')")

from federation_helpers import TINY, WIDTH, export_sites, metrics, run_both, signed_sites, write_config  # noqa: E402

from incofl.config import ConfigError, RunConfig, load_run_config  # noqa: E402
from incofl.data.partition import partition_for  # noqa: E402
from incofl.data.sources import dataset_for  # noqa: E402
from incofl.fl.contracts import ClientPlan, ClientUpdate, View  # noqa: E402
from incofl.registry import METHODS  # noqa: E402


def federated(name: str) -> dict[str, Any]:
    """What a registered method needs of the tiny federated run (digits, 4 clients, 2 rounds),
    from its registry entry: a new method is tested by being registered."""
    method, out = METHODS[name], {"methods": [name]}
    if method.width:  # colour images and batch BN at evaluation (static BN is refused federated), 24 images a client
        out |= {**WIDTH, "client_samples": 24}
        if method.objective.exits:
            out |= {"models": ["resnet110"], "width_rates": [0.5, 1.0], "exits": [2, 4]}
    if method.planner.personal:  # personal layers kept on the nodes, scored there on the held-out share
        out["holdout"] = 0.2
    if method.partial:  # FedPart: a full round, then partial ones
        out |= {"models": ["resnet10"], "rounds": 3}
    # an eighth of the channels for every method (in place of TINY's and WIDTH's quarter): the two
    # paths' bits agree at any width, and these 32 cases took 151 s on CI at a quarter
    return out | {"model_scale": 0.125}


# every registered method, and local BN statistics kept on the nodes (each group's first client's
# model then scored on its node's test split)
EQUAL = {name: federated(name) for name in sorted(METHODS)} | {
    "FedPer, bn_stats local": {**federated("FedPer"), "bn_stats": "local"}
}


def test_codec_round_trip_is_exact():
    from incofl.deploy.codec import job_content, read_job, read_update, update_content
    from incofl.fl.engine.exchange import ExpectedUpdate, TrainJob

    gen = torch.Generator().manual_seed(0)
    start = {"w": torch.randn(3, 4, generator=gen), "n": torch.tensor(7)}
    index = {"w": (torch.tensor([0, 2]), None), "n": ()}
    plan = ClientPlan(
        3, 1, 0, 4, trainable=frozenset({"w"}), keep=frozenset({"n"}), last_grad=True, view=View(1, index, 0.25)
    )
    job = read_job(TrainJob, job_content(TrainJob(5, plan, start, {"c": start["w"] * 2}, "ab12")), "cpu")
    back, got, broadcast = job.plan, job.start, job.broadcast
    assert (
        job.round == 5
        and job.state_sha256 == "ab12"
        and (back.client, back.group, back.federation, back.federation_size) == (3, 1, 0, 4)
    )
    assert (back.trainable, back.upload, back.keep, back.last_grad) == ({"w"}, None, {"n"}, True)
    assert back.view.group == 1 and back.view.cost == 0.25 and back.view.index["w"][1] is None
    assert torch.equal(back.view.index["w"][0], index["w"][0]) and back.view.index["n"] == ()
    assert all(torch.equal(got[k], start[k]) and got[k].dtype == start[k].dtype for k in start)
    assert list(got) == list(start) and torch.equal(broadcast["c"], start["w"] * 2)
    update = ClientUpdate(
        3,
        1,
        {"w": start["w"] / 3},
        17,
        5,
        extra={"last_grad": {"w": start["w"]}},
        loss=0.5,
        upload_params=12,
        classes=torch.tensor([1, 4]),
    )
    entries = {"w": ((3, 4), torch.float32)}
    expected = ExpectedUpdate(plan, entries, {"last_grad": entries}, 17, 5, 12, torch.tensor([1, 4]))
    decoded, kept, state = read_update(update_content(update, "abc", "def"), expected, "cpu")
    assert (kept, state) == ("abc", "def") and torch.equal(decoded.delta["w"], update.delta["w"])
    assert torch.equal(decoded.extra["last_grad"]["w"], start["w"]) and torch.equal(decoded.classes, update.classes)
    assert (decoded.num_samples, decoded.steps, decoded.loss, decoded.upload_params) == (17, 5, 0.5, 12)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(EQUAL))
def test_flower_path_equals_the_simulator(tmp_path, case):
    """The same state_sha256 and metrics.csv (less its timing column) as `incofl train`."""
    simulated, through_flower, sim, fed = run_both(tmp_path, **EQUAL[case])
    assert through_flower["state_sha256"] == simulated["state_sha256"]
    assert metrics(fed).equals(metrics(sim))
    traffic = pd.read_csv(fed / "federation.csv")  # client models go to their nodes to be scored only where needed
    assert set(traffic["stage"]) == ({"train", "evaluate"} if "holdout" in EQUAL[case] else {"train"})


def test_static_bn_of_the_width_models_is_refused_by_name():
    from incofl.deploy.serverapp import check_federated

    with pytest.raises(ConfigError, match="method HeteroFL cannot run .*eval_bn: static gathers BN statistics"):
        check_federated(RunConfig(dataset="digits", method="HeteroFL", models=["preresnet18"]))
    for method in ("InCoAvg", "FedPer", "Local", "FedLAG"):  # no refusal
        check_federated(RunConfig(dataset="digits", method=method, holdout=0.2, bn_stats="local"))


@pytest.mark.slow
def test_a_node_without_the_test_split_its_model_is_scored_on_is_refused_before_the_first_round(tmp_path):
    """FedPer scores client 0's model (its personal layers are on its node) on the test split:
    a node whose file lacks it is refused by name before any round."""
    from incofl.deploy.inprocess import InProcessGrid
    from incofl.deploy.serverapp import AppSettings, serve
    from incofl.deploy.sitedata import export_client

    config = write_config(tmp_path, methods=["FedPer"], holdout=0.2)
    cfg = load_run_config(config)
    nodes = export_sites(cfg, tmp_path)
    data = dataset_for(cfg)
    export_client(cfg, data, partition_for(cfg, data), 0, nodes[0]["data-path"])  # without the test split
    settings = AppSettings(str(config), {}, tmp_path / "federation", join_timeout=5.0)
    with pytest.raises(ConfigError, match=r"\(client 0\): its data file lacks the test split .* export it with --test"):
        serve(InProcessGrid(nodes), settings)
    assert not (tmp_path / "federation" / "metrics.csv").exists()


def test_a_site_file_of_another_client_or_partition_is_refused(tmp_path):
    from incofl.deploy.sitedata import load_site

    cfg = load_run_config(write_config(tmp_path))
    nodes = export_sites(cfg, tmp_path)
    with pytest.raises(ConfigError, match="holds client 1's data, this node is client 0"):
        load_site(nodes[1]["data-path"], cfg, 0)
    other = RunConfig(**{**cfg.model_dump(), "alpha": 0.1})
    with pytest.raises(ConfigError, match="exported with alpha=0.5, the run has alpha=0.1"):
        load_site(nodes[0]["data-path"], other, 0)
    assert TINY["clients"] == len(nodes)


@pytest.mark.parametrize(("key", "value"), [("min_size", 3), ("max_retries", 7)])
def test_a_site_file_drawn_with_another_partition_setting_is_refused(tmp_path, key, value):
    """A node checks every setting the partition is drawn with (config.Affects.PARTITION), not a list of its own."""
    from incofl.deploy.sitedata import load_site

    cfg = load_run_config(write_config(tmp_path))
    nodes = export_sites(cfg, tmp_path)
    other = RunConfig(**{**cfg.model_dump(), key: value})
    with pytest.raises(ConfigError, match=f"exported with {key}={getattr(cfg, key)}, the run has {key}={value}"):
        load_site(nodes[0]["data-path"], other, 0)


def _scheduled(round_: int) -> list[int]:
    """The clients the tiny run trains in `round_` (0-based): incofl's seeded schedule."""
    from incofl.fl.stages.sampling import sample_schedule

    return [int(c) for c in sample_schedule(TINY["seeds"][0], TINY["clients"], TINY["ratio"], TINY["rounds"])[round_]]


def _node_of(client: int) -> int:
    from incofl.deploy.inprocess import FIRST_NODE

    return FIRST_NODE + client  # export_sites lists the clients in order


def _silent_from(round_: int):
    """A node that dies before replying to its round-`round_` (1-based) training message."""
    from incofl.deploy.clientapp import app

    def node(message, context):
        dead = message.metadata.message_type == "train" and int(message.metadata.group_id) >= round_
        return None if dead else app(message, context)

    return node


def _corrupting(change):
    """A node whose training replies are changed by `change(content)` after honest training."""
    from incofl.deploy.clientapp import app

    def node(message, context):
        reply = app(message, context)
        if message.metadata.message_type == "train":
            change(reply.content)
        return reply

    return node


def _first_delta(content, change):
    from flwr.app import Array

    delta = content.array_records["delta"]
    name = next(iter(delta))
    delta[name] = Array(change(delta[name].numpy().copy()))


def _nan(content):
    _first_delta(content, lambda a: a * float("nan"))


def _reshaped(content):
    _first_delta(content, lambda a: a[:1])


def _impostor(content):
    metrics = content.metric_records["metrics"]
    metrics["client"] = (metrics["client"] + 1) % TINY["clients"]


def _inf_samples(content):  # crashed the server (OverflowError) before
    content.metric_records["metrics"]["num_samples"] = float("inf")


@pytest.mark.slow
@pytest.mark.parametrize("method,settings", [("SCAFFOLD", {}), ("FedPer", {"holdout": 0.2})])
def test_a_lost_node_stops_the_run_by_name_and_a_restart_resumes(tmp_path, method, settings):
    """Round 2's first client never answers: the run stops naming it, after round 1's checkpoint;
    with its node back, the same command resumes and ends with the simulator's weights, though
    the other nodes' clients (SCAFFOLD's c_i, FedPer's personal layers) had trained round 2 already."""
    from incofl.deploy.inprocess import InProcessGrid
    from incofl.deploy.serverapp import AppSettings, serve
    from incofl.fl.engine.exchange import MissingClients

    lost = _scheduled(1)[0]
    config = write_config(tmp_path, methods=[method], **settings)
    cfg = load_run_config(config)
    nodes = export_sites(cfg, tmp_path)
    settings = AppSettings(
        str(config), {}, tmp_path / "federation", join_timeout=5.0, round_timeout=1.0
    )  # the lost node: missing after 1 s
    with pytest.raises(MissingClients, match=f"round 2: no accepted reply from client\\(s\\) {lost} "):
        serve(InProcessGrid(nodes, apps={_node_of(lost): _silent_from(2)}), settings)
    assert (tmp_path / "federation" / "ckpt.pt").exists() and not (tmp_path / "federation" / "summary.json").exists()
    ahead = [c for c in _scheduled(1) if c != lost]  # trained round 2 before the stop
    assert all(list((tmp_path / f"site{c}.state").rglob("after-round-2.pt")) for c in ahead)
    resumed = serve(InProcessGrid(nodes, run_id=2), settings)
    from incofl.fl.engine.run import train

    assert resumed["state_sha256"] == train(cfg, tmp_path / "simulator")["state_sha256"]
    assert metrics(tmp_path / "federation").equals(metrics(tmp_path / "simulator"))


@pytest.mark.slow
def test_a_node_whose_saved_state_is_gone_stops_the_run_instead_of_training_from_scratch(tmp_path, caplog):
    """SCAFFOLD: after round 1, one trained client's node loses its state files (its c_i); in the
    round it trains next, its node refuses to start from a fresh state, and the run stops naming it."""
    import shutil

    from incofl.deploy.inprocess import InProcessGrid
    from incofl.deploy.serverapp import AppSettings, serve
    from incofl.fl.engine.exchange import MissingClients

    config = write_config(tmp_path, methods=["SCAFFOLD"], rounds=4)
    cfg = load_run_config(config)
    nodes = export_sites(cfg, tmp_path)
    first = set(_scheduled(0))
    wiped = next(c for r in range(1, 4) for c in _scheduled(r) if c in first)  # trains in round 1 and again
    from incofl.deploy.clientapp import app

    def forgetful(message, context):  # the node's state folder deleted after its first round
        reply = app(message, context)
        if message.metadata.message_type == "train" and message.metadata.group_id == "1":
            shutil.rmtree(tmp_path / f"site{wiped}.state")
        return reply

    settings = AppSettings(str(config), {}, tmp_path / "federation", join_timeout=5.0)
    with pytest.raises(MissingClients, match=f"client\\(s\\) {wiped} .*is not the one it reported"):
        serve(InProcessGrid(nodes, apps={_node_of(wiped): forgetful}), settings)


def test_a_run_and_its_nodes_share_one_rule_of_the_checkpointed_rounds():
    """A stopped run resumes from the last round `checkpointed` (the server's Run writes them) before
    the round it stopped in: `last_checkpoint`, which a node reads to keep what it may be asked for."""
    from incofl.fl.engine.checkpoint import checkpointed, last_checkpoint

    for every, rounds in ((1, 5), (2, 7), (3, 9), (5, 5)):
        cfg = RunConfig(checkpoint_every=every, rounds=rounds)
        for round_ in range(1, rounds + 1):
            written = [r for r in range(1, round_) if checkpointed(r, cfg)]
            assert last_checkpoint(round_, cfg) == max(written, default=0)
        assert not checkpointed(rounds, cfg)  # a finished run is marked by summary.json


def test_the_apps_run_config_defaults_are_its_settings():
    """flower-app/pyproject.toml repeats AppSettings' defaults for `flwr run`: one set of numbers."""
    import tomllib

    from incofl.deploy.serverapp import AppSettings

    app = tomllib.loads((Path(__file__).resolve().parents[1] / "flower-app" / "pyproject.toml").read_text())["tool"][
        "flwr"
    ]["app"]["config"]
    settings = AppSettings.of({**app, "out": "x", "insecure": True})
    assert (settings.round_timeout, settings.join_timeout, settings.allow_missing) == (
        AppSettings.round_timeout,
        AppSettings.join_timeout,
        AppSettings.allow_missing,
    )
    assert (app["round-timeout"], app["join-timeout"], app["allow-missing"]) == (
        AppSettings.round_timeout,
        AppSettings.join_timeout,
        AppSettings.allow_missing,
    )


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"bn_stats": "local"},
        {"method": "FedPer", "holdout": 0.2},
        {"method": "FedPer", "holdout": 0.2, "pool_test": True},
    ],
)
def test_the_clients_whose_sites_need_the_test_split_are_the_layouts(settings):
    """`incofl federation export --test` asks it of the clients whose models the layout scores on
    the test split where the client is (Layout.on_client): one rule, read two ways."""
    from incofl.fl.engine.assembly import assemble
    from incofl.fl.stages.layout import TEST, tested_on_clients

    cfg = RunConfig(
        **{"dataset": "digits", "progress": False, "clients": 4, "models": ["resnet10", "resnet14"], **settings}
    )
    data = dataset_for(cfg)
    layout = assemble(cfg, data, partition_for(cfg, data), torch.device("cpu")).layout
    there = [job.client for job in layout.client_evals() if job.split == TEST and layout.on_client(job)]
    assert tested_on_clients(cfg) == there


def test_a_node_keeps_the_states_a_checkpoint_of_the_server_can_resume_from(tmp_path):
    """Saved after rounds 1, 2, 4, 5 with checkpoints every 2 rounds: the state after round 2
    (the checkpoint at 4 resumes from it for a client that did not train in 3 or 4) is kept
    until one at or before a later checkpoint replaces it; a resumed round reads the last state before it."""
    from incofl.deploy.client import SavedStores

    every2 = RunConfig(checkpoint_every=2)
    states = SavedStores(tmp_path / "client0", every2)
    for round_ in (1, 2, 4, 5):
        states.save(round_, {"round": torch.tensor(round_)})
    assert states.rounds() == [4, 5]  # the checkpoint before round 5 is round 4's
    states = SavedStores(tmp_path / "client1", every2)
    for round_ in (1, 2, 3):
        states.save(round_, {"round": torch.tensor(round_)})
    assert states.rounds() == [2, 3]  # round 3's checkpoint to resume from is round 2's
    assert int(states.at(2)["round"]) == 2 and int(states.at(7)["round"]) == 3 and states.at(1) is None


@pytest.mark.slow
@pytest.mark.parametrize(
    "change,why",
    [
        (_nan, "holds NaN or Inf"),
        (_reshaped, "expected float32"),
        (_impostor, "reply for client"),
        (_inf_samples, "num_samples: of type float"),
    ],
)
def test_a_malformed_reply_is_refused_and_logged_by_node(tmp_path, caplog, change, why):
    """A reply with a NaN, a wrong shape or another client's id is never averaged in: logged by
    node and client; with allow-missing the run goes on without it and rounds.csv names it."""

    from incofl.deploy.inprocess import InProcessGrid
    from incofl.deploy.serverapp import AppSettings, serve

    bad = _scheduled(0)[0]
    config = write_config(tmp_path, rounds=1)
    nodes = export_sites(load_run_config(config), tmp_path)
    settings = AppSettings(str(config), {}, tmp_path / "federation", join_timeout=5.0, allow_missing=True)
    serve(InProcessGrid(nodes, apps={_node_of(bad): _corrupting(change)}), settings)
    assert f"node {_node_of(bad)}, client {bad}: refused: " in caplog.text and why in caplog.text
    rounds = pd.read_csv(tmp_path / "federation" / "rounds.csv", dtype={"missing": str})
    assert rounds["missing"].tolist() == [str(bad)]
    assert rounds["samples"].iloc[0] > 0  # the other client's update was averaged


def test_export_writes_one_clients_samples_and_refuses_a_client_out_of_range(tmp_path, capsys):
    from incofl.cli import run
    from incofl.deploy.sitedata import load_site

    config = write_config(tmp_path)
    out = tmp_path / "site1.npz"
    assert run(["federation", "export", "--config", str(config), "--client", "1", "--out", str(out)]) == 0
    data, partition = load_site(out, load_run_config(config), 1)
    assert [len(p) for p in partition.parts].count(0) == TINY["clients"] - 1 == 3
    assert len(partition.parts[1]) == len(data.y_train) and data.num_classes == 10
    argv = ["federation", "export", "--config", str(config), "--client", "4", "--out", str(tmp_path / "x.npz")]
    assert run(argv) == 2 and "--client 4: the config has clients 0..3" in capsys.readouterr().err


def test_export_without_client_writes_every_clients_file_with_the_test_split_where_the_run_needs_it(tmp_path):
    from incofl.cli import run
    from incofl.deploy.sitedata import load_site
    from incofl.fl.stages.layout import tested_on_clients as tested_on_nodes

    config = write_config(tmp_path, methods=["FedPer"], holdout=0.2)
    assert run(["federation", "export", "--config", str(config), "--out", str(tmp_path / "sites")]) == 0
    cfg = load_run_config(config)
    tests = [len(load_site(tmp_path / "sites" / f"site{c}.npz", cfg, c)[0].y_test) for c in range(cfg.clients)]
    first = tested_on_nodes(cfg)  # each model group's first client: its model is scored on the test split
    assert len(first) == len(cfg.models) == 2
    assert tests == [len(dataset_for(cfg).y_test) if c in first else 0 for c in range(cfg.clients)]


def test_federation_up_refuses_bad_input_in_one_line_before_starting_anything(tmp_path, monkeypatch, capsys):
    from incofl.cli import run
    from incofl.deploy.up import add_connection

    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    (tmp_path / "empty").mkdir()
    assert run(["federation", "up", "--sites", str(tmp_path / "empty")]) == 2
    assert "no site data files (*.npz)" in capsys.readouterr().err
    nodes = export_sites(load_run_config(write_config(tmp_path)), tmp_path)
    (tmp_path / "copy.npz").write_bytes(Path(nodes[0]["data-path"]).read_bytes())
    (tmp_path / "copy.npz").chmod(0o600)  # a site file others may read is refused before anything else
    assert run(["federation", "up", "--sites", str(tmp_path)]) == 2
    assert "both hold client 0's data" in capsys.readouterr().err
    argv = ["federation", "up", "--sites", str(tmp_path / "sites"), "--certificates", str(tmp_path)]
    (tmp_path / "sites").mkdir()
    (tmp_path / "sites" / "site1.npz").write_bytes(Path(nodes[1]["data-path"]).read_bytes())
    (tmp_path / "sites" / "site1.npz").chmod(0o600)
    assert run(argv) == 2 and "no ca.pem, server.pem, server.key" in capsys.readouterr().err
    import socket

    with socket.socket() as held:  # a port of the federation's taken
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert run(["federation", "up", "--sites", str(tmp_path / "sites"), "--port", str(port)]) == 2
    assert f"127.0.0.1:{port} is in use" in capsys.readouterr().err
    # the connection: appended once, kept as written, another entry of that name never overwritten
    config = add_connection("mine", "127.0.0.1:9092", None)
    assert add_connection("mine", "127.0.0.1:9092", None) == config
    assert config.read_text().count("[superlink.mine]") == 1
    assert "[superlink.local]" in config.read_text()  # Flower's own defaults kept (the file was new)
    with pytest.raises(ConfigError, match="connection mine exists with other settings"):
        add_connection("mine", "127.0.0.1:9999", None)


def _site_keys(count: int):
    """`count` P-384 key pairs as a site makes them: (OpenSSH public key, PEM public key as a SuperLink holds it)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    keys = [ec.generate_private_key(ec.SECP384R1()).public_key() for _ in range(count)]
    ssh = serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    pem = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    return [(k.public_bytes(*ssh), k.public_bytes(*pem)) for k in keys]


def test_a_node_claiming_another_sites_client_is_refused_and_the_run_goes_on(tmp_path, caplog):
    """With node-keys, a node whose key is not client 0's site's claims client 0 before the
    rightful node, and a node with no site's key fails at identify: both are refused and logged,
    and client 0 trains on its own site's node; without node-keys the start-up line says any
    node may claim any client."""
    import json

    from incofl.deploy.credentials import node_key
    from incofl.deploy.inprocess import FIRST_NODE, InProcessGrid
    from incofl.deploy.serverapp import AppSettings, serve
    from incofl.deploy.transport import Identity

    config = write_config(tmp_path, rounds=1)
    sites, pems = signed_sites(load_run_config(config), tmp_path)
    own = node_key(tmp_path / "impostor", 0)[0]  # a key pair of its own, signing as client 0
    nodes = [{**sites[0], "node-key": str(own)}, *sites, sites[1]]  # first: the impostor; last: the stranger
    impostor, stranger = FIRST_NODE, FIRST_NODE + len(sites) + 1
    pem = _site_keys(2)
    keys = {impostor: pem[0][1], stranger: pem[1][1]} | {node + 1: key for node, key in pems.items()}

    def failing(message, context):
        raise RuntimeError("no data here")

    grid = InProcessGrid(nodes, apps={stranger: failing}, keys=keys)
    settings = AppSettings(str(config), {}, tmp_path / "federation", join_timeout=5.0, node_keys=tmp_path / "keys")
    serve(grid, settings)
    assert f"node {impostor} says it is client 0: refused: node {impostor}'s key is not client 0's" in caplog.text
    assert f"identify: node {stranger}: the node's ClientApp failed: RuntimeError: no data here" in caplog.text
    assert json.loads((tmp_path / "federation" / "federation.json").read_text())["nodes"]["0"] == impostor + 1
    Identity.load(grid, None, None, len(sites), 1)
    assert "no node-keys: any node may claim any client" in caplog.text


def test_the_codec_maps_every_field_of_the_plan_and_the_update_by_its_type():
    """A new field of a type the codec knows travels without a change to it; one of another type
    fails loudly at its first message (never silently left behind)."""
    from dataclasses import dataclass, fields

    from flwr.app import RecordDict

    from incofl.deploy.codec import CodecError, decode_fields, encode_fields, update_metrics

    @dataclass(frozen=True)
    class Planned(ClientPlan):
        epochs: int = 0

    @dataclass(frozen=True)
    class Odd(ClientPlan):
        rate: complex = 0j

    plan = Planned(3, 1, 0, 4, trainable=frozenset({"w"}), keep=frozenset({"n"}), last_grad=True, epochs=7)
    assert decode_fields(Planned, RecordDict(encode_fields(plan, "plan")), "plan", "cpu") == plan
    with pytest.raises(CodecError, match="Odd.rate: no encoding for its type complex"):
        encode_fields(Odd(3, 1, 0, 4), "plan")

    @dataclass
    class Counted(ClientUpdate):
        batches: int = 0

    @dataclass
    class Weighted(ClientUpdate):
        weights: dict[str, float] = None

    sent = set(update_metrics(Counted))
    assert "batches" in sent and sent | {"delta", "extra", "classes", "kept", "view"} == {
        f.name for f in fields(Counted)
    }
    with pytest.raises(CodecError, match="Weighted.weights: no encoding"):
        update_metrics(Weighted)
