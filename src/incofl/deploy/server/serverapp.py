"""The Flower ServerApp: an incofl run whose clients are SuperNodes.

Run config (the app's pyproject.toml, or `flwr run ... --run-config`): `config` (the run's
YAML, read as `incofl train --config` reads it), `set` (its `--set` overrides, space-separated
key=value), `out` (the run directory: metrics.csv, rounds.csv, summary.json, ckpt.pt, as
`incofl train` writes them, and federation.csv: the bytes each round's training and evaluation
sent to and received from each client), `round-timeout` (seconds a round waits for its replies),
`join-timeout` (seconds the run waits for every client's node to join), `allow-missing` (go
on without clients that did not reply in time or whose reply was refused; rounds.csv names them),
`node-keys` (a folder of each site's public key, `node<client>.pub` in OpenSSH format, as
`incofl federation up` writes them: each client is then bound to its site's key, below),
`server-key` (the server's private key; default `<node-keys>/server`) and `facts` (the run's
facts and the test split, serverdata.py; default `facts.npz` beside the server's key).

The run: the config is validated and refused if it cannot run federated (`check_federated`),
the run's server side is built from the facts file, whose signature the server's key checks
(fl/engine/server.py; it never reads a training image, and scores the global model on the test
split the file holds), every node is asked which client it is (`query.identify`, with its
schedule: wire/schedule.py, no path and no server-only setting), then incofl's `Run` drives the
rounds through the same `Engine` as the simulator, whose transport is the federation
(transport.py): incofl's seeded schedule and planner choose the clients, each planned client's
job goes to its node, each reply is read and checked as it arrives (pulled after 0.05 s doubling
to 0.2 s, the Flower adapter's QUICK, not Flower's `send_and_receive`, which pulls every 3 s), and
the server side aggregates, evaluates and checkpoints exactly as in the simulator. No reply can stop the server.
Restarted with the same `out`, the run resumes from its last checkpoint (and each node from its
client's store at that round: site/client.py).

A run refused (a config it cannot run, a site's refusal, a round without its replies: a
ConfigError or MissingClients, one line each) ends with that line, logged through Flower's logger
before Flower's traceback of the exception (`flwr run --stream`, `flwr log` show both; Flower's
status details, `flwr ls`, the line), which holds no frame of incofl's below `main`.

Identity: with `node-keys`, a node's claim to be client C at identify is accepted only if the
key the SuperLink holds for it is site C's (transport.Identity); another is refused and logged,
and the run waits for the rightful node. So is a node's refusal of the run (its error reply),
unless site C signed it (clientapp.signed): then the run stops at once with the site's line.
Without `node-keys`, the start-up line says that any node may claim any client, and any node's
refusal stops the run. Every instruction is signed with the server's key (`server-key`, by
default `<node-keys>/server`, made by `incofl federation export`).
"""

from __future__ import annotations

import gc
import logging
import shlex
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, RecordDict
from flwr.serverapp import Grid, ServerApp

from incofl.atomic import write_json
from incofl.config import ConfigError, RunConfig, load_run_config, parse_overrides
from incofl.data.facts import ClientFacts, Facts, client_facts
from incofl.deploy import REPLY_OVERHEAD
from incofl.deploy.flower import log_error
from incofl.deploy.flower.inbox import Inbox, Pulled
from incofl.deploy.server.serverdata import FACTS, load_facts
from incofl.deploy.server.transport import FlowerTransport, Identity, failure_reason, no_content
from incofl.deploy.wire.exported import test_sha256
from incofl.deploy.wire.schedule import schedule_of
from incofl.deploy.wire.signing import SERVER, SignatureError
from incofl.fl.engine.device import run_device
from incofl.fl.engine.engine import Engine
from incofl.fl.engine.exchange import MissingClients
from incofl.fl.engine.run import Run
from incofl.fl.engine.rundir import claimed
from incofl.fl.engine.server import build_server
from incofl.fl.methods.width.levels import STATIC_BN
from incofl.fl.stages.layout import tested_on_clients
from incofl.registry import layout_of
from incofl.sides import ServerSettings
from incofl.spec import WIDTH_LAYOUT

log = logging.getLogger("incofl.deploy")
app = ServerApp()
MAX_SAMPLES = 2**31 - 1  # a declared count past it is no site's (and would overflow a weight's int32)


@dataclass(frozen=True)
class AppSettings:
    """The app's run config (module docstring); its defaults are the app's (flower-app/pyproject.toml
    repeats them for `flwr run`, and a test holds the two equal)."""

    config: str | None  # None: the built-in defaults, as `incofl train` without --config
    overrides: dict[str, Any]
    out: Path
    round_timeout: float = 600.0
    join_timeout: float = 120.0
    allow_missing: bool = False
    node_keys: Path | None = None
    server_key: Path | None = None  # None: `node-keys`' `server`, if node-keys is set
    facts: Path | None = None  # None: `facts.npz` beside the server's key

    @classmethod
    def of(cls, run_config: dict[str, Any]) -> AppSettings:
        if not run_config.get("out"):
            raise ConfigError("run config: out: set the run directory")
        overrides = parse_overrides(shlex.split(str(run_config.get("set", ""))))
        keys, server = str(run_config.get("node-keys", "")), str(run_config.get("server-key", ""))
        facts = str(run_config.get("facts", ""))
        if not keys and run_config.get("insecure") is not True:  # binding clients to keys is the default
            raise ConfigError(
                "run config: node-keys: set the folder of the sites' public keys (nodeK.pub for client K), "
                "or insecure=true to let any node claim any client"
            )
        return cls(
            str(run_config.get("config", "")) or None,
            overrides,
            Path(str(run_config["out"])),
            float(run_config.get("round-timeout", cls.round_timeout)),
            float(run_config.get("join-timeout", cls.join_timeout)),
            bool(run_config.get("allow-missing", cls.allow_missing)),
            Path(keys) if keys else None,
            Path(server) if server else None,
            Path(facts) if facts else None,
        )

    def server_key_path(self) -> Path:
        """The server's private key: `server-key`, else `<node-keys>/server`; refused in one line without either."""
        key = self.server_key or (self.node_keys / SERVER if self.node_keys else None)
        if key is None:  # it signs every instruction and checks the facts file's signature
            raise ConfigError(
                "run config: server-key: set the server's private key (incofl federation export's keys/server)"
            )
        return key

    def facts_path(self) -> Path:
        """The server's facts file (serverdata.py): `facts`, else `facts.npz` beside the server's key."""
        return self.facts or self.server_key_path().parent / FACTS


IDENTIFY = "query.identify"


def identify(
    inbox: Inbox, cfg: RunConfig, facts: Facts, timeout: float, test: dict[int, str], identity: Identity
) -> tuple[dict[int, int], dict[int, ClientFacts]]:
    """client -> node, and client -> the facts its site declared (one serving its own data): every
    node that joins within `timeout` is asked which client it is (with the run's schedule, which it
    checks its data against, and the data set's `facts`); a claim `identity` refuses, or a reply
    that is not a claim, is logged and left out (the rightful node may still come). Stops with one
    line naming the clients whose node did not join, the node that failed its check, a second
    claim of one client, or a client whose node lacks the test split `test` asks of it (client -> its hash)."""
    content = RecordDict({"run": ConfigRecord({"schedule": schedule_of(cfg, facts)})})
    nodes: dict[int, int] = {}
    declared: dict[int, ClientFacts] = {}
    asked: set[int] = set()
    sent: dict[str, int] = {}  # message -> the node it went to
    refusals: dict[int, str] = {}  # node -> why it refused the run (with site keys: no error stops it)

    def ask_new() -> list[str]:
        """Identify sent to each node that joined since the last look: the ids of those the SuperLink took."""
        new = [node for node in identity.grid.get_node_ids() if node not in asked]
        asked.update(new)
        queries = [identity.instruction(content, node, IDENTIFY, 0) for node in new]
        taken = {i: queries[k].metadata.dst_node_id for i, k in inbox.push(queries).items()}
        sent.update(taken)
        return list(taken)

    def joined() -> bool:
        return len(nodes) == cfg.clients

    for got in inbox.arrivals((), time.monotonic() + timeout, more=ask_new, until=joined):
        node = sent[got.answers]
        if got.message is None:
            log.warning("identify: node %d: refused: %s", node, got.why)
        else:
            claim(cfg, facts, node, got, (nodes, declared), test, identity, refusals)
    missing = sorted(set(range(cfg.clients)) - set(nodes))
    if missing:
        why = "".join(f"; node {node} refused the run: {reason}" for node, reason in refusals.items())
        raise ConfigError(
            f"no node joined for client(s) {', '.join(map(str, missing))} within {timeout:.0f} s (join-timeout){why}"
        )
    return nodes, declared


def claim(
    cfg: RunConfig,
    facts: Facts,
    node: int,
    got: Pulled,
    joined: tuple[dict[int, int], dict[int, ClientFacts]],
    test: dict[int, str],
    identity: Identity,
    refusals: dict[int, str],
) -> None:
    """A node's answer to identify: its client added to `nodes`, or refused (module docstring of
    identify). With site keys, the client is the one whose site's key the SuperLink holds for the
    node, and nothing of the reply is read before that site's signature on it holds; an error reply
    stops the run with its line only if that site signed the line as its answer to this message
    (the node's refusal, clientapp.signed; without site keys, any does): another is logged, and
    named if the run ends for want of that client. A site's declaration of its facts (`declared`)
    is taken only so signed, and checked against the data set's `facts`."""
    nodes, declared = joined
    reply = got.message
    assert reply is not None
    site = identity.site_of(node)
    if reply.has_error():
        if identity.keys is None:
            raise ConfigError(f"node {node} refused the run: {failure_reason(reply)}")
        try:  # its line, signed by the client's site as its answer to this identify
            why = identity.failure(reply, site, got.answers, IDENTIFY)
        except SignatureError as err:  # perhaps not the node's own: logged, and named if the run ends without it
            log.warning("identify: node %d: %s (not its site's word: %s)", node, no_content(node, reply), err)
            refusals[node] = no_content(node, reply)
            return
        raise ConfigError(f"client {site}'s site refused the run: {why[:300]}")
    try:
        content = identity.opened(reply, site, got.answers, IDENTIFY, 0)
        answer = content.config_records["node"]
        client, tested = answer["client"], answer["test_sha256"]
        if type(client) is not int or not 0 <= client < cfg.clients or type(tested) is not str:
            raise ValueError(f"not a claim of a client (client {str(client)[:20]}: the run has 0..{cfg.clients - 1})")
        if identity.keys is not None and client != site:
            raise ValueError(f"it says it is client {client}, signed as client {site}'s site")
        declaration = declared_facts(content, facts, identity.keys is not None)
    except (KeyError, TypeError, ValueError) as err:  # SignatureError too
        log.warning("identify: node %d: refused: %s", node, str(err)[:160])
        return
    if client in nodes:
        raise ConfigError(f"node {node} says it is client {client}, as node {nodes[client]} does")
    if client in test and tested != test[client]:
        remedy = "export it with --test" if declaration is None else "a site's own data holds none: serve an export"
        raise ConfigError(
            f"node {node} (client {client}): its data file lacks the test split (or holds another), on "
            f"which this run scores client {client}'s model with what it keeps ({cfg.method}"
            f"{', bn_stats: local' if cfg.bn_stats == 'local' else ''}); {remedy}"
        )
    nodes[client] = node
    if declaration is not None:
        declared[client] = declaration


def declared_facts(content: RecordDict, facts: Facts, signed: bool) -> ClientFacts | None:
    """The facts a site serving its own data declares in its (opened) identify reply, checked
    (None: it declares none); a ValueError says why one is refused: unsigned (no site keys), or
    not a share of the data set's classes of a count a weight can hold."""
    record = content.config_records.get("declared")
    if record is None:
        return None
    if not signed:  # no site key to check it against: the SuperLink's word is no site's declaration
        raise ValueError("it declares its facts, which only a run with node-keys takes")
    row = [record.get("samples"), record.get("held_out"), record.get("classes")]
    declaration = client_facts(row, facts.classes)
    if not 0 < declaration.samples <= MAX_SAMPLES or declaration.held_out > MAX_SAMPLES:
        raise ValueError(f"declared: {declaration.samples} samples, {declaration.held_out} held out: not a share's")
    return declaration


def with_declared(facts: Facts, declared: dict[int, ClientFacts]) -> Facts:
    """`facts` with each declaring site's facts in place of its row (logged where they differ);
    refused in one line where a row left to its site's declaration (`export --declared`) is not filled."""
    if undeclared := [str(c) for c in facts.to_declare if c not in declared]:
        raise ConfigError(
            f"client(s) {', '.join(undeclared)}: the facts file leaves their facts to their sites' declaration "
            "(export --declared), and their nodes declare none (an exported share?); serve their own data, or "
            "make the facts file with incofl federation export without --declared"
        )
    for client, ours in sorted(declared.items()):
        row = facts.clients[client]
        if ours != row and client not in facts.to_declare:  # a row to declare has nothing to differ from
            log.info(
                "client %d serves its own data: its declaration (%d samples, %d held out, %d classes) "
                "in place of the facts file's (%d, %d, %d)",
                client,
                ours.samples,
                ours.held_out,
                len(ours.classes),
                row.samples,
                row.held_out,
                len(row.classes),
            )
    return replace(facts, clients=tuple(declared.get(c, row) for c, row in enumerate(facts.clients)), to_declare=())


def refusal(cfg: RunConfig) -> str:
    """Why `cfg` cannot run as a real federation ('' if it can)."""
    if layout_of(cfg) is WIDTH_LAYOUT and cfg.bn_at_eval == "static":
        return f"eval_bn: static {STATIC_BN}"
    return ""


def check_federated(cfg: RunConfig) -> None:
    """Refuse, in one line naming the method, what cannot run as a real federation."""
    why = refusal(cfg)
    if why:
        raise ConfigError(f"method {cfg.method} cannot run as a real federation with this config: {why}")


def serve(grid: Grid, settings: AppSettings) -> dict[str, Any]:
    """One federated run (module docstring); its summary."""
    cfg = load_run_config(settings.config, settings.overrides)
    check_federated(cfg)
    identity = Identity.load(grid, settings.node_keys, settings.server_key_path(), cfg.clients, grid.run.run_id)
    test, facts = load_facts(settings.facts_path(), cfg, identity.server.public_key())
    if facts.to_declare and identity.keys is None:  # no signed declaration to fill its rows: refused now, not at join
        raise ConfigError(
            f"facts {settings.facts_path()}: leaves the clients' facts to their sites' declaration "
            "(export --declared), which only a run with node-keys takes"
        )
    ours = ServerSettings.of(cfg)  # what the server computes with: its side's builder takes no RunConfig
    tested = {client: test_sha256(test.x, test.y) for client in tested_on_clients(ours, len(test.y) == 0)}
    inbox = Inbox(grid, REPLY_OVERHEAD)
    nodes, declared = identify(inbox, cfg, facts, settings.join_timeout, tested, identity)
    device = run_device(cfg)  # its threads set, the numerics in effect as the run records them
    server = build_server(ours, with_declared(facts, declared), test, device)  # replies checked against these
    transport = FlowerTransport(server, inbox, nodes, settings.round_timeout, settings.out, identity)
    log.info("incofl federation: %d clients on nodes %s", len(nodes), nodes)
    with frozen_heap(), claimed(settings.out):
        summary = Run(cfg, Engine(server, transport, settings.allow_missing), settings.out).execute()
    write_json(
        settings.out / "federation.json",
        {
            "nodes": {str(c): n for c, n in sorted(nodes.items())},
            "kept_sha256": {str(c): h for c, h in sorted(transport.kept.items())},
            "state_sha256": summary.get("state_sha256"),
        },
    )
    return summary


@contextmanager
def frozen_heap() -> Iterator[None]:
    """The rounds with what the process holds when they start (Flower, torch, the models, the facts)
    kept out of the garbage collector's full collections: it lives to the run's end, and walking it
    took about 0.25 s a collection, inside a round (docs/performance.md). Garbage is collected once
    before; the heap is handed back after (a process that serves in-process runs, as tests do, leaks nothing)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@app.main()
def main(grid: Grid, context: Context) -> None:
    try:
        serve(grid, AppSettings.of(dict(context.run_config)))
    except (ConfigError, MissingClients) as err:  # the run refused: its one line first (module docstring)
        log_error(str(err))
        raise err.with_traceback(None) from None
