"""The Flower ServerApp: an incofl run whose clients are SuperNodes.

Run config (the app's pyproject.toml, or `flwr run ... --run-config`): `config` (the run's
YAML, read as `incofl train --config` reads it), `set` (its `--set` overrides, space-separated
key=value), `out` (the run directory: metrics.csv, rounds.csv, summary.json, ckpt.pt, as
`incofl train` writes them, and federation.csv: the bytes each round's training and evaluation
sent to and received from each client), `round-timeout` (seconds a round waits for its replies),
`join-timeout` (seconds the run waits for every client's node to join), `allow-missing` (go
on without clients that did not reply in time or whose reply was refused; rounds.csv names them)
and `node-keys` (a folder of each site's public key, `node<client>.pub` in OpenSSH format, as
`incofl federation up` writes them: each client is then bound to its site's key, below).

The run: the config is validated and refused if it cannot run federated (server.py), the
server's engine is built as `incofl train` builds it (the data set's test split is scored on
the server), every node is asked which client it is (`query.identify`, with the run's config),
then incofl's `Run` drives the rounds with the strategy as its train stage: incofl's seeded
schedule and planner choose the clients, `configure_train` sends each its plan and start
weights, `aggregate_train` reads and checks each reply as it arrives (pulled every `POLL`
seconds, not Flower's `send_and_receive`, which pulls every 3 s), and the engine aggregates,
evaluates and checkpoints exactly as in the simulator. Client models the evaluation scores on
the clients' nodes (server.py) go out through `configure_evaluate` and come back through
`aggregate_evaluate`. No reply can stop the server: one that fails any check, or raises
anything while it is read, is refused in one line naming its node and client. Restarted with
the same `out`, the run resumes from its last checkpoint (and each node from its client's state
at that round: client.py).

Identity: with `node-keys`, a node's claim to be client C at identify is accepted only if the
key the SuperLink holds for it (`grid.get_nodes()`, node authentication) is site C's; another
is refused and logged, and the run waits for the rightful node. Every reply must come from the
node its message went to, whose key is its client's. Without `node-keys`, the start-up line
says that any node may claim any client.

Signatures (signing.py): every instruction is signed with the server's key (`server-key`, by
default `<node-keys>/server`, made by `incofl federation export`), which the nodes check against
the public half their data files carry; with `node-keys`, every reply must be signed with its
client's site key (`node<client>.pub`) over its content and what it answers (the run, the round,
the client, the id and type of the message it answers), checked before anything in it is read:
a reply in another site's name is refused whatever header it carries. Replies are pulled
through a guarded inbox (inbox.py): one that does not decode is its node's fault, a message
the server did not ask for is ignored, and no reply holds a round past its deadline.
"""

from __future__ import annotations

import json
import logging
import shlex
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy

from incofl.atomic import atomic_path, write_json
from incofl.config import ConfigError, RunConfig, load_run_config, parse_overrides
from incofl.data.sources import dataset_for
from incofl.deploy.codec import (
    CodecError,
    evaluate_content,
    message_bytes,
    open_reply,
    read_scores,
    read_update,
    sign_instruction,
    train_content,
    unsigned,
)
from incofl.deploy.inbox import Inbox, Pulled
from incofl.deploy.server import (
    EvalJob,
    EvalReply,
    ExpectedScores,
    ExpectedUpdate,
    FederatedEngine,
    RemoteTrainer,
    Reply,
    TrainJob,
    check_federated,
    check_hashes,
    check_scores,
    check_update,
    tested_on_nodes,
)
from incofl.deploy.signing import SERVER, SignatureError, private_key, public_key
from incofl.deploy.sitedata import test_sha256
from incofl.fl.engine.run import Run, build_engine
from incofl.fl.engine.rundir import claimed

log = logging.getLogger("incofl.deploy")
app = ServerApp()
POLL = 0.05  # seconds between pulls of the replies still awaited (a reply waits on the SuperLink no longer)


@dataclass(frozen=True)
class AppSettings:
    """The app's run config (module docstring)."""

    config: str | None  # None: the built-in defaults, as `incofl train` without --config
    overrides: dict[str, Any]
    out: Path
    round_timeout: float = 600.0
    join_timeout: float = 120.0
    allow_missing: bool = False
    node_keys: Path | None = None
    server_key: Path | None = None  # None: `node-keys`' `server`, if node-keys is set

    @classmethod
    def of(cls, run_config: dict[str, Any]) -> AppSettings:
        if not run_config.get("out"):
            raise ConfigError("run config: out: set the run directory")
        overrides = parse_overrides(shlex.split(str(run_config.get("set", ""))))
        keys, server = str(run_config.get("node-keys", "")), str(run_config.get("server-key", ""))
        if not keys and run_config.get("insecure") is not True:  # binding clients to keys is the default
            raise ConfigError(
                "run config: node-keys: set the folder of the sites' public keys (nodeK.pub for client K), "
                "or insecure=true to let any node claim any client"
            )
        return cls(
            str(run_config.get("config", "")) or None,
            overrides,
            Path(str(run_config["out"])),
            float(run_config.get("round-timeout", 600.0)),
            float(run_config.get("join-timeout", 120.0)),
            bool(run_config.get("allow-missing", False)),
            Path(keys) if keys else None,
            Path(server) if server else None,
        )

    def server_key_path(self) -> Path | None:
        """The server's private key: `server-key`, else `<node-keys>/server`; None without either."""
        return self.server_key or (self.node_keys / SERVER if self.node_keys else None)


def spki(key: bytes, ssh: bool = False) -> bytes:
    """A public key (PEM, as the SuperLink holds it; `ssh`: OpenSSH, as a site's file holds it) in
    one form to compare (DER SubjectPublicKeyInfo); b'' if it is not one."""
    from cryptography.hazmat.primitives import serialization

    try:
        public = serialization.load_ssh_public_key(key) if ssh else serialization.load_pem_public_key(key)
    except (ValueError, TypeError):
        return b""
    return public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


@dataclass
class Identity:
    """Which node may speak for which client: with site keys (client -> key), only the node whose
    key the SuperLink holds is that site's, and only a reply signed with that key is its; without,
    any node (module docstring). The server's key signs every instruction of run `run`."""

    grid: Grid
    keys: dict[int, bytes] | None = None
    node_keys: dict[int, bytes] = field(default_factory=dict)  # node -> its key (the SuperLink's)
    run: int = 0
    server: Any = None  # the server's private key (None: instructions go unsigned)

    @classmethod
    def load(cls, grid: Grid, settings: AppSettings, clients: int, run: int) -> Identity:
        """The sites' keys in node-keys (`node<client>.pub`), each client's, and the server's
        private key; refused in one line naming a missing or unreadable file."""
        server_path, folder = settings.server_key_path(), settings.node_keys
        if server_path is not None and not server_path.is_file():
            raise ConfigError(f"server-key: no {server_path}; make it with incofl federation export")
        server = private_key(server_path) if server_path is not None else None
        if server is None:
            log.warning("no server key: the nodes cannot tell this server's messages from another's")
        if folder is None:
            log.warning("no node-keys: any node may claim any client (each client is bound to its node's word)")
            return cls(grid, run=run, server=server)
        keys = {}
        for client in range(clients):
            path = folder / f"node{client}.pub"
            key = spki(path.read_bytes(), ssh=True) if path.is_file() else b""
            if not key:
                raise ConfigError(f"node-keys: {path}: no OpenSSH public key of client {client}'s site")
            keys[client] = key
        log.info("node keys from %s: each client is bound to its site's key", folder)
        return cls(grid, keys, run=run, server=server)

    def instruction(self, content: RecordDict, node: int, kind: str, round_: int, group: str = "") -> Message:
        """A message to `node`, signed with the server's key where there is one."""
        if self.server is not None:
            content = sign_instruction(RecordDict(dict(content.items())), self.server, self.run, node, kind, round_)
        return Message(content, node, kind, group_id=group)

    def opened(self, reply: Message, client: int, answers: str, kind: str, round_: int) -> RecordDict:
        """A reply's content, with site keys only if client `client`'s site signed it as the answer
        to `answers` (SignatureError otherwise), before anything in it is read."""
        if self.keys is None:
            return unsigned(reply.content)
        public = public_key(self.keys[client], f"client {client}'s key")
        return open_reply(reply.content, public, self.run, round_, client, answers, kind)

    def key(self, node: int) -> bytes:
        """The key the SuperLink holds for `node` (b'' if none)."""
        if node not in self.node_keys:
            self.node_keys = {info.node_id: spki(bytes(info.public_key)) for info in self.grid.get_nodes()}
        return self.node_keys.get(node, b"")

    def refusal(self, node: int, client: int) -> str:
        """Why `node` may not speak for `client` ('' if it may)."""
        if self.keys is not None and self.key(node) != self.keys.get(client):
            return f"node {node}'s key is not client {client}'s site's"
        return ""


def pulled(inbox: Inbox, waiting: Iterable[str], timeout: float) -> Iterator[Pulled]:
    """The replies to the messages `waiting` (their ids), each as it arrives (or why it cannot be
    read: inbox.py): pulled every POLL seconds until every one came or `timeout` passed, however
    long a reply takes to upload."""
    waiting, deadline = set(waiting), time.monotonic() + timeout
    while waiting:
        for got in inbox.pull(waiting, deadline):
            waiting.discard(got.answers)
            yield got
        if not waiting or time.monotonic() >= deadline:
            inbox.forget(waiting)
            return
        time.sleep(POLL)


IDENTIFY = "query.identify"


def identify(inbox: Inbox, cfg: RunConfig, timeout: float, test: dict[int, str], identity: Identity) -> dict[int, int]:
    """client -> node: every node that joins within `timeout` is asked which client it is (with
    the run's config, which it checks its data against); a claim `identity` refuses, or a reply
    that is not a claim, is logged and left out (the rightful node may still come). Stops with one
    line naming the clients whose node did not join, the node that failed its check, a second
    claim of one client, or a client whose node lacks the test split `test` asks of it (client -> its hash)."""
    content = RecordDict({"run": ConfigRecord({"config": json.dumps(cfg.model_dump())})})
    nodes: dict[int, int] = {}
    asked: set[int] = set()
    pending: dict[str, int] = {}  # message -> node
    refusals: dict[int, str] = {}  # node -> why it refused the run (with site keys: no error stops it)
    deadline = time.monotonic() + timeout
    while len(nodes) < cfg.clients and time.monotonic() < deadline:
        new = [node for node in identity.grid.get_node_ids() if node not in asked]
        asked.update(new)
        queries = [identity.instruction(content, node, IDENTIFY, 0) for node in new]
        pending |= {i: queries[k].metadata.dst_node_id for i, k in inbox.push(queries).items()}
        for got in inbox.pull(pending, deadline):
            node = pending.pop(got.answers)
            if got.message is None:
                log.warning("identify: node %d: refused: %s", node, got.why)
            else:
                claim(cfg, node, got, nodes, test, identity, refusals)
        if len(nodes) < cfg.clients:
            time.sleep(POLL)
    inbox.forget(pending)
    missing = sorted(set(range(cfg.clients)) - set(nodes))
    if missing:
        why = "".join(f"; node {node} refused the run: {reason}" for node, reason in refusals.items())
        raise ConfigError(
            f"no node joined for client(s) {', '.join(map(str, missing))} within {timeout:.0f} s (join-timeout){why}"
        )
    return nodes


def claim(
    cfg: RunConfig,
    node: int,
    got: Pulled,
    nodes: dict[int, int],
    test: dict[int, str],
    identity: Identity,
    refusals: dict[int, str],
) -> None:
    """A node's answer to identify: its client added to `nodes`, or refused (module docstring of
    identify). With site keys an error reply (which no one signs) cannot stop the run: it is
    logged, and named if the run ends for want of that client."""
    reply = got.message
    assert reply is not None
    if reply.has_error():
        if identity.keys is not None:  # unsigned: perhaps not the node's own
            log.warning("identify: node %d: %s", node, unanswered(node, reply))
            refusals[node] = unanswered(node, reply)
            return
        raise ConfigError(f"node {node} refused the run: {reply.error.reason}")
    try:
        answer = reply.content.config_records["node"]
        client, tested = answer["client"], answer["test_sha256"]
        if type(client) is not int or not 0 <= client < cfg.clients or type(tested) is not str:
            raise ValueError(f"client {str(client)[:20]}: the run has clients 0..{cfg.clients - 1}")
    except (KeyError, TypeError, ValueError) as err:
        log.warning("identify: node %d: refused: not a claim of a client (%s)", node, str(err)[:120])
        return
    why = identity.refusal(node, client)
    try:
        identity.opened(reply, client, got.answers, IDENTIFY, 0)
    except SignatureError as err:
        why = why or str(err)
    if why:
        log.warning("identify: node %d says it is client %d: refused: %s", node, client, why)
        return
    if client in nodes:
        raise ConfigError(f"node {node} says it is client {client}, as node {nodes[client]} does")
    if client in test and tested != test[client]:
        raise ConfigError(
            f"node {node} (client {client}): its data file lacks the test split (or holds another), on "
            f"which this run scores client {client}'s model with what it keeps ({cfg.method}"
            f"{', bn_stats: local' if cfg.bn_stats == 'local' else ''}); export it with --test"
        )
    nodes[client] = node


def unanswered(node: int, reply: Message | None) -> str:
    """Why a node's reply holds no content to decode ('' if it does): none came (in one line,
    the last of a failed ClientApp's traceback)."""
    if reply is None:
        return "no reply within round-timeout (node gone?)" if node >= 0 else "no node"
    if reply.has_error():
        lines = [line.strip() for line in reply.error.reason.strip().splitlines() if line.strip()]
        return f"the node's ClientApp failed: {lines[-1][:300] if lines else 'no reason given'}"
    return ""


def one_line(err: Exception) -> str:
    """An exception raised while a reply was read, in one short line."""
    text = str(err).strip().splitlines()
    what = text[0][:300] if text else ""
    return what if isinstance(err, CodecError) else f"unreadable ({type(err).__name__}: {what})"


def accept_update(reply: Message, expected: ExpectedUpdate, content: RecordDict | None = None) -> Reply:
    """A training reply read and checked against what the server accepts of its client (never
    raises: what fails anything is refused, with why in `error`); `content`: its content, its
    signature checked and left out (default: the reply's own)."""
    node = reply.metadata.src_node_id
    try:
        update, kept, state = read_update(reply.content if content is None else content, expected, "cpu")
        bad_hash = check_hashes(kept, state)
        why = bad_hash or check_update(expected, update)
    except Exception as err:  # noqa: BLE001 (no reply can stop the server)
        return Reply(error=one_line(err), node=node)
    if why:  # its state hash kept all the same (the node saved that state): unless malformed
        return Reply(error=why, state_sha256="" if bad_hash else state, node=node)
    return Reply(update, kept, state, node=node)


def accept_scores(
    reply: Message, job: EvalJob, expected: ExpectedScores, content: RecordDict | None = None
) -> EvalReply:
    """An evaluation reply read and checked (never raises, as accept_update)."""
    node = reply.metadata.src_node_id
    try:
        client, scores = read_scores(reply.content if content is None else content, job.splits, expected)
        why = check_scores(expected, client, scores)
    except Exception as err:  # noqa: BLE001 (no reply can stop the server)
        return EvalReply(error=one_line(err), node=node)
    return EvalReply(client, scores, error=why, node=node)


@dataclass
class IncoflStrategy(Strategy):
    """incofl's round as a Flower strategy (server.Exchange): one message per planned client
    (its own plan and start weights, so clients may hold different architectures), each reply
    read and checked as it arrives (`aggregate_train`: from the node the message went to, whose
    key is its client's) and handed to the engine; the same for the client models an evaluation
    scores on their nodes."""

    inbox: Inbox
    nodes: dict[int, int]  # client -> node
    timeout: float
    out: Path
    identity: Identity
    jobs: list[TrainJob] = field(default_factory=list)
    expected: list[ExpectedUpdate] = field(default_factory=list)
    eval_jobs: list[EvalJob] = field(default_factory=list)
    eval_expected: list[ExpectedScores] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)  # the job of each message configured
    waiting: dict[str, int] = field(default_factory=dict)  # message id -> its job
    arrived: list[tuple[int, Any]] = field(default_factory=list)  # the last replies read: (job, Reply or EvalReply)
    traffic: list[dict[str, int]] = field(default_factory=list)
    down: dict[int, int] = field(default_factory=dict)  # client -> bytes sent it by the last exchange

    def train(self, round_: int, jobs: list[TrainJob], expected: list[ExpectedUpdate]) -> Iterator[tuple[int, Reply]]:
        """A round's training: configure and push; each reply read and checked as it arrives
        (server.Exchange), then the jobs without one."""
        self.jobs, self.expected = jobs, expected
        messages = list(self.configure_train(round_ + 1, ArrayRecord(), ConfigRecord(), self.identity.grid))
        none = lambda i: self.unanswered(jobs[i].plan.client, Reply)  # noqa: E731
        read = lambda reply: self.aggregate_train(round_ + 1, [reply])  # noqa: E731
        yield from self.exchange(messages, read, len(jobs), none, Reply)

    def evaluate(self, round_: int, jobs: list[EvalJob], expected: list[ExpectedScores]) -> list[EvalReply]:
        """An evaluation's client models: configure, push, and each reply read as it arrives."""
        self.eval_jobs, self.eval_expected = jobs, expected
        messages = list(self.configure_evaluate(round_, ArrayRecord(), ConfigRecord(), self.identity.grid))
        none = lambda i: self.unanswered(jobs[i].client, EvalReply)  # noqa: E731
        read = lambda reply: self.aggregate_evaluate(round_, [reply])  # noqa: E731
        scores = dict(self.exchange(messages, read, len(jobs), none, EvalReply))
        return [scores[i] for i in range(len(jobs))]

    def unanswered(self, client: int, kind: type[Reply] | type[EvalReply]) -> Any:
        """A job's reply when none came (or its client has no node)."""
        node = self.nodes.get(client, -1)
        return kind(error=unanswered(node, None), node=node)

    def exchange(
        self,
        messages: list[Message],
        read: Callable[[Message], Any],
        jobs: int,
        none: Callable[[int], Any],
        kind: type[Reply] | type[EvalReply],
    ) -> Iterator[tuple[int, Any]]:
        """Push `messages`, then (job index, what `read` made of it) for each reply as it arrives
        (`read` leaves it in `arrived`; one that cannot be read: refused as a `kind`), then
        (i, none(i)) for each of the `jobs` without one."""
        self.waiting = {message_id: self.sent[i] for message_id, i in self.inbox.push(messages).items()}
        answered = set()
        for got in pulled(self.inbox, self.waiting, self.timeout):
            self.arrived = []
            if got.message is None:  # it does not decode, or never arrived whole: its node's fault
                i = self.waiting[got.answers]
                self.arrived.append((i, kind(error=got.why, node=got.node)))
            else:
                read(got.message)
            for i, got_reply in self.arrived:
                answered.add(i)
                yield i, got_reply
        self.write_traffic()
        yield from ((i, none(i)) for i in range(jobs) if i not in answered)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        messages, self.sent = [], []
        for i, job in enumerate(self.jobs):
            client = job.plan.client
            if client in self.nodes:
                content = train_content(server_round - 1, job)
                self.down[client] = message_bytes(content)
                node, group = self.nodes[client], str(server_round)
                messages.append(self.identity.instruction(content, node, "train", server_round, group))
                self.sent.append(i)
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[None, MetricRecord]:
        """Each reply to this round's messages read and checked against its client's expected
        update (or why it is refused); the engine averages those accepted (server.RemoteTrainer).
        Bytes each way go to federation.csv."""
        for reply in replies:
            i = self.waiting.get(reply.metadata.reply_to_message_id)
            if i is None:
                continue
            client, node = self.jobs[i].plan.client, self.nodes[self.jobs[i].plan.client]
            content, why = self.opened(client, reply, "train", server_round)
            accepted = accept_update(reply, self.expected[i], content) if content is not None else None
            self.arrived.append((i, accepted or Reply(error=why, node=node)))
            self.count("train", server_round, client, reply)
        return None, MetricRecord({"replies": len(self.arrived)})

    def opened(self, client: int, reply: Message, kind: str, server_round: int) -> tuple[RecordDict | None, str]:
        """A reply's content if it can be its client's, else (None, why): it must come from the
        node its message went to, whose key is the client's, hold content, and (with site keys)
        be signed by the client's site as the answer to this message (module docstring)."""
        node, src = self.nodes[client], reply.metadata.src_node_id
        if src != node:
            return None, f"a reply from node {src} to a message sent to node {node}"
        why = self.identity.refusal(src, client) or unanswered(node, reply)
        if why:
            return None, why
        answers = reply.metadata.reply_to_message_id
        try:
            return self.identity.opened(reply, client, answers, kind, server_round), ""
        except SignatureError as err:
            return None, str(err)

    def count(self, stage: str, server_round: int, client: int, reply: Message) -> None:
        """A message's bytes each way, for federation.csv (a reply without content: none)."""
        if reply.has_content():
            down, up = self.down[client], message_bytes(reply.content)
            self.traffic.append(
                {
                    "round": server_round,
                    "stage": stage,
                    "client": client,
                    "node": self.nodes[client],
                    "down_bytes": down,
                    "up_bytes": up,
                }
            )

    def write_traffic(self) -> None:
        with atomic_path(self.out / "federation.csv") as tmp:
            pd.DataFrame(self.traffic).to_csv(tmp, index=False)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        messages, self.sent = [], []
        for i, job in enumerate(self.eval_jobs):
            content = evaluate_content(server_round, job)
            self.down[job.client] = message_bytes(content)
            node, group = self.nodes[job.client], str(server_round)
            messages.append(self.identity.instruction(content, node, "evaluate", server_round, group))
            self.sent.append(i)
        return messages

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Each reply's scores read and checked against what the job expects (or why they are refused)."""
        for reply in replies:
            i = self.waiting.get(reply.metadata.reply_to_message_id)
            if i is None:
                continue
            job, node = self.eval_jobs[i], self.nodes[self.eval_jobs[i].client]
            content, why = self.opened(job.client, reply, "evaluate", server_round)
            read = accept_scores(reply, job, self.eval_expected[i], content) if content is not None else None
            self.arrived.append((i, read or EvalReply(error=why, node=node)))
            self.count("evaluate", server_round, job.client, reply)
        return MetricRecord({"replies": len(self.arrived)})

    def summary(self) -> None:
        log.info("incofl strategy: %d clients on nodes %s", len(self.nodes), self.nodes)


def serve(grid: Grid, settings: AppSettings) -> dict[str, Any]:
    """One federated run (module docstring); its summary."""
    cfg = load_run_config(settings.config, settings.overrides)
    check_federated(cfg)
    data = dataset_for(cfg)
    engine = build_engine(cfg, data, FederatedEngine)
    identity = Identity.load(grid, settings, cfg.clients, grid.run.run_id)
    test = {client: test_sha256(data) for client in tested_on_nodes(cfg)}
    inbox = Inbox(grid)
    try:
        nodes = identify(inbox, cfg, settings.join_timeout, test, identity)
        strategy = IncoflStrategy(inbox, nodes, settings.round_timeout, settings.out, identity)
        trainer = RemoteTrainer(strategy, settings.allow_missing)
        engine.federate(trainer)
        with claimed(settings.out):
            summary = Run(cfg, engine, settings.out).execute()
    finally:
        inbox.close()
    write_json(
        settings.out / "federation.json",
        {
            "nodes": {str(c): n for c, n in sorted(nodes.items())},
            "kept_sha256": {str(c): h for c, h in sorted(trainer.kept.items())},
            "state_sha256": summary.get("state_sha256"),
        },
    )
    return summary


@app.main()
def main(grid: Grid, context: Context) -> None:
    serve(grid, AppSettings.of(dict(context.run_config)))
