"""The Flower ServerApp: an incofl run whose clients are SuperNodes.

Run config (the app's pyproject.toml, or `flwr run ... --run-config`): `config` (the run's
YAML, read as `incofl train --config` reads it), `set` (its `--set` overrides, space-separated
key=value), `out` (the run directory: metrics.csv, rounds.csv, summary.json, ckpt.pt, as
`incofl train` writes them, and federation.csv: the bytes each round's training and evaluation
sent to and received from each client), `round-timeout` (seconds a round waits for its replies),
`join-timeout` (seconds the run waits for every client's node to join) and `allow-missing` (go
on without clients that did not reply in time or whose reply was refused; rounds.csv names them).

The run: the config is validated and refused if it cannot run federated (server.py), the
server's engine is built as `incofl train` builds it (the data set's test split is scored on
the server), every node is asked which client it is (`query.identify`, with the run's config),
then incofl's `Run` drives the rounds with the strategy as its train stage: incofl's seeded
schedule and planner choose the clients, `configure_train` sends each its plan and start
weights, `aggregate_train` checks the replies, and the engine aggregates, evaluates and
checkpoints exactly as in the simulator. Client models the evaluation scores on the clients'
nodes (server.py) go out through `configure_evaluate` and come back through
`aggregate_evaluate`. Restarted with the same `out`, the run resumes from its last checkpoint
(and each node from its client's state at that round: client.py).
"""

from __future__ import annotations

import json
import logging
import shlex
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy

from incofl.atomic import atomic_path, write_json
from incofl.config import ConfigError, RunConfig, load_run_config, parse_overrides
from incofl.data.partition import partition_for
from incofl.data.sources import dataset_for
from incofl.federation.codec import (
    CodecError,
    evaluate_content,
    message_bytes,
    read_scores,
    read_update,
    train_content,
)
from incofl.federation.server import (
    EvalJob,
    EvalReply,
    FederatedEngine,
    RemoteTrainer,
    Reply,
    TrainJob,
    check_federated,
    test_clients,
)
from incofl.federation.sitedata import test_sha256
from incofl.fl.engine.engine import resolve_device
from incofl.fl.engine.run import Run
from incofl.fl.engine.rundir import claimed

log = logging.getLogger("incofl.federation")
app = ServerApp()


@dataclass(frozen=True)
class AppSettings:
    """The app's run config (module docstring)."""

    config: str | None  # None: the built-in defaults, as `incofl train` without --config
    overrides: dict[str, Any]
    out: Path
    round_timeout: float = 600.0
    join_timeout: float = 120.0
    allow_missing: bool = False

    @classmethod
    def of(cls, run_config: dict[str, Any]) -> AppSettings:
        if not run_config.get("out"):
            raise ConfigError("run config: out: set the run directory")
        overrides = parse_overrides(shlex.split(str(run_config.get("set", ""))))
        return cls(
            str(run_config.get("config", "")) or None,
            overrides,
            Path(str(run_config["out"])),
            float(run_config.get("round-timeout", 600.0)),
            float(run_config.get("join-timeout", 120.0)),
            bool(run_config.get("allow-missing", False)),
        )


def identify(grid: Grid, cfg: RunConfig, timeout: float, test: dict[int, str]) -> dict[int, int]:
    """client -> node: every node that joins within `timeout` is asked which client it is (with
    the run's config, which it checks its data against); stops with one line naming the
    clients whose node did not join, the node that failed its check, or a client whose node
    lacks the test split `test` asks of it (client -> its hash)."""
    content = RecordDict({"run": ConfigRecord({"config": json.dumps(cfg.model_dump())})})
    nodes: dict[int, int] = {}
    asked: set[int] = set()
    deadline = time.monotonic() + timeout
    while len(nodes) < cfg.clients and time.monotonic() < deadline:
        new = [n for n in grid.get_node_ids() if n not in asked]
        asked.update(new)
        queries = [Message(content, node, "query.identify") for node in new]
        for reply in grid.send_and_receive(queries, timeout=max(deadline - time.monotonic(), 1.0)) if new else []:
            node = reply.metadata.src_node_id
            if reply.has_error():
                raise ConfigError(f"node {node} refused the run: {reply.error.reason}")
            client = int(reply.content.config_records["node"]["client"])
            if client in nodes:
                raise ConfigError(f"node {node} says it is client {client}, as node {nodes[client]} does")
            if not 0 <= client < cfg.clients:
                raise ConfigError(f"node {node} says it is client {client}: the run has clients 0..{cfg.clients - 1}")
            if client in test and reply.content.config_records["node"]["test_sha256"] != test[client]:
                raise ConfigError(
                    f"node {node} (client {client}): its data file lacks the test split (or holds another), on "
                    f"which this run scores client {client}'s model with what it keeps ({cfg.method}"
                    f"{', bn_stats: local' if cfg.bn_stats == 'local' else ''}); export it with --test"
                )
            nodes[client] = node
        if len(nodes) < cfg.clients:
            time.sleep(0.2)
    missing = sorted(set(range(cfg.clients)) - set(nodes))
    if missing:
        raise ConfigError(
            f"no node joined for client(s) {', '.join(map(str, missing))} within {timeout:.0f} s (join-timeout)"
        )
    return nodes


def unanswered(node: int, reply: Message | None) -> str:
    """Why a node's reply holds no content to decode ('' if it does): none came (in one line,
    the last of a failed ClientApp's traceback)."""
    if reply is None:
        return "no reply within round-timeout (node gone?)" if node >= 0 else "no node"
    if reply.has_error():
        lines = [line.strip() for line in reply.error.reason.strip().splitlines() if line.strip()]
        return f"the node's ClientApp failed: {lines[-1] if lines else 'no reason given'}"
    return ""


@dataclass
class IncoflStrategy(Strategy):
    """incofl's round as a Flower strategy (server.Exchange): one message per planned client
    (its own plan and start weights, so clients may hold different architectures), replies
    decoded and handed to the engine, which checks them; the same for the client models an
    evaluation scores on their nodes."""

    grid: Grid
    nodes: dict[int, int]  # client -> node
    timeout: float
    out: Path
    jobs: list[TrainJob] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)
    eval_jobs: list[EvalJob] = field(default_factory=list)
    scores: list[EvalReply] = field(default_factory=list)
    traffic: list[dict[str, int]] = field(default_factory=list)
    down: dict[int, int] = field(default_factory=dict)  # client -> bytes sent it by the last exchange

    def train(self, round_: int, jobs: list[TrainJob]) -> list[Reply]:
        """A round's training: configure, send and receive, aggregate (decode)."""
        self.jobs = jobs
        messages = list(self.configure_train(round_ + 1, ArrayRecord(), ConfigRecord(), self.grid))
        replies = list(self.grid.send_and_receive(messages, timeout=self.timeout))
        self.aggregate_train(round_ + 1, replies)
        return self.replies

    def evaluate(self, round_: int, jobs: list[EvalJob]) -> list[EvalReply]:
        """An evaluation's client models: configure, send and receive, aggregate (decode)."""
        self.eval_jobs = jobs
        messages = list(self.configure_evaluate(round_, ArrayRecord(), ConfigRecord(), self.grid))
        replies = list(self.grid.send_and_receive(messages, timeout=self.timeout))
        self.aggregate_evaluate(round_, replies)
        return self.scores

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        messages = []
        for job in self.jobs:
            client = job.plan.client
            if client in self.nodes:
                content = train_content(server_round - 1, job)
                self.down[client] = message_bytes(content)
                messages.append(Message(content, self.nodes[client], "train", group_id=str(server_round)))
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[None, MetricRecord]:
        """Each planned client's reply decoded (or why there is none); the engine checks and
        averages them (server.RemoteTrainer). Bytes each way go to federation.csv."""
        by_node = {reply.metadata.src_node_id: reply for reply in replies}
        self.replies = []
        for job in self.jobs:
            node = self.nodes.get(job.plan.client, -1)
            reply = by_node.get(node)
            self.replies.append(self.read(node, reply))
            self.count("train", server_round, job.plan.client, node, reply)
        self.write_traffic()
        return None, MetricRecord({"replies": len(by_node)})

    def count(self, stage: str, server_round: int, client: int, node: int, reply: Message | None) -> None:
        """A message's bytes each way, for federation.csv (a client without a reply: none)."""
        if reply is not None and reply.has_content():
            down, up = self.down[client], message_bytes(reply.content)
            self.traffic.append(
                {
                    "round": server_round,
                    "stage": stage,
                    "client": client,
                    "node": node,
                    "down_bytes": down,
                    "up_bytes": up,
                }
            )

    def write_traffic(self) -> None:
        with atomic_path(self.out / "federation.csv") as tmp:
            pd.DataFrame(self.traffic).to_csv(tmp, index=False)

    @staticmethod
    def read(node: int, reply: Message | None) -> Reply:
        missing = unanswered(node, reply)
        if missing:
            return Reply(error=missing, node=node)
        assert reply is not None
        try:
            update, kept, state = read_update(reply.content, "cpu")
        except CodecError as err:
            return Reply(error=str(err), node=node)
        return Reply(update, kept, state, node=node)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        messages = []
        for job in self.eval_jobs:
            content = evaluate_content(server_round, job)
            self.down[job.client] = message_bytes(content)
            messages.append(Message(content, self.nodes[job.client], "evaluate", group_id=str(server_round)))
        return messages

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Each job's scores decoded (or why there are none); the engine checks them."""
        by_node = {reply.metadata.src_node_id: reply for reply in replies}
        self.scores = []
        for job in self.eval_jobs:
            node = self.nodes[job.client]
            reply = by_node.get(node)
            self.scores.append(self.read_eval(node, reply, job.splits))
            self.count("evaluate", server_round, job.client, node, reply)
        self.write_traffic()
        return MetricRecord({"replies": len(by_node)})

    @staticmethod
    def read_eval(node: int, reply: Message | None, splits: tuple[str, ...]) -> EvalReply:
        missing = unanswered(node, reply)
        if missing:
            return EvalReply(error=missing, node=node)
        assert reply is not None
        try:
            client, scores = read_scores(reply.content, splits)
        except CodecError as err:
            return EvalReply(error=str(err), node=node)
        return EvalReply(client, scores, node=node)

    def summary(self) -> None:
        log.info("incofl strategy: %d clients on nodes %s", len(self.nodes), self.nodes)


def serve(grid: Grid, settings: AppSettings) -> dict[str, Any]:
    """One federated run (module docstring); its summary."""
    cfg = load_run_config(settings.config, settings.overrides)
    check_federated(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    data = dataset_for(cfg)
    engine = FederatedEngine(cfg, data, partition_for(cfg, data), resolve_device(cfg.device))
    test = {client: test_sha256(data) for client in test_clients(cfg)}
    nodes = identify(grid, cfg, settings.join_timeout, test)
    strategy = IncoflStrategy(grid, nodes, settings.round_timeout, settings.out)
    trainer = RemoteTrainer(strategy, settings.allow_missing)
    engine.federate(trainer)
    with claimed(settings.out):
        summary = Run(cfg, engine, settings.out).execute()
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
