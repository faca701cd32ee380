"""The Flower ClientApp: one incofl client on a SuperNode.

Node config (`flower-supernode --node-config "client=3 data-path=/site/site3.npz"`): which
client the node is, its data file (`incofl federation export`), which holds only that client's
samples, and optionally `state-dir`, where the client's states are saved after each round it
trains (client.py; default: beside the data file, `site3.state/`), and `pretrained`, the file of
the pretrained weights a run may start from (the server's, copied to the site). A site serving its
own data names it by `data-folder` or `data-npz` in place of `data-path` (owndata.py), and the
server's public key by `server-key` (an exported file carries it). Every file a node
reads is one its node config names, a regular file (a FIFO or a device is refused in one line: it
would hang the node's reader): no path comes with the run (its schedule, wire/schedule.py), and a
run that starts from pretrained weights is refused in one line where the
node config names none. A failure reaches the server in the node's terms (`NodeError`): an
incofl refusal's line with the node's files named by their node config keys, else only that the
node failed; never a path or an exception type of the site's (its log has them), signed with the
node's key where it has one (`signed`: an error reply holds no record to sign, so the line carries
its site's signature, and the server stops the run at once on a refusal at identify that its
client's site signed). The node logs an incofl refusal's line as it is (a folder's bad image named
by its path in the folder: owndata.py), anything else with its traceback. Messages:

- `query.identify`: the server's first message, with the run's schedule; the node answers
  with its client id (the ServerApp cannot read node config) and the hash of its test split
  (if its file holds one) after checking its data against the schedule, and, serving its own
  data, its facts (`declared`: samples, held out, classes), which the server takes in place of
  its facts file's row;
- `train`: one planned round (wire/codec.py); the reply is the client's update;
- `evaluate`: the client's model scored on its held-out share or the test split; the reply is the scores.

Signed both ways (wire/signing.py): where the node's data file carries the server's public key
(`incofl federation export` puts it there), the node acts only on an instruction the server
signed for this run, this node and this type; any other is refused and logged before the node
reads or changes anything (its state, its schedule, its saved client states). A run's schedule is
taken once: a second, different one for the same run is refused. With `node-key` in the node
config (the site's private key, `keys/node<client>`, as `incofl federation up` passes it), every
reply is signed with it, bound to the run, the round, the client and the instruction it answers.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from functools import cache, wraps
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from incofl.config import ConfigError
from incofl.deploy import DATA_FOLDER, DATA_PATH
from incofl.deploy.site.client import SiteClient, StaleState
from incofl.deploy.site.owndata import OWN
from incofl.deploy.site.sitedata import site_server_key
from incofl.deploy.wire.codec import (
    SIGNATURE,
    J,
    bundled,
    open_instruction,
    read_job,
    scores_content,
    sign_failure,
    sign_reply,
    signature_of,
    unbundled,
    unsigned,
    update_content,
)
from incofl.deploy.wire.schedule import Schedule
from incofl.deploy.wire.signing import SignatureError, private_key, public_key
from incofl.fl.engine.exchange import EvalJob, TrainJob

log = logging.getLogger("incofl.deploy")
STATE = "incofl"  # the node's Context.state record: the run's schedule (wire/schedule.py)
app = ClientApp()
# (run, node, config, data) -> its client, built once; a node's executor (executor.py) keeps it between messages
_sites: dict[tuple[int, int, str, str], SiteClient] = {}
DATA = (DATA_PATH, *OWN)  # the node config's keys of a node's data: one of them names it
FILES = (*DATA, "state-dir", "node-key", "pretrained", "server-key")  # the node config's keys that name files
PATH = re.compile(r"(?<![\w.-])(?:~|\.{0,2})/[^\s'\",;:)]*")  # a path left in a failure's text (said: <a path>)
Handler = Callable[[Message, Context], Message]
REFUSALS = (ValueError, StaleState)  # incofl's refusals (ConfigError, CodecError, SignatureError too): one line each


class Refused(RuntimeError):
    """An instruction the node does not act on (module docstring)."""


class NodeError(RuntimeError):
    """A message the node failed, as the server is told it: in the node's terms (module docstring)."""


def first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [""])[0]


def in_node_terms(err: Exception, context: Context) -> str:
    """What `err` tells the server: an incofl refusal's first line with the node's files named by
    their node config keys (and any other path by `<a path>`); of anything else, that it failed."""
    if not isinstance(err, REFUSALS):
        return "failed on the node (its log says why)"
    text = first_line(err)
    named = {key: str(context.node_config[key]) for key in FILES if key in context.node_config}
    if any(key in named for key in DATA):
        named["state-dir"] = str(state_dir(context))  # its default too
    for key, path in sorted(named.items(), key=lambda item: -len(item[1])):  # a folder's files before the folder
        text = text.replace(path, f"<{key}>")
    return PATH.sub("<a path>", text)


def told(handler: Handler) -> Handler:
    """`handler`, whose failure is logged on the node (an incofl refusal: its line, its paths as
    they are; anything else with its traceback) and raised as a NodeError in the node's terms (a
    refused instruction as it is), signed (`signed`)."""

    @wraps(handler)
    def handle(message: Message, context: Context) -> Message:
        try:
            return handler(message, context)
        except Refused as err:  # in the node's terms already, and logged
            raise Refused(signed(str(err), message, context)) from None
        except Exception as err:
            kind, refusal = message.metadata.message_type[:40], isinstance(err, REFUSALS)
            why = first_line(err) if refusal else f"{type(err).__name__}: {first_line(err)}"
            log.error("node %d: a %s message failed: %s", context.node_id, kind, why, exc_info=None if refusal else err)
            said = f"node {context.node_id}: {in_node_terms(err, context)}"
            raise NodeError(signed(said, message, context)) from None

    return handle


def signed(text: str, message: Message, context: Context) -> str:
    """A failure's line `text` as the server is told it: signed with the node's key where it has one,
    bound to the run, its client and the message it answers (codec.sign_failure; an error reply
    holds no record to sign), so that the server takes it as the site's word; unsigned where the key
    cannot be read (the server then does not take it so)."""
    if not context.node_config.get("node-key"):
        return text
    try:
        key, client = node_key(node_file(context, "node-key")), node_client(context)
    except Exception:  # noqa: BLE001 (the failure is told all the same)
        return text
    meta = message.metadata
    return sign_failure(text, key, context.run_id, client, meta.message_id, meta.message_type)


def node_file(context: Context, key: str) -> str:
    """The file the node config names under `key`, if it is a regular file (one line otherwise)."""
    path = str(context.node_config[key])
    if not Path(path).is_file():  # missing, a folder, a FIFO or a device: never opened
        raise ConfigError(f"{key} {path}: not a regular file")
    return path


def node_data(context: Context) -> tuple[str, str]:
    """The node config's key of the node's data (exactly one of DATA) and the file or folder it names."""
    named = [key for key in DATA if key in context.node_config]
    if len(named) != 1:
        raise ConfigError(f"node config: name the node's data by one of {', '.join(DATA)} ({len(named)} named)")
    key = named[0]
    if key != DATA_FOLDER:
        return key, node_file(context, key)
    folder = str(context.node_config[key])
    if not Path(folder).is_dir():
        raise ConfigError(f"{key} {folder}: not a folder")
    return key, folder


def server_public(context: Context) -> ec.EllipticCurvePublicKey | None:
    """The server's public key: the one an exported data file carries, or for a site's own data the
    file `server-key` names (OpenSSH: keys/server.pub); None where there is none."""
    key, path = node_data(context)
    if key == DATA_PATH:
        return server_key_at(key, path)
    if "server-key" not in context.node_config:
        return None
    return server_key_at("server-key", node_file(context, "server-key"))


@cache
def server_key_at(key: str, path: str) -> ec.EllipticCurvePublicKey | None:
    """The server's public key in the file the node config names under `key` (None: a data file without one)."""
    raw = site_server_key(path) if key == DATA_PATH else Path(path).read_bytes()
    return public_key(raw, f"{key} {path}: server key") if raw else None


@cache
def node_key(path: str) -> ec.EllipticCurvePrivateKey:
    return private_key(Path(path))


def instruction(message: Message, context: Context) -> tuple[RecordDict, int]:
    """The instruction's content and round, if the server signed it for this run and node
    (module docstring); refused (logged, raised) otherwise, before anything is read or changed."""
    kind, node = message.metadata.message_type, context.node_id
    key = server_public(context)
    try:
        if key is None:  # a file exported without the server's key: the node takes the SuperLink's word
            round_ = signature_of(message.content)[0] if SIGNATURE in message.content else 0
            return unbundled(unsigned(message.content)), round_
        content, round_ = open_instruction(message.content, key, context.run_id, node, kind)
        return unbundled(content), round_
    except SignatureError as err:
        log.warning("node %d: a %s instruction refused: %s", node, kind[:40], err)
        raise Refused(f"node {node} refused a {kind[:40]} instruction: {err}") from None


def answer(message: Message, context: Context, content: RecordDict, round_: int) -> Message:
    """The reply to `message`, its states bundled, signed with the node's key where it has one (module docstring)."""
    content = bundled(content)
    if context.node_config.get("node-key"):
        meta = message.metadata
        key = node_key(node_file(context, "node-key"))
        content = sign_reply(
            content, key, context.run_id, round_, node_client(context), meta.message_id, meta.message_type
        )
    return Message(content, reply_to=message)


def node_client(context: Context) -> int:
    return int(context.node_config["client"])


def state_dir(context: Context) -> Path:
    data = Path(next(str(context.node_config[key]) for key in DATA if key in context.node_config))
    return Path(str(context.node_config.get("state-dir", data.with_suffix(".state"))))


def site(context: Context) -> SiteClient:
    """This node's client for the run (its config from the identify query, kept in Context.state)."""
    config = str(context.state.config_records[STATE]["schedule"])
    kind, data = node_data(context)
    key = (context.run_id, context.node_id, config, data)
    if key not in _sites:
        for old in [k for k in _sites if k[0] != context.run_id]:  # a long-lived process keeps the latest run's only
            del _sites[old]
        told = Schedule.read(config)
        own = "" if kind == DATA_PATH else kind
        _sites[key] = SiteClient(told, node_client(context), data, state_dir(context), pretrained(told, context), own)
    return _sites[key]


def pretrained(told: Schedule, context: Context) -> str | None:
    """The node's own file of the pretrained weights the run starts from (None: it starts from none)."""
    if not told.pretrained:
        return None
    if "pretrained" not in context.node_config:
        raise ConfigError(
            "the run starts from pretrained weights, and this node's config names no file of them: "
            "add pretrained=FILE (the server's weights) to --node-config"
        )
    return node_file(context, "pretrained")


@app.query("identify")
@told
def identify(message: Message, context: Context) -> Message:
    content, signed_round = instruction(message, context)
    config = str(content.config_records["run"]["schedule"])
    taken = context.state.config_records.get(STATE)
    if taken is not None and str(taken["schedule"]) != config:  # one schedule a run: a client's numbers stay its own
        log.warning("node %d: a second schedule for run %d refused", context.node_id, context.run_id)
        raise Refused(f"node {context.node_id} took run {context.run_id}'s schedule already; another one refused")
    context.state[STATE] = ConfigRecord({"schedule": config})
    client = site(context)  # the data file checked against the run's schedule now, before any round
    reply = RecordDict({"node": ConfigRecord({"client": node_client(context), "test_sha256": client.test_sha256})})
    if client.declared is not None:  # its own data: its facts, signed with the reply (the server has no row of them)
        facts = client.declared
        reply["declared"] = ConfigRecord(
            {"samples": facts.samples, "held_out": facts.held_out, "classes": list(facts.classes)}
        )
    return answer(message, context, reply, signed_round)


def job_of(message: Message, context: Context, kind: type[J]) -> tuple[J, SiteClient, int]:
    """The job an instruction carries (once the server's signature on it holds), the site's client,
    and the round the server signed it for."""
    content, signed_round = instruction(message, context)
    client = site(context)
    return read_job(kind, content, client.device), client, signed_round


@app.train()
@told
def train(message: Message, context: Context) -> Message:
    job, client, signed_round = job_of(message, context, TrainJob)
    update, kept, state = client.train(job)
    return answer(message, context, update_content(update, kept, state), signed_round)


@app.evaluate()
@told
def evaluate(message: Message, context: Context) -> Message:
    job, client, signed_round = job_of(message, context, EvalJob)
    scores = client.evaluate(job)
    return answer(message, context, scores_content(job.client, job.splits, scores), signed_round)
