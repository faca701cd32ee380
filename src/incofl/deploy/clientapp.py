"""The Flower ClientApp: one incofl client on a SuperNode.

Node config (`flower-supernode --node-config "client=3 data-path=/site/site3.npz"`): which
client the node is, its data file (`incofl federation export`), which holds only that client's
samples, and optionally `state-dir`, where the client's states are saved after each round it
trains (client.py; default: beside the data file, `site3.state/`). Messages:

- `query.identify`: the server's first message, with the run's config; the node answers
  with its client id (the ServerApp cannot read node config) and the hash of its test split
  (if its file holds one) after checking its data file against the config;
- `train`: one planned round (codec.py); the reply is the client's update;
- `evaluate`: the client's model scored on its held-out share or the test split; the reply is the scores.

Signed both ways (signing.py): where the node's data file carries the server's public key
(`incofl federation export` puts it there), the node acts only on an instruction the server
signed for this run, this node and this type; any other is refused and logged before the node
reads or changes anything (its state, its config, its saved client states). A run's config is
taken once: a second, different one for the same run is refused. With `node-key` in the node
config (the site's private key, `keys/node<client>`, as `incofl federation up` passes it), every
reply is signed with it, bound to the run, the round, the client and the instruction it answers.
"""

from __future__ import annotations

import json
import logging
from functools import cache
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from incofl.config import RunConfig
from incofl.deploy.client import SiteClient
from incofl.deploy.codec import (
    SIGNATURE,
    open_instruction,
    read_job,
    scores_content,
    sign_reply,
    signature_of,
    unsigned,
    update_content,
)
from incofl.deploy.signing import SignatureError, private_key, public_key
from incofl.deploy.sitedata import site_server_key
from incofl.fl.engine.exchange import EvalJob, TrainJob

log = logging.getLogger("incofl.deploy")
STATE = "incofl"  # the node's Context.state record: the run's config
app = ClientApp()
# (run, node, config, data) -> its client, built once; a node's executor (executor.py) keeps it between messages
_sites: dict[tuple[int, int, str, str], SiteClient] = {}


class Refused(RuntimeError):
    """An instruction the node does not act on (module docstring)."""


@cache
def server_key(data_path: str) -> ec.EllipticCurvePublicKey | None:
    """The server's public key the site's data file carries (None: the file has none)."""
    key = site_server_key(data_path)
    return public_key(key, f"data-path {data_path}: server_key") if key else None


@cache
def node_key(path: str) -> ec.EllipticCurvePrivateKey:
    return private_key(Path(path))


def instruction(message: Message, context: Context) -> tuple[RecordDict, int]:
    """The instruction's content and round, if the server signed it for this run and node
    (module docstring); refused (logged, raised) otherwise, before anything is read or changed."""
    kind, node = message.metadata.message_type, context.node_id
    key = server_key(str(context.node_config["data-path"]))
    try:
        if key is None:  # a file exported without the server's key: the node takes the SuperLink's word
            round_ = signature_of(message.content)[0] if SIGNATURE in message.content else 0
            return unsigned(message.content), round_
        return open_instruction(message.content, key, context.run_id, node, kind)
    except SignatureError as err:
        log.warning("node %d: a %s instruction refused: %s", node, kind[:40], err)
        raise Refused(f"node {node} refused a {kind[:40]} instruction: {err}") from None


def answer(message: Message, context: Context, content: RecordDict, round_: int) -> Message:
    """The reply to `message`, signed with the node's key where it has one (module docstring)."""
    path = context.node_config.get("node-key")
    if path:
        meta = message.metadata
        key = node_key(str(path))
        content = sign_reply(
            content, key, context.run_id, round_, node_client(context), meta.message_id, meta.message_type
        )
    return Message(content, reply_to=message)


def node_client(context: Context) -> int:
    return int(context.node_config["client"])


def state_dir(context: Context) -> Path:
    data = Path(str(context.node_config["data-path"]))
    return Path(str(context.node_config.get("state-dir", data.with_suffix(".state"))))


def site(context: Context) -> SiteClient:
    """This node's client for the run (its config from the identify query, kept in Context.state)."""
    config = str(context.state.config_records[STATE]["config"])
    data = str(context.node_config["data-path"])
    key = (context.run_id, context.node_id, config, data)
    if key not in _sites:
        for old in [k for k in _sites if k[0] != context.run_id]:  # a long-lived process keeps the latest run's only
            del _sites[old]
        cfg = RunConfig(**json.loads(config))
        _sites[key] = SiteClient(cfg, node_client(context), data, state_dir(context))
    return _sites[key]


@app.query("identify")
def identify(message: Message, context: Context) -> Message:
    content, signed_round = instruction(message, context)
    config = str(content.config_records["run"]["config"])
    taken = context.state.config_records.get(STATE)
    if taken is not None and str(taken["config"]) != config:  # one config a run: a client's numbers stay its own
        log.warning("node %d: a second config for run %d refused", context.node_id, context.run_id)
        raise Refused(f"node {context.node_id} took run {context.run_id}'s config already; another one refused")
    context.state[STATE] = ConfigRecord({"config": config})
    client = site(context)  # the data file checked against the run's config now, before any round
    reply = ConfigRecord({"client": node_client(context), "test_sha256": client.test_sha256})
    return answer(message, context, RecordDict({"node": reply}), signed_round)


@app.train()
def train(message: Message, context: Context) -> Message:
    content, signed_round = instruction(message, context)
    client = site(context)
    job = read_job(TrainJob, content, client.device)
    update, kept, state = client.train(job)
    return answer(message, context, update_content(update, kept, state), signed_round)


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    content, signed_round = instruction(message, context)
    client = site(context)
    job = read_job(EvalJob, content, client.device)
    scores = client.evaluate(job)
    return answer(message, context, scores_content(job.client, job.splits, scores), signed_round)
