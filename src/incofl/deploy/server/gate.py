"""The gate of the sites' port: the Fleet protocol's own rules, which no proxy in front can know
(what a node may push, in whose name, within what budget), applied to each request before Flower's
app sees it. superlink.py serves Flower's Fleet API through it; TLS, client certificates,
connections, heads and rates are the edge proxy's, which may take each route's cap from
`route_caps()`.

1. only `POST` to a route of Flower 1.42's Fleet router (`ROUTES`; 404 otherwise); none of Flower's
   authentication headers twice (400: Flower reads the first); a Content-Type of exactly Flower's
   PROTOBUF_MEDIA_TYPE, once (415 otherwise: Flower logs an ERROR line for each); a body within its
   route's cap (413 as soon as it is known to pass), that parses as its route's request (400
   otherwise), so that Flower parses only what the gate parsed;
2. parsing and hashing (requests, and Flower's answers to pushes) in a worker thread, never on the
   loop that serves the rest;
3. a push of exactly one reply (a node has no instruction to give), in the name of the node that
   sends it (the request's node, which Flower authenticates), of at most MAX_OBJECTS objects,
   counted no further than that; an object whose content hashes to its id, that an accepted reply
   of the pushing node asked for, within that reply's budget (`Ledger`, by node id: whatever its
   headers spell, a node is the node its requests name, which Flower checks against the key).

The budget of a node's reply is `max_message`, set once when Flower first accepts the reply (a 200
that asks for objects) and never re-armed: a second push answering the same message is a retry only
with the same tree and while no object of it is stored (403 otherwise: a reply the server pulled
and deleted is not stored again), and one answering a message whose reply the gate forgot is 403.
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

from incofl.deploy.flower.fleet import (
    AUTH_HEADERS,
    MAX_OBJECTS,
    MEDIA_TYPE,
    MIB,
    PUSH_MESSAGES,
    PUSH_OBJECT,
    ROUTES,
    answer_of,
    request_of,
)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Who = int  # a node: the node id of its requests, which Flower authenticates (the key must be that node's)

REPLIES_PER_NODE = 8  # replies of one node whose budgets the gate holds (the oldest forgotten first)
SPENT_PER_NODE = 4096  # messages per node whose forgotten replies may not be pushed again
LOG_BURST = 5  # refusal lines a second, at most
log = logging.getLogger("incofl.gate")


@dataclass
class Budget:
    """What one reply of one node may still add: its tree (a retry pushes the same), its bytes left,
    and whether Flower stored an object of it (no retry after that)."""

    root: str
    left: int
    objects: set[str]
    stored: bool = False


@dataclass
class Ledger:
    """Each node's accepted replies (by the message they answer) and which reply owns each object it
    was asked for; at most REPLIES_PER_NODE a node, the oldest forgotten into `spent`."""

    replies: dict[Who, OrderedDict[str, Budget]] = field(default_factory=dict)
    owner: dict[Who, dict[str, str]] = field(default_factory=dict)  # object asked for -> the message its reply answers
    spent: dict[Who, OrderedDict[str, None]] = field(default_factory=dict)

    def accept(self, who: Who, answers: str, root: str, objects: list[str], budget: int) -> None:
        replies = self.replies.setdefault(who, OrderedDict())
        replies[answers] = Budget(root, budget, set(objects))
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

    def reply(self, who: Who, answers: str) -> Budget | None:
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
    max_message: int
    ledger: Ledger = field(default_factory=Ledger, init=False)
    locks: dict[tuple[Who, str], list[Any]] = field(default_factory=dict, init=False)  # reply -> [lock, holders]
    refused: RefusalLog = field(default_factory=RefusalLog, init=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or scope["method"] != "POST" or path not in ROUTES:
            return await self.refuse(scope, send, 404, "this listener serves the Fleet API's routes only")
        headers = [(name.lower(), value) for name, value in scope.get("headers", [])]
        names = [name for name, _ in headers]
        if any(names.count(name) > 1 for name in AUTH_HEADERS):
            return await self.refuse(scope, send, 400, "an authentication header twice")
        if [value for name, value in headers if name == b"content-type"] != [MEDIA_TYPE]:
            return await self.refuse(scope, send, 415, f"a Content-Type other than {MEDIA_TYPE.decode()}")
        cap = ROUTES[path][1]
        body = await read_body(scope, receive, cap)
        if body is None:
            return await self.refuse(scope, send, 413, f"a request body over {cap} bytes")
        pushed = await asyncio.to_thread(read, path, body)  # parsing and hashing: never on the loop
        if isinstance(pushed, tuple):
            return await self.refuse(scope, send, *pushed)
        if pushed is None:
            return await forward(self.app, scope, receive, body, send)
        step = self.push_reply if path == PUSH_MESSAGES else self.push_object
        await step(scope, receive, send, body, pushed)

    async def push_reply(self, scope: Scope, receive: Receive, send: Send, body: bytes, pushed: Pushed) -> None:
        """A reply, passed on unless this node's answer to the same message was pushed already (its
        own tree again is a retry until an object of it is stored); its budget set when Flower first
        accepts it (before the node has the answer: it pushes objects at once)."""
        who = pushed.node
        async with self.holding(who, pushed.answers):
            known = self.ledger.reply(who, pushed.answers)
            if self.ledger.spent_on(who, pushed.answers) or (
                known is not None and (known.root != pushed.root or known.stored)
            ):
                return await self.refuse(scope, send, 403, "a reply to that message was pushed already")

            async def accepted(status: int, answer: bytes) -> None:
                if status != 200 or known is not None:
                    return
                response = await asyncio.to_thread(parsed, answer_of(PUSH_MESSAGES), answer)
                if response is not None and response.objects_to_push:  # Flower stored it (refused: none asked)
                    objects = list(response.objects_to_push)[: pushed.objects]
                    self.ledger.accept(who, pushed.answers, pushed.root, objects, self.max_message)

            await forward(self.app, scope, receive, body, send, accepted)

    async def push_object(self, scope: Scope, receive: Receive, send: Send, body: bytes, pushed: Pushed) -> None:
        """An object of one of the node's accepted replies, within its budget; charged once Flower stored it."""
        who = pushed.node
        answers = self.ledger.answers_for(who, pushed.object_id)
        if answers is None:
            return await self.refuse(scope, send, 403, "an object of no reply pushed here")
        async with self.holding(who, answers):
            reply = self.ledger.reply(who, answers)
            if reply is None:
                return await self.refuse(scope, send, 403, "an object of no reply pushed here")
            if pushed.size > reply.left:
                return await self.refuse(scope, send, 413, f"a reply over {self.max_message / MIB:.4g} MiB")

            async def charged(status: int, answer: bytes) -> None:
                response = await asyncio.to_thread(parsed, answer_of(PUSH_OBJECT), answer) if status == 200 else None
                if response is not None and response.stored:
                    reply.left -= pushed.size
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


def read(path: str, body: bytes) -> Pushed | tuple[int, str] | None:
    """A request of a Fleet route: a push as Pushed, another as None, or (status, why) it is refused
    (its body is not its route's message, or a push breaks the rules of `read_push`, `read_object`)."""
    request = parsed(request_of(path), body)
    if request is None:
        return 400, f"not a {request_of(path).__name__}"
    return read_push(request) if path == PUSH_MESSAGES else read_object(request) if path == PUSH_OBJECT else None


def read_push(request: Any) -> Pushed | tuple[int, str]:
    """A push of messages as Pushed, or (status, why) it is refused: not one reply, or too many objects."""
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


def read_object(request: Any) -> Pushed | tuple[int, str]:
    """A push of an object as Pushed, or (status, why) it is refused: its content is not what its id hashes."""
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
    done: Callable[[int, bytes], Awaitable[None]] | None = None,
) -> None:
    """Call `app` with the body already read (then the client's own events: a disconnect when it
    goes); its response sent on. With `done`, the response's body is held back and handed to `done`
    with its status, and only then sent: Flower's app answers through Starlette's
    BaseHTTPMiddleware, which sends the body in one part and then an empty last one, so a node has
    the whole answer from the first part and pushes what it asks for at once; the gate's ledger
    must hold what the answer says before that (an answer to a push: the ids of at most the
    MAX_OBJECTS objects the push declared, within PUSH_CAP)."""
    status, held = [0], bytearray()
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> dict[str, Any]:
        return pending.pop() if pending else await receive()

    async def keep(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status[0] = message["status"]
        if done is None or message["type"] != "http.response.body":
            return await send(message)
        held.extend(message.get("body", b""))
        if not message.get("more_body", False):
            await done(status[0], bytes(held))
            await send({"type": "http.response.body", "body": bytes(held), "more_body": False})

    await app(scope, replay, keep)
