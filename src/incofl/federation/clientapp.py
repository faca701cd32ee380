"""The Flower ClientApp: one incofl client on a SuperNode.

Node config (`flower-supernode --node-config "client=3 data-path=/site/site3.npz"`): which
client the node is and its data file (`incofl federation export`), which holds only that
client's samples. Messages:

- `query.identify`: the server's first message, with the run's config; the node answers
  with its client id (the ServerApp cannot read node config) after checking its data file
  against the config;
- `train`: one planned round (codec.py); the reply is the client's update.

What the client keeps across rounds (client.py's blob of the engine's ClientStore: kept entries,
SCAFFOLD's c_i, MOON's previous models) lives in Flower's `Context.state` of the node, for the run.
"""

from __future__ import annotations

import json

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from incofl.config import RunConfig
from incofl.federation.client import SiteClient
from incofl.federation.codec import read_train, update_content

STATE = "incofl"  # the node's Context.state record: the run's config and the client's state blob
app = ClientApp()
_sites: dict[tuple[int, int, str, str], SiteClient] = {}  # (run, node, config, data) -> its client, built once


def node_client(context: Context) -> int:
    return int(context.node_config["client"])


def site(context: Context) -> SiteClient:
    """This node's client for the run (its config from the identify query, kept in Context.state)."""
    config = str(context.state.config_records[STATE]["config"])
    key = (context.run_id, context.node_id, config, str(context.node_config["data-path"]))
    if key not in _sites:
        cfg = RunConfig(**json.loads(config))
        _sites[key] = SiteClient(cfg, node_client(context), str(context.node_config["data-path"]))
    return _sites[key]


@app.query("identify")
def identify(message: Message, context: Context) -> Message:
    config = str(message.content.config_records["run"]["config"])
    context.state[STATE] = ConfigRecord({"config": config})
    site(context)  # the data file checked against the run's config now, before any round
    return Message(RecordDict({"node": ConfigRecord({"client": node_client(context)})}), reply_to=message)


@app.train()
def train(message: Message, context: Context) -> Message:
    client = site(context)
    round_, plan, start, broadcast = read_train(message.content, client.engine.device)
    record = context.state.config_records[STATE]
    blob = record.get("state")
    update, blob, kept = client.train(round_, plan, start, broadcast, bytes(blob) if blob else None)
    record["state"] = blob
    return Message(update_content(update, kept), reply_to=message)
