"""incofl's methods as a Flower app (docs/federation.md): the codec is exact, the in-process
federation (the real ServerApp and ClientApp, one Context per node) gives the simulator's
weights and metrics for a method of each family, bad replies and lost nodes are refused by
name, and what cannot run federated is refused before anything starts."""

from __future__ import annotations

import os

import pytest
import torch

if not os.environ.get("CI"):  # CI installs the extra: there a missing flwr fails
    pytest.importorskip("flwr", reason="the flower extra is not installed (pip install -e '.[flower]')")

from federation_helpers import TINY, export_sites, metrics, run_both, write_config  # noqa: E402

from incofl.config import ConfigError, RunConfig, load_run_config  # noqa: E402
from incofl.fl.contracts import ClientPlan, ClientUpdate, View  # noqa: E402

# width models: colour images (digits are grey), batch BN at evaluation (static gathers it from every client's data)
# and 48 images a client (iid draws) to keep the deep resnet110 fast
WIDTH = {
    "datasets": ["synthetic"],
    "models": ["preresnet18"],
    "model_scale": 0.25,
    "width_rates": [1.0, 0.5],
    "eval_bn": "batch",
    "partition": "iid_draw",
    "client_samples": 48,
}
# One method of each family, with the settings it needs; digits, 4 clients, 2 rounds.
FAMILIES = {
    "InCoAvg": {},
    "SCAFFOLD": {},  # the server's c broadcast, each client's c_i in its node's Context.state
    "FedNova": {},
    "MOON": {},
    "FedPart": {"models": ["resnet10"], "rounds": 3},
    "HeteroFL": WIDTH,
    "FedRolex": WIDTH,
    "ScaleFL": {**WIDTH, "models": ["resnet110"], "width_rates": [0.5, 1.0], "exits": [2, 4]},
}


def test_codec_round_trip_is_exact():
    from incofl.federation.codec import read_train, read_update, train_content, update_content

    gen = torch.Generator().manual_seed(0)
    start = {"w": torch.randn(3, 4, generator=gen), "n": torch.tensor(7)}
    index = {"w": (torch.tensor([0, 2]), None), "n": ()}
    plan = ClientPlan(
        3, 1, 0, 4, trainable=frozenset({"w"}), keep=frozenset({"n"}), last_grad=True, view=View(1, index, 0.25)
    )
    round_, back, got, broadcast = read_train(train_content(5, plan, start, {"c": start["w"] * 2}), "cpu")
    assert round_ == 5 and (back.client, back.group, back.federation, back.federation_size) == (3, 1, 0, 4)
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
    decoded, kept = read_update(update_content(update, "abc"), "cpu")
    assert kept == "abc" and torch.equal(decoded.delta["w"], update.delta["w"])
    assert torch.equal(decoded.extra["last_grad"]["w"], start["w"]) and torch.equal(decoded.classes, update.classes)
    assert (decoded.num_samples, decoded.steps, decoded.loss, decoded.upload_params) == (17, 5, 0.5, 12)


@pytest.mark.slow
@pytest.mark.parametrize("method", list(FAMILIES))
def test_flower_path_equals_the_simulator(tmp_path, method):
    """The same state_sha256 and metrics.csv (less its timing column) as `incofl train`."""
    simulated, federated, sim, fed = run_both(tmp_path, methods=[method], **FAMILIES[method])
    assert federated["state_sha256"] == simulated["state_sha256"]
    assert metrics(fed).equals(metrics(sim))
    assert (fed / "federation.csv").exists()


def test_unsupported_configs_are_refused_by_name(tmp_path):
    from incofl.federation.server import check_federated

    refused = [
        ({"method": "FedLAG", "holdout": 0.2}, "keeps"),
        ({"method": "FedPer", "holdout": 0.2}, "keeps"),
        ({"holdout": 0.2}, "holdout"),
        ({"bn_stats": "local"}, "bn_stats"),
        ({"method": "HeteroFL", "models": ["preresnet18"]}, "eval_bn"),
    ]
    for settings, why in refused:
        settings = {"dataset": "digits", "method": "FedAvg", **settings}
        with pytest.raises(ConfigError, match=f"method {settings['method']} cannot run .*{why}"):
            check_federated(RunConfig(**settings))
    check_federated(RunConfig(dataset="digits", method="InCoAvg"))  # no refusal


def test_a_site_file_of_another_client_or_partition_is_refused(tmp_path):
    from incofl.federation.sitedata import load_site

    cfg = load_run_config(write_config(tmp_path))
    nodes = export_sites(cfg, tmp_path)
    with pytest.raises(ConfigError, match="holds client 1's data, this node is client 0"):
        load_site(nodes[1]["data-path"], cfg, 0)
    other = RunConfig(**{**cfg.model_dump(), "alpha": 0.1})
    with pytest.raises(ConfigError, match="exported with alpha=0.5, the run has alpha=0.1"):
        load_site(nodes[0]["data-path"], other, 0)
    assert TINY["clients"] == len(nodes)


def _scheduled(round_: int) -> list[int]:
    """The clients the tiny run trains in `round_` (0-based): incofl's seeded schedule."""
    from incofl.fl.stages.sampling import sample_schedule

    return [int(c) for c in sample_schedule(TINY["seeds"][0], TINY["clients"], TINY["ratio"], TINY["rounds"])[round_]]


def _node_of(client: int) -> int:
    from incofl.federation.inprocess import FIRST_NODE

    return FIRST_NODE + client  # export_sites lists the clients in order


def _silent_from(round_: int):
    """A node that dies before replying to its round-`round_` (1-based) training message."""
    from incofl.federation.clientapp import app

    def node(message, context):
        dead = message.metadata.message_type == "train" and int(message.metadata.group_id) >= round_
        return None if dead else app(message, context)

    return node


def _corrupting(change):
    """A node whose training replies are changed by `change(update)` after honest training."""
    from flwr.app import Message

    from incofl.federation.clientapp import app
    from incofl.federation.codec import read_update, update_content

    def node(message, context):
        reply = app(message, context)
        if message.metadata.message_type != "train":
            return reply
        update, kept = read_update(reply.content, "cpu")
        change(update)
        return Message(update_content(update, kept), reply_to=message)

    return node


def _nan(update):
    next(iter(update.delta.values()))[0] = float("nan")


def _reshaped(update):
    name = next(iter(update.delta))
    update.delta[name] = update.delta[name][:1]


def _impostor(update):
    update.client = (update.client + 1) % TINY["clients"]


@pytest.mark.slow
def test_a_lost_node_stops_the_run_by_name_and_a_restart_resumes(tmp_path):
    """Round 2's first client never answers: the run stops naming it, after round 1's checkpoint;
    with its node back, the same command resumes and ends with the simulator's weights."""
    from incofl.federation.inprocess import InProcessGrid
    from incofl.federation.server import MissingClients
    from incofl.federation.serverapp import AppSettings, serve

    lost = _scheduled(1)[0]
    config = write_config(tmp_path)
    cfg = load_run_config(config)
    nodes = export_sites(cfg, tmp_path)
    settings = AppSettings(str(config), {}, tmp_path / "federation", join_timeout=5.0)
    with pytest.raises(MissingClients, match=f"round 2: no accepted reply from client\\(s\\) {lost} "):
        serve(InProcessGrid(nodes, apps={_node_of(lost): _silent_from(2)}), settings)
    assert (tmp_path / "federation" / "ckpt.pt").exists() and not (tmp_path / "federation" / "summary.json").exists()
    resumed = serve(InProcessGrid(nodes, run_id=2), settings)
    from incofl.fl.engine.run import train

    assert resumed["state_sha256"] == train(cfg, tmp_path / "simulator")["state_sha256"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "change,why", [(_nan, "holds NaN or Inf"), (_reshaped, "has shape"), (_impostor, "reply for client")]
)
def test_a_malformed_reply_is_refused_and_logged_by_node(tmp_path, caplog, change, why):
    """A reply with a NaN, a wrong shape or another client's id is never averaged in: logged by
    node and client; with allow-missing the run goes on without it and rounds.csv names it."""
    import pandas as pd

    from incofl.federation.inprocess import InProcessGrid
    from incofl.federation.serverapp import AppSettings, serve

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
    from incofl.federation.sitedata import load_site

    config = write_config(tmp_path)
    out = tmp_path / "site1.npz"
    assert run(["federation", "export", "--config", str(config), "--client", "1", "--out", str(out)]) == 0
    data, partition = load_site(out, load_run_config(config), 1)
    assert [len(p) for p in partition.parts].count(0) == TINY["clients"] - 1 == 3
    assert len(partition.parts[1]) == len(data.y_train) and data.num_classes == 10
    argv = ["federation", "export", "--config", str(config), "--client", "4", "--out", str(tmp_path / "x.npz")]
    assert run(argv) == 2 and "--client 4: the config has clients 0..3" in capsys.readouterr().err
