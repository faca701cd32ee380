"""A Flower federation as the transport of incofl's exchange (fl/engine/exchange.py): each job
of a round or an evaluation is one message to its client's SuperNode, each reply is read and
checked as it arrives, and nothing in a reply reaches the server side before every check passed.

Identity (`Identity`): with site keys, a node's claim to be client C is accepted only if the
key the SuperLink holds for it (`grid.get_nodes()`, node authentication) is site C's, and every
reply must come from the node its message went to and be signed with its client's site key
over its content and what it answers (the run, the round, the client, the id and type of the
message it answers), checked before anything in it is read. Every instruction is signed with
the server's key, which the nodes check against the public half their data files carry.

Reading (`accept_update`, `accept_scores`): the codec checks a reply's form (records, names,
shapes, dtypes, bytes) against what the server side expects of that client (`Server.expect`,
`expect_scores`: derived from the plan, the start weights, the partition, the schedule's epochs
and batches, and what the run's components declare their clients send) before it decodes an
array; `check_update` / `check_scores` check its values. No reply can stop the server: one that
fails any check, or raises anything while it is read, is refused in one line naming its node
and client. Replies are pulled through a guarded inbox (flower/inbox.py): one that does not decode is
its node's fault, a message the server did not ask for is ignored, and no reply holds a round
past its deadline (`round-timeout`).

What the client side keeps stays on its node; the transport records the hashes each node
reports (of what its client keeps, for the run's fingerprint; of its whole state, sent back
with the client's next job so that a node whose restored state is another refuses to go on)
and checkpoints them. federation.csv: the bytes each message's arrays took each way.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from incofl.atomic import atomic_path
from incofl.config import ConfigError
from incofl.deploy import REPLY_OVERHEAD
from incofl.deploy.flower.inbox import Inbox, Pulled, one_line
from incofl.deploy.wire.codec import (
    CodecError,
    bundled,
    failure_text,
    job_content,
    message_bytes,
    open_failure,
    open_reply,
    read_scores,
    read_update,
    reply_bytes,
    sign_instruction,
    unbundled,
    unsigned,
)
from incofl.deploy.wire.signing import SignatureError, private_key, public_key
from incofl.fl.contracts import ClientPlan, Round, State
from incofl.fl.engine.exchange import (
    EvalJob,
    EvalReply,
    ExpectedScores,
    ExpectedUpdate,
    MissingClients,
    Reply,
    TrainJob,
    by_client,
    check_hashes,
    check_scores,
    check_update,
)
from incofl.fl.engine.server import Server
from incofl.fl.stages.evaluation import Scores
from incofl.fl.stages.layout import ClientEval

log = logging.getLogger("incofl.deploy")
# the reason of Flower's error reply for a ClientApp that raised (flwr-clientapp's run_clientapp.py,
# executor.py): "<class 'T'>:<'text'>"; incofl's ClientApp raises these with the node's line as their text
RAISED = re.compile(r"<class '(?:[\w.]*\.)?(\w+)'>:<'(.*)'>", re.DOTALL)
NODE_TERMS = ("NodeError", "Refused")


def spki(key: bytes) -> bytes:
    """A public key (PEM, as the SuperLink holds it; OpenSSH, as a site's file holds it) in one form
    to compare (DER SubjectPublicKeyInfo); b'' if it is not an ECDSA public key (signing.public_key)."""
    from cryptography.hazmat.primitives import serialization

    try:
        public = public_key(key, "a node's key")
    except ConfigError:
        return b""
    return public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


@dataclass
class Identity:
    """Which node may speak for which client: with site keys (client -> key), only the node whose
    key the SuperLink holds is that site's, and only a reply signed with that key is its; without,
    any node (module docstring). The server's key signs every instruction of run `run`."""

    grid: Grid
    server: Any  # the server's private key
    keys: dict[int, bytes] | None = None
    node_keys: dict[int, bytes] = field(default_factory=dict)  # node -> its key (the SuperLink's)
    run: int = 0

    @classmethod
    def load(cls, grid: Grid, node_keys: Path | None, server_path: Path, clients: int, run: int) -> Identity:
        """The sites' keys in `node_keys` (`node<client>.pub`), each client's, and the server's
        private key at `server_path`; refused in one line naming a missing or unreadable file."""
        if not server_path.is_file():
            raise ConfigError(f"server-key: no {server_path}; make it with incofl federation export")
        server = private_key(server_path)
        if node_keys is None:
            log.warning("no node-keys: any node may claim any client (each client is bound to its node's word)")
            return cls(grid, server, run=run)
        keys = {}
        for client in range(clients):
            path = node_keys / f"node{client}.pub"
            key = spki(path.read_bytes()) if path.is_file() else b""
            if not key:
                raise ConfigError(f"node-keys: {path}: no OpenSSH public key of client {client}'s site")
            keys[client] = key
        log.info("node keys from %s: each client is bound to its site's key", node_keys)
        return cls(grid, server, keys, run=run)

    def instruction(self, content: RecordDict, node: int, kind: str, round_: int, group: str = "") -> Message:
        """A message to `node`, signed with the server's key."""
        content = sign_instruction(
            bundled(RecordDict(dict(content.items()))), self.server, self.run, node, kind, round_
        )
        return Message(content, node, kind, group_id=group)

    def opened(self, reply: Message, client: int | None, answers: str, kind: str, round_: int) -> RecordDict:
        """A reply's content, with site keys only if client `client`'s site signed it as the answer
        to `answers` (SignatureError otherwise: `client` None, the node's key is no site's), before
        anything in it is read; its states unbundled (CodecError if they are not one bundle)."""
        if self.keys is None:
            return unbundled(unsigned(reply.content))
        if client is None:
            raise SignatureError(f"node {reply.metadata.src_node_id}'s key is no site's")
        public = public_key(self.keys[client], f"client {client}'s key")
        return unbundled(open_reply(reply.content, public, self.run, round_, client, answers, kind))

    def failure(self, reply: Message, client: int | None, answers: str, kind: str) -> str:
        """A node's failure (its error reply's line, `failure_line`), if client `client`'s site signed
        it as its answer to `answers` (SignatureError otherwise: `client` None, the node's key is no
        site's), with site keys only."""
        if self.keys is None or client is None:
            raise SignatureError(f"node {reply.metadata.src_node_id}'s key is no site's")
        public = public_key(self.keys[client], f"client {client}'s key")
        return open_failure(failure_line(reply), public, self.run, client, answers, kind)

    def site_of(self, node: int) -> int | None:
        """The client whose site's key the SuperLink holds for `node` (None: no site's, or no site keys)."""
        key = self.key(node) if self.keys is not None else b""
        return next((client for client, site in (self.keys or {}).items() if key and site == key), None)

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


@dataclass(frozen=True)
class Opened:
    """A reply from `node` whose signature holds (`message` and its `content`, the signature left
    out), or why it cannot be its client's (`content` None)."""

    node: int
    message: Message | None = None
    content: RecordDict | None = None
    why: str = ""


def failure_line(reply: Message) -> str:
    """What a node's error reply says, in one line, its signature left on (codec.failure_text): of
    incofl's ClientApp, the node's line; of another exception, its type and its text's first line;
    of a reason not in Flower's form, its last line (a traceback's)."""
    reason = reply.error.reason.strip()
    if raised := RAISED.fullmatch(reason):
        kind, text = raised.groups()
        text = (text.strip().splitlines() or [""])[0]
        return text if kind in NODE_TERMS else f"{kind}: {text}"
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    return lines[-1] if lines else "no reason given"


def failure_reason(reply: Message) -> str:
    """A node's error reply in one line of at most 300 characters, its signature (if any) left off."""
    return failure_text(failure_line(reply))[0][:300]


def no_content(node: int, reply: Message | None) -> str:
    """Why a node's reply holds no content to decode ('' if it does): none came, or its ClientApp
    failed (its line, unsigned: `failure_line`)."""
    if reply is None:
        return "no reply within round-timeout (node gone?)" if node >= 0 else "no node"
    if reply.has_error():
        return f"the node's ClientApp failed: {failure_reason(reply)}"
    return ""


def unreadable(err: Exception) -> str:
    """An exception raised while a reply was read, in one short line: the codec's refusal as it
    says it, anything else as what made the reply unreadable."""
    return one_line(err, typed=False) if isinstance(err, CodecError) else f"unreadable ({one_line(err)})"


def accept_update(reply: Message, expected: ExpectedUpdate, content: RecordDict | None = None) -> Reply:
    """A training reply read and checked against what the server accepts of its client (never
    raises: what fails anything is refused, with why in `error`); `content`: its content, its
    signature checked and left out (default: the reply's own)."""
    client, node = expected.plan.client, reply.metadata.src_node_id
    try:
        update, kept, state = read_update(reply.content if content is None else content, expected, "cpu")
        bad_hash = check_hashes(kept, state)
        why = bad_hash or check_update(expected, update)
    except Exception as err:  # noqa: BLE001 (no reply can stop the server)
        return Reply(client, error=unreadable(err), node=node)
    if why:  # its state hash kept all the same (the node saved that state): unless malformed
        return Reply(client, error=why, state_sha256="" if bad_hash else state, node=node)
    return Reply(client, update, kept, state, node=node)


def accept_scores(
    reply: Message, job: EvalJob, expected: ExpectedScores, content: RecordDict | None = None
) -> EvalReply:
    """An evaluation reply read and checked (never raises, as accept_update)."""
    node = reply.metadata.src_node_id
    try:
        client, scores = read_scores(reply.content if content is None else content, job.splits, expected)
        why = check_scores(expected, client, scores)
    except Exception as err:  # noqa: BLE001 (no reply can stop the server)
        return EvalReply(error=unreadable(err), node=node)
    return EvalReply(client, scores, error=why, node=node)


@dataclass(frozen=True)
class Outgoing:
    """A job on its way to its client's node, with the most bytes its reply may take (the inbox
    stops pulling one past it; scores and other replies without states: the inbox's small cap)."""

    job: TrainJob | EvalJob
    cap: int = REPLY_OVERHEAD

    @property
    def client(self) -> int:
        return self.job.client


@dataclass
class FlowerTransport:
    """The exchange over a Flower Grid (module docstring): one message per job, so that clients
    may hold different architectures, to the node of its client (`nodes`: client -> node)."""

    lossy: ClassVar[bool] = True
    server: Server
    inbox: Inbox
    nodes: dict[int, int]
    timeout: float
    out: Path
    identity: Identity
    kept: dict[int, str] = field(default_factory=dict)  # client -> hash of what it keeps (its last reply's; '' none)
    states: dict[int, str] = field(default_factory=dict)  # client -> hash of its whole state (its last reply's)
    traffic: list[dict[str, int]] = field(default_factory=list)

    def train(
        self, round_: Round, plans: list[ClientPlan], start: Callable[[ClientPlan], State], broadcasts: dict[int, State]
    ) -> Iterator[Reply]:
        """Each planned client's job to its node; each reply read and checked as it arrives, then
        one for each job without one (why: none came)."""
        jobs = [
            TrainJob(round_, plan, start(plan), broadcasts[plan.federation], self.states.get(plan.client, ""))
            for plan in plans
        ]
        expected = {job.client: self.server.expect(job.plan, job.start) for job in jobs}
        sent = [Outgoing(job, reply_bytes(expected[job.client].states())) for job in jobs if job.client in self.nodes]
        answered = set()
        for out, got in self.send(sent, "train", round_):
            answered.add(out.client)
            yield self.taken(round_, out.job.plan, self.read_update(out.client, expected[out.client], got))
        for job in jobs:
            if job.client not in answered:
                node = self.nodes.get(job.client, -1)
                yield self.taken(round_, job.plan, Reply(job.client, error=no_content(node, None), node=node))

    def taken(self, round_: Round, plan: ClientPlan, reply: Reply) -> Reply:
        """A read reply recorded: its node saved the state it hashes (whether or not it is averaged),
        what its client keeps; a refusal logged by node and client."""
        if reply.state_sha256:
            self.states[plan.client] = reply.state_sha256
        if reply.error or reply.update is None:
            number, node = round_.number, reply.node
            log.warning("round %d: node %d, client %d: refused: %s", number, node, plan.client, reply.error)
            return reply
        reply.update.view = plan.view  # the server's own plan says where a sub-model sits
        self.kept[plan.client] = reply.kept_sha256
        return reply

    def score(self, round_: Round, jobs: list[ClientEval], start: Callable[[int], State]) -> list[Scores]:
        """Each client's listed models in one message to its node, scored there; stops naming the
        clients without valid scores (an evaluation needs every one)."""
        asked = [
            EvalJob(
                round_,
                client,
                evals[0].group,
                tuple(j.split for j in evals),
                start(evals[0].group),
                self.states.get(client, ""),
            )
            for client, evals in by_client(jobs).items()
        ]
        replies: dict[int, EvalReply] = {}
        for out, got in self.send([Outgoing(job) for job in asked], "evaluate", round_):
            replies[out.client] = self.read_scores(out.job, got)
        why = {}
        for job in asked:
            node = self.nodes.get(job.client, -1)
            reply = replies.get(job.client) or EvalReply(error=no_content(node, None), node=node)
            if reply.error:
                log.warning(
                    "evaluation after round %d: node %d, client %d: refused: %s",
                    round_.number,
                    reply.node,
                    job.client,
                    reply.error,
                )
                why[job.client] = reply.error
            replies[job.client] = reply
        if why:
            raise MissingClients(round_, sorted(why), why, evaluation=True)
        scored = {
            (job.client, split): s
            for job in asked
            for split, s in zip(job.splits, replies[job.client].scores, strict=True)
        }
        return [scored[job.client, job.split] for job in jobs]

    def send(self, jobs: list[Outgoing], kind: str, round_: Round) -> Iterator[tuple[Outgoing, Opened]]:
        """Each job as a signed message `kind` to its client's node; (the job, what came, opened)
        for each reply as it arrives, pulled no further than the job's cap. Bytes each way go to
        federation.csv: a reply's once its signature holds (nothing of it is read before)."""
        messages, down, number = [], {}, round_.number  # the number: what a message and its signature carry
        for out in jobs:
            content = job_content(out.job)
            down[out.client] = message_bytes(content)
            messages.append(self.identity.instruction(content, self.nodes[out.client], kind, number, str(number)))
        waiting = {message_id: jobs[k] for message_id, k in self.inbox.push(messages).items()}
        caps = {message_id: out.cap for message_id, out in waiting.items()}
        for got in self.inbox.arrivals(waiting, time.monotonic() + self.timeout, caps):
            out = waiting[got.answers]
            opened = self.opened(out.client, got, kind, round_)
            if opened.content is not None:
                self.count(kind, round_, out.client, down[out.client], opened.content)
            yield out, opened
        self.write_traffic()

    def read_update(self, client: int, expected: ExpectedUpdate, got: Opened) -> Reply:
        """A training reply: refused if it cannot be its client's, else read and checked."""
        if got.message is None or got.content is None:
            return Reply(client, error=got.why, node=got.node)
        return accept_update(got.message, expected, got.content)

    def read_scores(self, job: EvalJob, got: Opened) -> EvalReply:
        """An evaluation reply: refused if it cannot be its client's, else read and checked."""
        if got.content is None:
            return EvalReply(error=got.why, node=got.node)
        return accept_scores(
            got.message, job, self.server.expect_scores(job.client, job.group, job.splits), got.content
        )

    def opened(self, client: int, got: Pulled, kind: str, round_: Round) -> Opened:
        """A reply's content if it can be its client's, else why not: it must have arrived whole
        (its node's fault otherwise), come from the node its message went to, whose key is the
        client's, hold content, and (with site keys) be signed by the client's site as the answer
        to this message (module docstring)."""
        reply, node = got.message, self.nodes[client]
        if reply is None:  # it does not decode, or never arrived whole
            return Opened(got.node, why=got.why)
        src = reply.metadata.src_node_id
        if src != node:
            return Opened(node, why=f"a reply from node {src} to a message sent to node {node}")
        why = self.identity.refusal(src, client) or no_content(node, reply)
        if why:
            return Opened(node, why=why)
        try:
            content = self.identity.opened(reply, client, reply.metadata.reply_to_message_id, kind, round_.number)
        except (SignatureError, CodecError) as err:
            return Opened(node, why=str(err))
        return Opened(node, reply, content)

    def count(self, stage: str, round_: Round, client: int, down: int, content: RecordDict) -> None:
        """A message's bytes each way (the reply's `content`, its signature checked), for federation.csv."""
        up = message_bytes(content)
        node = self.nodes[client]
        self.traffic.append(
            {"round": round_.number, "stage": stage, "client": client, "node": node, "down_bytes": down, "up_bytes": up}
        )

    def write_traffic(self) -> None:
        with atomic_path(self.out / "federation.csv") as tmp:
            pd.DataFrame(self.traffic).to_csv(tmp, index=False)

    def kept_sha256(self) -> dict[int, str]:
        """The hashes the nodes reported of what their clients keep (the run's fingerprint hashes them)."""
        return {client: sha for client, sha in self.kept.items() if sha}

    def attach(self, folder: Path) -> None:
        """Nothing: what the clients keep stays on their nodes."""

    def state_dict(self) -> dict[str, Any]:
        return {"kept_sha256": dict(self.kept), "client_sha256": dict(self.states)}

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        self.kept, self.states = dict(payload["kept_sha256"]), dict(payload["client_sha256"])
