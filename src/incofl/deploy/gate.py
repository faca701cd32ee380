"""The gate of the sites' port: the Fleet protocol's own rules, which no proxy in front can know
(what a node may push, in whose name, within what budget), applied to each request before Flower's
app sees it. superlink.py serves Flower's Fleet API through it.

1. only `POST /v1/fleet/...` (404 otherwise); none of Flower's authentication headers twice (400:
   Flower reads the first); a body of at most `max_request`, or PUSH_CAP for a
   push of messages (what a tree of MAX_OBJECTS objects takes), 413 as soon as it is known to pass;
2. parsing and hashing in a worker thread, never on the loop that serves the rest;
3. a push of exactly one reply (a node has no instruction to give), in the name of the node that
   sends it (the request's node, which Flower authenticates), of at most MAX_OBJECTS objects,
   counted no further than that; an object whose content hashes to its id, that an accepted reply
   of the pushing node asked for, within that reply's budget (`Ledger`, by node id: whatever its
   headers, a node is the node its requests name, which Flower checks against the key).

The budget of a node's reply is `max_message`, set once when Flower first accepts the reply (a 200
that asks for objects) and never re-armed: a second push answering the same message is a retry only
with the same tree and while no object of it is stored (403 otherwise: once stored, a reply the
server pulled and deleted is not stored again), and one answering a message whose reply the gate
forgot is 403.
An object is charged only once Flower says it stored it; nothing a request that Flower refuses (no
key: 401) sends changes any budget or entry. Refusals are logged, a bounded line each, at most
LOG_BURST a second (`RefusalLog`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Who = int  # a node: the node id of its requests, which Flower authenticates (the key must be that node's)

FLEET = "/v1/fleet/"  # the prefix of Flower 1.42's Fleet router (superlink/routers/fleet/router.py)
PUSH_MESSAGES, PUSH_OBJECT = FLEET + "push-messages", FLEET + "push-object"
AUTH_HEADERS = (b"flwr-public-key", b"flwr-signature", b"flwr-timestamp")  # Flower's, each read once (the first)
MAX_OBJECTS = 4096  # objects one reply may declare (a packed reply: tens; 512 MiB in 5 MiB chunks: about 110)
PUSH_CAP = 64 * 1024 + 80 * MAX_OBJECTS  # a push's message header, and its tree: an id of 64 hex digits an object
REPLIES_PER_NODE = 8  # replies of one node whose budgets the gate holds (the oldest forgotten first)
SPENT_PER_NODE = 4096  # messages per node whose forgotten replies may not be pushed again
LOG_BURST = 5  # refusal lines a second, at most
MIB = 1 << 20
log = logging.getLogger("incofl.gate")


@dataclass
class Reply:
    """What one reply of one node may still add: its tree (a retry pushes the same), its bytes left,
    and whether Flower stored an object of it (no retry after that)."""

    root: str
    budget: int
    objects: set[str]
    stored: bool = False


@dataclass
class Ledger:
    """Each node's accepted replies (by the message they answer) and which reply owns each object it
    was asked for; at most REPLIES_PER_NODE a node, the oldest forgotten into `spent`."""

    replies: dict[Who, OrderedDict[str, Reply]] = field(default_factory=dict)
    owner: dict[Who, dict[str, str]] = field(default_factory=dict)  # object asked for -> the message its reply answers
    spent: dict[Who, OrderedDict[str, None]] = field(default_factory=dict)

    def accept(self, who: Who, answers: str, root: str, objects: list[str], budget: int) -> None:
        replies = self.replies.setdefault(who, OrderedDict())
        replies[answers] = Reply(root, budget, set(objects))
        self.owner.setdefault(who, {}).update(dict.fromkeys(objects, answers))
        while len(replies) > REPLIES_PER_NODE:
            old, reply = replies.popitem(last=False)
            for oid in reply.objects:
                if self.owner[who].get(oid) == old:
                    del self.owner[who][oid]
            spent = self.spent.setdefault(who, OrderedDict())
            spent[old] = None
            if len(spent) > SPENT_PER_NODE:
                spent.popitem(last=False)

    def reply(self, who: Who, answers: str) -> Reply | None:
        return self.replies.get(who, {}).get(answers)

    def spent_on(self, who: Who, answers: str) -> bool:
        return answers in self.spent.get(who, {})

    def answers_for(self, who: Who, object_id: str) -> str | None:
        return self.owner.get(who, {}).get(object_id)


@dataclass(frozen=True)
class Pushed:
    """What a request names, once parsed: the node, and the message its reply answers and the reply's
    tree (a push of messages) or the object and its size (a push of an object)."""

    node: int
    answers: str = ""
    root: str = ""
    objects: int = 0
    object_id: str = ""
    size: int = 0


class RefusalLog:
    """A line a refusal, its path cut to 80 characters and escaped, at most LOG_BURST a second; how
    many were not logged is said on the next line that is."""

    def __init__(self) -> None:
        self.second, self.lines, self.dropped = 0, 0, 0

    def __call__(self, scope: Scope, status: int, why: str) -> None:
        now = int(time.monotonic())
        if now != self.second:
            self.second, self.lines = now, 0
        if self.lines >= LOG_BURST:
            self.dropped += 1
            return
        self.lines += 1
        peer = scope.get("client") or ("?", 0)
        more = f" ({self.dropped} more not logged)" if self.dropped else ""
        self.dropped = 0
        log.warning("refused %d %r from %s: %s%s", status, scope.get("path", "")[:80], peer[0], why, more)


@dataclass
class FleetGate:
    """The ASGI app the Fleet listener serves: Flower's app behind the checks of the module docstring."""

    app: Callable[[Scope, Receive, Send], Awaitable[None]]
    max_request: int
    max_message: int
    ledger: Ledger = field(default_factory=Ledger)
    locks: dict[tuple[Who, str], list[Any]] = field(default_factory=dict)  # reply -> [its lock, its holders]
    refused: RefusalLog = field(default_factory=RefusalLog)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].startswith(FLEET):
            return await self.refuse(scope, send, 404, "this listener serves the Fleet API only")
        path = scope["path"]
        names = [name.lower() for name, _ in scope.get("headers", [])]
        if any(names.count(name) > 1 for name in AUTH_HEADERS):
            return await self.refuse(scope, send, 400, "an authentication header twice")
        limit = PUSH_CAP if path == PUSH_MESSAGES else self.max_request
        body = await read_body(scope, receive, limit)
        if body is None:
            return await self.refuse(scope, send, 413, f"request body over {limit / MIB:.4g} MiB")
        if path not in (PUSH_MESSAGES, PUSH_OBJECT):
            return await forward(self.app, scope, receive, body, send)
        read = read_push if path == PUSH_MESSAGES else read_object
        pushed = await asyncio.to_thread(read, body)  # parsing and hashing: never on the loop
        if isinstance(pushed, tuple):
            return await self.refuse(scope, send, *pushed)
        step = self.push_reply if path == PUSH_MESSAGES else self.push_object
        await step(scope, receive, send, body, pushed)

    async def push_reply(self, scope: Scope, receive: Receive, send: Send, body: bytes, pushed: Pushed) -> None:
        """A reply, passed on unless this node's answer to the same message was pushed already (its
        own tree again is a retry until an object of it is stored); its budget set when Flower first
        accepts it (before the node has the answer: it pushes objects at once)."""
        from flwr.proto.fleet_pb2 import PushMessagesResponse

        who = pushed.node
        async with self.holding(who, pushed.answers):
            known = self.ledger.reply(who, pushed.answers)
            if self.ledger.spent_on(who, pushed.answers) or (
                known is not None and (known.root != pushed.root or known.stored)
            ):
                return await self.refuse(scope, send, 403, "a reply to that message was pushed already")

            def accepted(status: int, answer: bytes) -> None:
                response = parsed(PushMessagesResponse, answer) if status == 200 and known is None else None
                if response is not None and response.objects_to_push:  # Flower stored it (refused: none asked)
                    objects = list(response.objects_to_push)[: pushed.objects]
                    self.ledger.accept(who, pushed.answers, pushed.root, objects, self.max_message)

            await forward(self.app, scope, receive, body, send, accepted)

    async def push_object(self, scope: Scope, receive: Receive, send: Send, body: bytes, pushed: Pushed) -> None:
        """An object of one of the node's accepted replies, within its budget; charged once Flower stored it."""
        from flwr.proto.message_pb2 import PushObjectResponse

        who = pushed.node
        answers = self.ledger.answers_for(who, pushed.object_id)
        if answers is None:
            return await self.refuse(scope, send, 403, "an object of no reply pushed here")
        async with self.holding(who, answers):
            reply = self.ledger.reply(who, answers)
            if reply is None:
                return await self.refuse(scope, send, 403, "an object of no reply pushed here")
            if pushed.size > reply.budget:
                return await self.refuse(scope, send, 413, f"a reply over {self.max_message / MIB:.4g} MiB")

            def charged(status: int, answer: bytes) -> None:
                response = parsed(PushObjectResponse, answer) if status == 200 else None
                if response is not None and response.stored:
                    reply.budget -= pushed.size
                    reply.stored = True

            await forward(self.app, scope, receive, body, send, charged)

    @contextlib.asynccontextmanager
    async def holding(self, who: Who, answers: str) -> AsyncIterator[None]:
        """One request at a time for a node's reply to one message (its lock gone with its last holder)."""
        held = self.locks.setdefault((who, answers), [asyncio.Lock(), 0])
        held[1] += 1
        try:
            async with held[0]:
                yield
        finally:
            held[1] -= 1
            if not held[1]:
                del self.locks[(who, answers)]

    async def refuse(self, scope: Scope, send: Send, status: int, why: str) -> None:
        self.refused(scope, status, why)
        body = f'{{"detail": "{why}"}}'.encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def read_push(body: bytes) -> Pushed | tuple[int, str]:
    """A push of messages as Pushed, or (status, why) it is refused: not one reply, or too many objects."""
    from flwr.proto.fleet_pb2 import PushMessagesRequest

    request = parsed(PushMessagesRequest, body)
    if request is None:
        return 400, "not a push of messages"
    if len(request.messages_list) != 1 or len(request.message_object_trees) != 1:
        return 403, "a push holds exactly one message"
    metadata = request.messages_list[0].metadata
    if not metadata.reply_to_message_id:
        return 403, "a node pushes replies only"
    if metadata.src_node_id != request.node.node_id:  # the request's node is the one Flower authenticates
        return 403, "a reply in another node's name"
    objects = count(request.message_object_trees[0], MAX_OBJECTS + 1)
    if objects > MAX_OBJECTS:
        return 413, f"a reply of over {MAX_OBJECTS} objects"
    return Pushed(
        request.node.node_id, metadata.reply_to_message_id, request.message_object_trees[0].object_id, objects
    )


def read_object(body: bytes) -> Pushed | tuple[int, str]:
    """A push of an object as Pushed, or (status, why) it is refused: its content is not what its id hashes."""
    from flwr.proto.message_pb2 import PushObjectRequest

    request = parsed(PushObjectRequest, body)
    if request is None:
        return 400, "not a push of an object"
    if hashlib.sha256(request.object_content).hexdigest() != request.object_id:  # Flower's object id
        return 403, "an object whose content is not what its id hashes"
    return Pushed(request.node.node_id, object_id=request.object_id, size=len(request.object_content))


def parsed(kind: type, body: bytes) -> Any:
    """`body` as the protobuf message `kind`, None if it is not one."""
    from google.protobuf.message import DecodeError

    message = kind()
    try:
        message.ParseFromString(body)
    except DecodeError:
        return None
    return message


def count(tree: Any, cap: int) -> int:
    """The objects of a message's object tree, counted no further than `cap` (iteratively: a deep
    tree is no recursion bomb)."""
    total, todo = 0, [tree]
    while todo and total < cap:
        node = todo.pop()
        total += 1
        todo.extend(node.children)
    return total


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes | None:
    """The request's body, or None once it is known to exceed `limit` (from its Content-Length
    before anything is read, else as it arrives: a chunked body too)."""
    headers = dict(scope.get("headers", []))
    declared = headers.get(b"content-length", b"0")
    if not declared.isdigit() or int(declared) > limit:
        return None
    body = bytearray()
    while True:
        event = await receive()
        body += event.get("body", b"")
        if len(body) > limit:
            return None
        if not event.get("more_body", False):
            return bytes(body)


async def forward(
    app: Callable,
    scope: Scope,
    receive: Receive,
    body: bytes,
    send: Send,
    done: Callable[[int, bytes], None] = lambda status, answer: None,
) -> None:
    """Call `app` with the body already read (then the client's own events: a disconnect when it
    goes); its response sent on, and handed to `done` with its status before its last part is sent
    (the answer's first PUSH_CAP bytes: what a push's answer takes)."""
    status, response = [0], bytearray()
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> dict[str, Any]:
        return pending.pop() if pending else await receive()

    async def keep(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status[0] = message["status"]
        elif message["type"] == "http.response.body" and len(response) < PUSH_CAP:
            response.extend(message.get("body", b""))
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            done(status[0], bytes(response))
        await send(message)

    await app(scope, replay, keep)
