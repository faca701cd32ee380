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
"""

from __future__ import annotations

import json
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from incofl.config import RunConfig
from incofl.deploy.client import SiteClient
from incofl.deploy.codec import read_evaluate, read_train, scores_content, update_content

STATE = "incofl"  # the node's Context.state record: the run's config
app = ClientApp()
# (run, node, config, data) -> its client, built once; a node's executor (executor.py) keeps it between messages
_sites: dict[tuple[int, int, str, str], SiteClient] = {}


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
    config = str(message.content.config_records["run"]["config"])
    context.state[STATE] = ConfigRecord({"config": config})
    client = site(context)  # the data file checked against the run's config now, before any round
    reply = ConfigRecord({"client": node_client(context), "test_sha256": client.test_sha256})
    return Message(RecordDict({"node": reply}), reply_to=message)


@app.train()
def train(message: Message, context: Context) -> Message:
    client = site(context)
    round_, job = read_train(message.content, client.engine.device)
    update, kept, state = client.train(round_, job)
    return Message(update_content(update, kept, state), reply_to=message)


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    client = site(context)
    round_, job = read_evaluate(message.content, client.engine.device)
    scores = client.evaluate(round_, job)
    return Message(scores_content(job.client, job.splits, scores), reply_to=message)
