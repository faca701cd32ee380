"""A federation that holds against a site that lies (docs/federation.md, Threat model), shown in
process with the real ServerApp and ClientApp (deploy/flower/directgrid.py) where that shows it: a
reply in another site's name is refused whatever its header says; an instruction the server did
not sign (or signed for another node or run) is refused by the node, which is left as it was; a
second config for a run is refused; a finite update that would overflow the round's sums is
the node's fault, not the run's divergence; the signed federation still equals the simulator.
(What needs Flower's own protocol, a node pushing to a real SuperLink, is in
test_federation_deploy.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
import torch

if not os.environ.get("CI"):  # CI installs the extra: there a missing flwr fails
    pytest.importorskip("flwr", reason="the flower extra is not installed (pip install -e '.[flower]')")

from federation_helpers import scheduled, signed_sites, write_config  # noqa: E402

from incofl.config import load_run_config  # noqa: E402
from incofl.fl.engine.simulator import train  # noqa: E402

pytestmark = pytest.mark.slow


def _signed_run(tmp_path, apps=None, **settings):
    """The tiny run, signed both ways, through the in-process federation; its folder."""
    from federation_helpers import direct_grid

    from incofl.deploy.server.serverapp import AppSettings, serve

    config = write_config(tmp_path, **settings)
    nodes, pems = signed_sites(load_run_config(config), tmp_path)
    grid = direct_grid(nodes, apps=apps, keys=pems)
    out = tmp_path / "federation"
    keys = tmp_path / "keys"
    serve(grid, AppSettings(str(config), {}, out, join_timeout=5.0, allow_missing=True, node_keys=keys))
    return config, nodes, out


def test_a_signed_federation_equals_the_simulator(tmp_path):
    """FedPer with a held-out share: signed training and evaluation messages, and kept layers on the nodes."""
    config, _, out = _signed_run(tmp_path, methods=["FedPer"], holdout=0.2)
    simulated = train(load_run_config(config), tmp_path / "simulator")
    assert json.loads((out / "summary.json").read_text())["state_sha256"] == simulated["state_sha256"]


def test_a_reply_in_another_sites_name_is_refused_whatever_its_header(tmp_path, caplog):
    """Client B's round-1 reply comes from B's node with B's header and B's honest update, but
    signed with site A's key (as a node that pushes in B's name would sign it), and client C's
    unsigned: both refused before anything in them is read; the other clients averaged."""
    from incofl.deploy.flower.directgrid import FIRST_NODE

    a, b, c = 0, 1, 2  # every client trains (ratio 1)
    keys = {FIRST_NODE + b: _signing_as(str(tmp_path / "keys" / f"node{a}")), FIRST_NODE + c: _signing_as(None)}
    _, _, out = _signed_run(tmp_path, apps=keys, rounds=1, ratio=1.0)
    assert f"client {b}: refused: its signature is not client {b}'s site's" in caplog.text
    assert f"client {c}: refused: it is not signed" in caplog.text
    rounds = pd.read_csv(out / "rounds.csv", dtype={"missing": str})
    assert rounds["missing"].tolist() == [f"{b} {c}"]
    assert rounds["samples"].iloc[0] > 0  # the honest clients were averaged


def test_nothing_of_a_reply_is_read_or_counted_before_its_signature_holds(tmp_path, caplog):
    """A node whose key is no site's answers identify with a claim whose every read trips (before:
    the ServerApp read the claim first, and the trip ended the run); B's round reply signed with
    A's key and C's unsigned are not counted in federation.csv (before: their bytes were, read
    before their signature was checked); the honest clients train."""
    from federation_helpers import direct_grid
    from flwr.app import ConfigRecord, Message, RecordDict

    from incofl.deploy.flower.directgrid import FIRST_NODE
    from incofl.deploy.server.serverapp import AppSettings, serve

    class Tripwire(ConfigRecord):
        def __getitem__(self, key: str):
            raise AssertionError(f"the claim's {key} read before its signature was checked")

    def stranger(message, context):
        return Message(RecordDict({"node": Tripwire({"client": 0, "test_sha256": ""})}), reply_to=message)

    a, b, c = 0, 1, 2
    config = write_config(tmp_path, rounds=1, ratio=1.0)
    nodes, pems = signed_sites(load_run_config(config), tmp_path)
    strange = FIRST_NODE + len(nodes)
    apps = {
        strange: stranger,
        FIRST_NODE + b: _signing_as(str(tmp_path / "keys" / f"node{a}")),
        FIRST_NODE + c: _signing_as(None),
    }
    grid = direct_grid([*nodes, nodes[a]], apps=apps, keys=pems)  # the stranger's key: none of the sites'
    out = tmp_path / "federation"
    serve(grid, AppSettings(str(config), {}, out, join_timeout=5.0, allow_missing=True, node_keys=tmp_path / "keys"))
    assert f"identify: node {strange}: refused: node {strange}'s key is no site's" in caplog.text
    counted = pd.read_csv(out / "federation.csv")
    assert sorted(counted["client"]) == [a, 3] and (counted["up_bytes"] > 0).all()
    assert pd.read_csv(out / "rounds.csv", dtype={"missing": str})["missing"].tolist() == [f"{b} {c}"]


def _signing_as(key: str | None):
    """incofl's ClientApp, whose train replies are signed with the node key at `key` (None: unsigned)."""
    from incofl.deploy.site.clientapp import app

    def node(message, context):
        if message.metadata.message_type == "train":  # it joined as itself
            config = {k: v for k, v in context.node_config.items() if k != "node-key"}
            context.node_config = config if key is None else {**config, "node-key": key}
        return app(message, context)

    return node


def _node(tmp_path):
    """Client 1's node of a signed federation: its context, and a way to make instructions for it."""
    from federation_helpers import direct_grid
    from flwr.app import Context, RecordDict

    direct_grid([], run_id=7)  # this process takes a ServerApp task's identity: Flower's messages read it
    config = write_config(tmp_path)
    nodes, _ = signed_sites(load_run_config(config), tmp_path)
    return config, Context(7, 102, dict(nodes[1]), RecordDict(), {})


def _instruction(content, kind: str, node: int = 102, run: int = 7, key=None, signed_as: str = ""):
    """A `kind` message for `node`, signed with `key` (None: unsigned) as a `signed_as` (default:
    `kind`) for `node` in `run`, with an id as the SuperLink gives one."""
    from uuid import uuid4

    from flwr.app import Message

    from incofl.deploy.wire.codec import sign_instruction

    if key is not None:
        content = sign_instruction(content, key, run, node, signed_as or kind, 0)
    message = Message(content, node, kind)
    message.metadata.__dict__["_message_id"] = uuid4().hex
    return message


def test_an_instruction_the_server_did_not_sign_is_refused_and_the_node_left_as_it_was(tmp_path, caplog):
    """Identify (with another config) and train from another site (unsigned, or signed with that
    site's key), or the server's own signature replayed for another node, run or type: refused and
    logged, the node's state untouched and no client built or trained; the server's own identify
    taken, and a second config for the same run refused."""
    from flwr.app import ConfigRecord, RecordDict

    from incofl.deploy.site import clientapp
    from incofl.deploy.wire.schedule import schedule_of
    from incofl.deploy.wire.signing import private_key

    clientapp._sites.clear()  # the clients other tests' nodes built in this process
    config, context = _node(tmp_path)
    cfg = load_run_config(config)
    server, other = private_key(tmp_path / "keys" / "server"), private_key(tmp_path / "keys" / "node0")

    def identify(**settings):
        changed = cfg.model_copy(update=settings)
        return RecordDict({"run": ConfigRecord({"schedule": schedule_of(changed)})})

    forged = [
        _instruction(identify(lr=0.5), "query.identify"),
        _instruction(identify(lr=0.5), "query.identify", key=other),
        _instruction(identify(lr=0.5), "query.identify", node=101, key=server),
        _instruction(identify(lr=0.5), "query.identify", run=8, key=server),
        _instruction(RecordDict({"round": ConfigRecord({"round": 0})}), "train", key=other),
        _instruction(identify(), "train", key=server, signed_as="query.identify"),
    ]
    for message in forged:
        with pytest.raises(clientapp.Refused, match="refused a (query.identify|train) instruction"):
            clientapp.app(message, context)
    assert not context.state.config_records and not clientapp._sites  # nothing taken, nothing built
    assert caplog.text.count("instruction refused") == len(forged)
    signed = _instruction(identify(), "query.identify", key=server)
    assert clientapp.app(signed, context).content.config_records["node"]["client"] == 1
    with pytest.raises(clientapp.Refused, match="took run 7's schedule already"):
        clientapp.app(_instruction(identify(lr=0.5), "query.identify", key=server), context)
    assert json.loads(context.state.config_records["incofl"]["schedule"])["config"]["lr"] == cfg.lr
    assert len(clientapp._sites) == 1


def test_a_finite_update_that_would_overflow_the_rounds_sums_is_the_nodes_fault(tmp_path, caplog):
    """A delta of +-3e38 is finite (and its float32 sum overflows before any check sees a NaN): it
    is refused by node and client, not averaged into a run that then reads as diverged."""
    from incofl.deploy.flower.directgrid import FIRST_NODE
    from incofl.deploy.site.clientapp import answer, app
    from incofl.deploy.wire.codec import from_arrays, to_arrays, unbundled, unsigned

    bad = scheduled(0)[0]

    def huge(message, context):
        reply = app(message, context)
        if message.metadata.message_type != "train":
            return reply
        content = unbundled(unsigned(reply.content))
        delta = from_arrays(content.array_records["delta"])
        values = next(iter(delta.values()))
        values[...] = 3e38
        values.view(-1)[0] = -3e38
        content["delta"] = to_arrays(delta)
        return answer(message, context, content, int(message.metadata.group_id))  # signed: the site's own lie

    _, _, out = _signed_run(tmp_path, apps={FIRST_NODE + bad: huge}, rounds=1)
    assert f"client {bad}: refused: delta " in caplog.text and "round's sums would overflow" in caplog.text
    rounds = pd.read_csv(out / "rounds.csv", dtype={"missing": str})
    assert rounds["missing"].tolist() == [str(bad)]
    summary = json.loads((out / "summary.json").read_text())
    assert not summary.get("diverged") and summary["final_acc"] > 0


def test_a_node_reads_only_the_files_its_own_config_names(tmp_path):
    """A signed config whose `pretrained` names a file of the site's (its data file), or one that
    is not there, made the node torch.load it and answer with the exception's type and the path
    (an oracle on the site's files; a FIFO there hung its executor). Now the node reads only what
    its node config names: both runs are refused alike, in one line that names no path and no
    exception type; its own `pretrained` file is read (a FIFO there refused in one line, at once),
    whatever path the server's config holds; and a failure's reply names its files by their node
    config keys."""
    import threading

    from flwr.app import ConfigRecord, Context, RecordDict

    from incofl.deploy.site import clientapp
    from incofl.deploy.wire.schedule import schedule_of
    from incofl.deploy.wire.signing import private_key
    from incofl.models.family import build_model

    config, context = _node(tmp_path)
    vit = load_run_config(config).model_copy(update={"models": ["vit_d8"], "model_scale": 1.0})
    node_config, server = dict(context.node_config), private_key(tmp_path / "keys" / "server")

    def answer(servers: str, **own: str):
        """The node's identify reply, or the failure it reports, for a run that starts from the
        server's pretrained weights at `servers`, with `own` in its node config."""
        clientapp._sites.clear()
        node = Context(7, 102, {**node_config, **own}, RecordDict(), {})
        run = schedule_of(vit.model_copy(update={"pretrained": servers}))
        message = _instruction(RecordDict({"run": ConfigRecord({"schedule": run})}), "query.identify", key=server)
        got: list = []
        done = threading.Thread(target=lambda: got.append(_reply_or_error(message, node)))
        done.daemon = True  # before: a FIFO's torch.load never returns
        done.start()
        done.join(timeout=60)
        assert got, "the node hung"
        return got[0]

    site_file, missing, fifo = str(node_config["data-path"]), str(tmp_path / "no-such-weights.pt"), tmp_path / "fifo"
    os.mkfifo(fifo)
    refused = [answer(site_file), answer(missing), answer(str(fifo))]
    assert len(set(refused)) == 1 and "names no file of them: add pretrained=FILE" in refused[0]
    assert "/" not in refused[0] and "Error" not in refused[0]
    assert answer(missing, pretrained=str(fifo)) == "node 102: pretrained <pretrained>: not a regular file"

    weights = build_model("vit_d8", 10, 3, image_size=224).state_dict()
    torch.save(weights, tmp_path / "vit.pt")
    assert answer(missing, pretrained=str(tmp_path / "vit.pt")) == 1  # the node's file, not the server's path
    [site] = clientapp._sites.values()
    assert site.pretrained == str(tmp_path / "vit.pt")  # the node's own file; its settings name no path
    assert not {"pretrained", "data_dir", "cache_dir"} & set(type(site.settings).model_fields)
    model = site.clients.layout.models[0].state_dict()
    assert torch.equal(model["patch_embed.proj.weight"], weights["patch_embed.proj.weight"])

    other = answer(missing, **{"data-path": str(tmp_path / "site0.npz"), "pretrained": str(tmp_path / "vit.pt")})
    assert other == "node 102: data-path <data-path>: holds client 0's data, this node is client 1"


def _reply_or_error(message, context):
    """The client incofl's ClientApp's reply claims, or what its failure tells the server (Flower's
    error reply carries the exception's type and text: here its text, where the type is incofl's
    NodeError, without the site's signature at its end)."""
    from incofl.deploy.site import clientapp
    from incofl.deploy.wire.codec import failure_text

    try:
        return clientapp.app(message, context).content.config_records["node"]["client"]
    except Exception as err:  # noqa: BLE001 (what the server is told)
        return failure_text(str(err))[0] if type(err).__name__ == "NodeError" else f"{type(err).__name__}: {err}"


def test_a_nodes_refusal_is_its_sites_word_only_signed_by_its_site_for_the_message_it_answers(tmp_path):
    """An error reply holds one line: the site's signature at its end (clientapp.signed) binds it
    to the run, the client and the message it answers; the server takes it only so signed by the
    site whose key the SuperLink holds for the node."""
    from federation_helpers import direct_grid
    from flwr.app import Error, Message, RecordDict

    from incofl.deploy.flower.directgrid import FIRST_NODE
    from incofl.deploy.server.transport import Identity
    from incofl.deploy.wire.codec import failure_text, sign_failure
    from incofl.deploy.wire.signing import SignatureError, private_key

    nodes, pems = signed_sites(load_run_config(write_config(tmp_path)), tmp_path)
    grid = direct_grid(nodes, keys=pems, run_id=7)
    identity = Identity.load(grid, tmp_path / "keys", tmp_path / "keys" / "server", len(nodes), 7)
    site0, site1 = (private_key(tmp_path / "keys" / f"node{c}") for c in (0, 1))
    line = "node 101: data-folder <data-folder>: not data of this run (0/00000.png: image file is truncated)"

    def refusal(text: str, node: int = FIRST_NODE) -> Message:
        asked = Message(RecordDict(), node, "query.identify")
        asked.metadata.__dict__["_message_id"] = "m1"
        return Message(Error(2, f"<class 'incofl.deploy.site.clientapp.NodeError'>:<'{text}'>"), reply_to=asked)

    signed = sign_failure(line, site0, 7, 0, "m1", "query.identify")
    assert failure_text(signed) == (line, signed.rpartition(" [signed ")[2][:-1])
    assert identity.failure(refusal(signed), 0, "m1", "query.identify") == line
    for text, client, answers, why in [
        (signed, 0, "m2", "not client 0's site's"),  # another message's
        (signed, 1, "m1", "not client 1's site's"),  # checked as another client's
        (sign_failure(line, site1, 7, 0, "m1", "query.identify"), 0, "m1", "not client 0's site's"),  # another key
        (sign_failure(line, site0, 8, 0, "m1", "query.identify"), 0, "m1", "not client 0's site's"),  # another run
        (signed.replace("truncated", "fine"), 0, "m1", "not client 0's site's"),
        (line, 0, "m1", "it is not signed"),
        (line + " [signed !!]", 0, "m1", "malformed"),
        (signed, None, "m1", "key is no site's"),
    ]:
        with pytest.raises(SignatureError, match=why):
            identity.failure(refusal(text), client, answers, "query.identify")


def test_a_refusal_from_a_node_that_is_not_the_clients_site_does_not_stop_the_run(tmp_path, caplog):
    """A node whose key is no site's claims client 0 and refuses the run, its line signed with its
    own key as client 0's: logged, not taken; client 0's own node joins and the run trains."""
    from federation_helpers import direct_grid

    from incofl.deploy.flower.directgrid import FIRST_NODE
    from incofl.deploy.server.serverapp import AppSettings, serve
    from incofl.deploy.wire.credentials import node_key

    config = write_config(tmp_path, rounds=1)
    sites, pems = signed_sites(load_run_config(config), tmp_path)
    own = node_key(tmp_path / "impostor", 0)
    impostor = {**sites[0], "data-path": str(tmp_path / "nowhere.npz"), "node-key": str(own[0])}
    keys = {FIRST_NODE: _pem(own[1])} | {node + 1: key for node, key in pems.items()}
    grid = direct_grid([impostor, *sites], keys=keys)
    out = tmp_path / "federation"
    serve(grid, AppSettings(str(config), {}, out, join_timeout=30.0, node_keys=tmp_path / "keys"))
    said = f"identify: node {FIRST_NODE}: the node's ClientApp failed: node {FIRST_NODE}: data-path <data-path>: "
    assert f"{said}not a regular file (not its site's word: node {FIRST_NODE}'s key is no site's)" in caplog.text
    assert json.loads((out / "federation.json").read_text())["nodes"]["0"] == FIRST_NODE + 1
    assert (out / "metrics.csv").exists()


def _pem(public: Path) -> bytes:
    """An OpenSSH public key file as a SuperLink holds the key (PEM)."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_ssh_public_key(public.read_bytes())
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
