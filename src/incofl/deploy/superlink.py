"""`flower-superlink` with its Fleet API on a listener of its own, behind a gate: what `incofl
federation up` starts, and what a real federation's server runs.

    python -m incofl.deploy.superlink --fleet-address HOST:PORT [--max-request-mb 8]
        [--max-message-mb 512] [--max-connections 64] FLOWER_SUPERLINK_ARGS...

Flower 1.42 serves its Fleet (nodes), Control (`flwr run`, `flwr supernode register`, ...) and
Runtime (the ServerApp's) APIs as one FastAPI app on one listener (`--host`, `--port`), and its
Control API has no user authentication without OIDC: every site that reaches that port could
start a run (code that runs as the operator), register keys or unregister other sites' nodes.
This runs Flower's own `flower-superlink` unchanged, with the one app served twice by uvicorn:

- whole, on Flower's `--host`/`--port`, which must be a loopback address (the operator's
  `flwr` commands and the ServerApp's processes, on the server machine);
- on `--fleet-address` (what sites dial), through `FleetGate`: only `POST /v1/fleet/...` (the
  routes of Flower's Fleet router; anything else is 404 before Flower sees it), a request body of
  at most `--max-request-mb` (413 before it is read: Flower reads each body whole into memory;
  its arrays travel in chunks of 5 MiB), at most `--max-connections` requests at once (uvicorn's
  `limit_concurrency`: 503 beyond), a push of replies only (a node has no instruction to give:
  one without `reply_to` is 403), of at most MAX_OBJECTS objects, and whose objects (those Flower
  asks the node for) add up to at most `--max-message-mb` (413 for the object that would pass it;
  an object no accepted push asked for is 403).

With `--database FILE` (as `up` starts it) Flower keeps its state and objects in SQLite on disk,
not in memory. What a node can then make the server hold: per request, the body cap (times the
connections); per reply, the message cap, one reply per instruction (Flower's check), which the
ServerApp pulls whole. It refuses any Flower but 1.42.0 (its internals are reached into), and a
non-loopback `--host` (one line, exit 2).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import ipaddress
import sys
import types
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from incofl.deploy.supernode import require_flower

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

FLEET = "/v1/fleet/"  # the prefix of Flower 1.42's Fleet router (superlink/routers/fleet/router.py)
PUSH_MESSAGES, PUSH_OBJECT = FLEET + "push-messages", FLEET + "push-object"
MAX_OBJECTS = 20_000  # objects one reply may declare (a model's arrays and their 5 MiB chunks: hundreds)
TRACKED = 4096  # replies whose objects the gate remembers (the oldest forgotten first)
MIB = 1 << 20


@dataclass
class FleetGate:
    """The ASGI app the Fleet listener serves: Flower's app behind the checks of the module docstring."""

    app: Callable[[Scope, Receive, Send], Awaitable[None]]
    max_request: int
    max_message: int
    budgets: OrderedDict[str, int] = field(default_factory=OrderedDict)  # reply -> bytes its objects may still add
    owner: dict[str, str] = field(default_factory=dict)  # object Flower asked for -> its reply

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].startswith(FLEET):
            return await refuse(send, 404, "this listener serves the Fleet API only")
        body = await read_body(scope, receive, self.max_request)
        if body is None:
            return await refuse(send, 413, f"request body over {self.max_request // MIB} MiB")
        path = scope["path"]
        why = self.check_push(body) if path == PUSH_MESSAGES else self.check_object(body) if path == PUSH_OBJECT else ""
        if why:
            return await refuse(send, 413 if "over" in why else 403, why)

        def tracked(status: int, answer: bytes) -> None:  # before the node has the answer: it pushes at once
            if path == PUSH_MESSAGES and status == 200:
                self.track(body, answer)

        await forward(self.app, scope, receive, body, send, bytearray(), tracked)

    def check_push(self, body: bytes) -> str:
        """Why a push of messages is refused ('' if it is not): not one reply, or too many objects."""
        from flwr.proto.fleet_pb2 import PushMessagesRequest

        request = parsed(PushMessagesRequest, body)
        if request is None:
            return ""  # Flower answers what it cannot parse
        if len(request.messages_list) != 1 or len(request.message_object_trees) != 1:
            return "a push holds exactly one message"
        if not request.messages_list[0].metadata.reply_to_message_id:
            return "a node pushes replies only"
        if count(request.message_object_trees[0]) > MAX_OBJECTS:
            return f"a reply of over {MAX_OBJECTS} objects"
        return ""

    def check_object(self, body: bytes) -> str:
        """Why an object is refused: no accepted reply asked for it, or it takes its reply over the cap."""
        from flwr.proto.message_pb2 import PushObjectRequest

        request = parsed(PushObjectRequest, body)
        if request is None:
            return ""
        reply = self.owner.get(request.object_id)
        if reply is None or reply not in self.budgets:
            return "an object of no reply pushed here"
        self.budgets[reply] -= len(request.object_content)
        if self.budgets[reply] < 0:
            return f"a reply over {self.max_message // MIB} MiB"
        return ""

    def track(self, body: bytes, response: bytes) -> None:
        """Remember the objects Flower asked for (its response) as the reply's, with the reply's budget."""
        from flwr.proto.fleet_pb2 import PushMessagesRequest, PushMessagesResponse

        request, answer = parsed(PushMessagesRequest, body), parsed(PushMessagesResponse, response)
        if request is None or answer is None:
            return
        reply = request.message_object_trees[0].object_id
        self.budgets[reply] = self.max_message
        self.owner.update(dict.fromkeys(answer.objects_to_push, reply))
        while len(self.budgets) > TRACKED:
            old, _ = self.budgets.popitem(last=False)
            self.owner = {oid: r for oid, r in self.owner.items() if r != old}


def parsed(kind: type, body: bytes) -> Any:
    """`body` as the protobuf message `kind`, None if it is not one."""
    from google.protobuf.message import DecodeError

    message = kind()
    try:
        message.ParseFromString(body)
    except DecodeError:
        return None
    return message


def count(tree: Any) -> int:
    """The objects of a message's object tree (iteratively: a deep tree is no recursion bomb)."""
    total, todo = 0, [tree]
    while todo:
        node = todo.pop()
        total += 1
        todo.extend(node.children)
    return total


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes | None:
    """The request's body, or None once it is known to exceed `limit` (from its Content-Length
    before anything is read, else as it arrives)."""
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
    response: bytearray,
    done: Callable[[int, bytes], None] = lambda status, answer: None,
) -> int:
    """Call `app` with the body already read (then the client's own events: a disconnect when it
    goes); its response sent on, its body kept in `response` and handed to `done` (with the status)
    before its last part is sent; its status."""
    status = {"code": 0}
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> dict[str, Any]:
        return pending.pop() if pending else await receive()

    async def keep(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status["code"] = message["status"]
        elif message["type"] == "http.response.body" and len(response) < MAX_OBJECTS * 100:
            response.extend(message.get("body", b""))
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            done(status["code"], bytes(response))
        await send(message)

    await app(scope, replay, keep)
    return status["code"]


async def refuse(send: Send, status: int, why: str) -> None:
    body = f'{{"detail": "{why}"}}'.encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def address(text: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets) as (host, port); argparse's error otherwise."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r}: not HOST:PORT")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class Limits:
    fleet: tuple[str, int]
    max_request: int
    max_message: int
    max_connections: int


def two_listeners(limits: Limits) -> types.ModuleType:
    """`uvicorn`, but with `run` serving Flower's app whole on its own address (loopback) and
    through FleetGate on the Fleet address, in one event loop; signals stop both."""
    import uvicorn

    class Quiet(uvicorn.Server):  # the loopback server handles the signals; this one is stopped with it
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    def run(app: Any, host: str, port: int, **options: Any) -> None:
        options.pop("workers", None)
        options.pop("reload", None)
        whole = uvicorn.Server(uvicorn.Config(app, host=host, port=port, **options))
        gate = FleetGate(app, limits.max_request, limits.max_message)
        fleet_host, fleet_port = limits.fleet
        fleet = Quiet(
            uvicorn.Config(
                gate,
                host=fleet_host,
                port=fleet_port,
                lifespan="off",  # Flower's lifespan (its SuperExec, its state) runs once, in the loopback server
                limit_concurrency=limits.max_connections,
                **options,
            )
        )

        async def both() -> None:
            task = asyncio.create_task(fleet.serve())
            try:
                await whole.serve()
            finally:
                fleet.should_exit = True
                await task

        asyncio.run(both())

    shim = types.ModuleType("uvicorn")
    shim.__dict__.update(uvicorn.__dict__)
    shim.run = run  # type: ignore[attr-defined]
    return shim


def flag_value(argv: list[str], flag: str, default: str) -> str:
    """The last value of `flag` in `argv` (`--flag V` or `--flag=V`), as argparse would take it."""
    value = default
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def parse(argv: list[str]) -> tuple[Limits, list[str]]:
    """This wrapper's flags, and Flower's (the rest); a loopback `--host` required (one line, exit 2)."""
    parser = argparse.ArgumentParser(prog="python -m incofl.deploy.superlink", description=__doc__.split("\n\n")[0])
    parser.add_argument("--fleet-address", type=address, required=True, help="HOST:PORT the sites dial")
    parser.add_argument("--max-request-mb", type=float, default=8.0, help="the largest request body")
    parser.add_argument("--max-message-mb", type=float, default=512.0, help="the largest reply, its objects summed")
    parser.add_argument("--max-connections", type=int, default=64, help="requests served at once on the Fleet port")
    ours, flower = parser.parse_known_args(argv)
    host = flag_value(flower, "--host", "127.0.0.1")  # Flower's default (UVICORN_DEFAULT_HOST)
    if not loopback(host):
        parser.error(f"--host {host}: the Control and Runtime APIs listen on a loopback address only")
    for flag in ("--fleet-api-address", "--control-api-address"):
        if flag in flower:
            parser.error(f"{flag}: not with this wrapper (--fleet-address, and --host/--port for the rest)")
    if not min(ours.max_request_mb, ours.max_message_mb) > 0 or ours.max_connections < 1:
        parser.error("--max-request-mb, --max-message-mb and --max-connections must be positive")
    limits = Limits(
        ours.fleet_address, int(ours.max_request_mb * MIB), int(ours.max_message_mb * MIB), ours.max_connections
    )
    return limits, flower


def main() -> None:
    require_flower("python -m incofl.deploy.superlink")
    limits, flower = parse(sys.argv[1:])
    cli = importlib.import_module("flwr.superlink.cli.flower_superlink")  # the package exports a function of that name
    cli.uvicorn = two_listeners(limits)  # type: ignore[assignment]
    sys.argv = ["flower-superlink", *flower]
    cli.flower_superlink()


if __name__ == "__main__":
    main()
