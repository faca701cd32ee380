"""`flower-superlink` with its Fleet API on a listener of its own, behind a gate: what `incofl
federation up` starts, and what a real federation's server runs.

    python -m incofl.deploy.superlink --fleet-address HOST:PORT [--max-request-mb 8]
        [--max-message-mb 512] [--max-connections 64] [--max-connections-per-peer 16]
        [--request-timeout 10] FLOWER_SUPERLINK_ARGS...

Flower 1.42 serves its Fleet (nodes), Control (`flwr run`, `flwr supernode register`, ...) and
Runtime (the ServerApp's) APIs as one FastAPI app on one listener (`--host`, `--port`), and its
Control API has no user authentication without OIDC: every site that reaches that port could
start a run (code that runs as the operator), register keys or unregister other sites' nodes.
This runs Flower's own `flower-superlink` unchanged, with the one app served twice by uvicorn:

- whole, on Flower's `--host`/`--port`, which must be a loopback address (the operator's
  `flwr` commands and the ServerApp's processes, on the server machine);
- on `--fleet-address` (what sites dial), the sites' port, held by uvicorn's own settings and
  `FleetGate`, in this order:
  1. with TLS, mutual TLS: a handshake finishes only with a peer that shows a certificate issued by
     the CA of Flower's `--ssl-ca-certfile` (`incofl federation export` issues one a site), within
     `--request-timeout` seconds; a peer without one never sends a request;
  2. a connection that has not sent a complete request (head and body) within `--request-timeout`
     seconds of opening, or of its last answer, is closed; a request head over 16 KiB closes it;
     at most `--max-connections-per-peer` connections from one address (more are closed at once) and
     `--max-connections` requests at once (uvicorn's `limit_concurrency`: 503 beyond);
  3. the gate: only `POST /v1/fleet/...` (404 otherwise); a body of at most `--max-request-mb`, or
     PUSH_CAP for a push of messages (what a tree of MAX_OBJECTS objects takes), 413 as soon as it
     is known to pass; parsing and hashing in a worker thread, never on the loop that serves the
     rest; a push of exactly one reply (a node has no instruction to give), in the name of the node
     that sends it (the request's node, which Flower authenticates), of at most MAX_OBJECTS
     objects, counted no further than that; an object whose content hashes to its id, that an
     accepted reply of the pushing node asked for, within that reply's budget (`Ledger`).

The budget of a node's reply is `--max-message-mb`, set once when Flower first accepts the reply
(a 200 that asks for objects) and never re-armed: a second push answering the same message is a
retry only with the same tree (403 otherwise), and one answering a message whose reply the gate
forgot is 403. An object is charged only once Flower says it stored it; nothing a request that
Flower refuses (no key: 401) sends changes any budget or entry. Refusals are logged, a bounded line
each, at most LOG_BURST a second (`RefusalLog`); uvicorn's access log is off on this listener.

With `--database FILE` (as `up --link-state disk` starts it) Flower keeps its state and objects in SQLite on disk,
not in memory. It refuses any Flower but 1.42.0 (its internals are reached into), and a
non-loopback `--host` (one line, exit 2).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import ipaddress
import logging
import os
import ssl
import sys
import types
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from incofl.deploy.gate import MIB, FleetGate, log
from incofl.deploy.supernode import require_flower

HEAD_CAP = 16 * 1024  # bytes of a request's line and headers
PRUNE_EVERY = 30.0  # seconds between two clean-ups of finished runs (prune_finished)


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
    per_peer: int
    request_timeout: float
    sites_ca: str = ""  # the CA whose certificates the sites' port requires ('' without TLS)


def fleet_protocol(limits: Limits) -> type:
    """uvicorn's HTTP protocol (httptools, which Flower's uvicorn[standard] brings) with the sites'
    port's limits on connections (module docstring, item 2): a deadline for each request, a cap on its
    head, and on the connections of one peer address."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    peers: Counter[str] = Counter()

    class FleetProtocol(HttpToolsProtocol):
        peer, head, deadline = "", 0, None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.peer = (self.client or ("?", 0))[0]
            peers[self.peer] += 1
            if peers[self.peer] > limits.per_peer:
                transport.close()
                return
            self.arm()

        def connection_lost(self, exc: Exception | None) -> None:
            peers[self.peer] -= 1
            if not peers[self.peer]:
                del peers[self.peer]
            self.disarm()
            super().connection_lost(exc)

        def arm(self) -> None:
            self.disarm()
            self.head = 0
            self.deadline = self.loop.call_later(limits.request_timeout, self.transport.close)

        def disarm(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
                self.deadline = None

        def on_url(self, url: bytes) -> None:
            self.grow(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self.grow(len(name) + len(value))
            super().on_header(name, value)

        def grow(self, size: int) -> None:
            self.head += size
            if self.head > HEAD_CAP:
                self.transport.close()

        def on_message_complete(self) -> None:
            self.disarm()  # the request is in: its answer may take as long as Flower takes
            super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self.arm()

    return FleetProtocol


def handshakes_within(seconds: float) -> Callable[[], asyncio.AbstractEventLoop]:
    """An event loop factory whose TLS servers give a handshake `seconds` (asyncio's default: 60)."""

    class Loop(asyncio.SelectorEventLoop):
        async def create_server(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            if kwargs.get("ssl") is not None:
                kwargs.setdefault("ssl_handshake_timeout", seconds)
            return await super().create_server(*args, **kwargs)

    return Loop


async def prune(app: Any) -> None:
    """Every PRUNE_EVERY seconds, `prune_finished` (in a worker thread); a failure logged, tried again."""
    while True:
        await asyncio.sleep(PRUNE_EVERY)
        try:
            await asyncio.to_thread(prune_finished, app)
        except Exception as err:  # noqa: BLE001 (a database busy for a moment: the next turn tries again)
            log.warning("pruning finished runs failed: %s", err)


def prune_finished(app: Any) -> list[int]:
    """Flower's own clean-up of each finished run (`LinkState.cleanup_run`: its messages, their
    objects and its upload sessions), which Flower 1.42 does only when a later request names that
    run or `flwr ls` lists it: replies never pulled (a node's late or unasked ones) stay in its
    database until then. What is kept of a finished run is its row, its logs and its traffic
    counts (`flwr ls`, `flwr log`); a resume needs none of it (the run's checkpoint is the
    ServerApp's). The runs cleaned."""
    from flwr.common.constant import Status

    state = app.state.linkstate_factory.state()
    finished = [run.run_id for run in state.get_run_info(statuses=[Status.FINISHED])]
    for run_id in finished:
        state.cleanup_run(run_id)
    return finished


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
        mutual = {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": limits.sites_ca} if limits.sites_ca else {}
        fleet = Quiet(
            uvicorn.Config(
                gate,
                host=fleet_host,
                port=fleet_port,
                lifespan="off",  # Flower's lifespan (its SuperExec, its state) runs once, in the loopback server
                limit_concurrency=limits.max_connections,
                http=fleet_protocol(limits),
                **{**options, "access_log": False, **mutual},  # refusals: the gate's own bounded lines
            )
        )

        async def both() -> None:
            task, pruning = asyncio.create_task(fleet.serve()), asyncio.create_task(prune(app))
            try:
                await whole.serve()
            finally:
                fleet.should_exit = True
                pruning.cancel()
                await task

        with asyncio.Runner(loop_factory=handshakes_within(limits.request_timeout)) as runner:
            runner.run(both())

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
    parser.add_argument("--max-connections-per-peer", type=int, default=16, help="connections from one address")
    parser.add_argument("--request-timeout", type=float, default=10.0, help="seconds for a handshake or a request")
    ours, flower = parser.parse_known_args(argv)
    host = flag_value(flower, "--host", "127.0.0.1")  # Flower's default (UVICORN_DEFAULT_HOST)
    if not loopback(host):
        parser.error(f"--host {host}: the Control and Runtime APIs listen on a loopback address only")
    for flag in ("--fleet-api-address", "--control-api-address"):
        if flag in flower:
            parser.error(f"{flag}: not with this wrapper (--fleet-address, and --host/--port for the rest)")
    if not min(ours.max_request_mb, ours.max_message_mb, ours.request_timeout) > 0:
        parser.error("--max-request-mb, --max-message-mb and --request-timeout must be positive")
    if min(ours.max_connections, ours.max_connections_per_peer) < 1:
        parser.error("--max-connections and --max-connections-per-peer must be positive")
    sites_ca = "" if "--insecure" in flower else os.path.expanduser(flag_value(flower, "--ssl-ca-certfile", ""))
    if "--insecure" not in flower and not sites_ca:
        parser.error("--ssl-ca-certfile: required with TLS (the sites' port takes only certificates its CA issued)")
    limits = Limits(
        ours.fleet_address,
        int(ours.max_request_mb * MIB),
        int(ours.max_message_mb * MIB),
        ours.max_connections,
        ours.max_connections_per_peer,
        ours.request_timeout,
        sites_ca,
    )
    return limits, flower


def main() -> None:
    require_flower("python -m incofl.deploy.superlink")
    limits, flower = parse(sys.argv[1:])
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    cli = importlib.import_module("flwr.superlink.cli.flower_superlink")  # the package exports a function of that name
    cli.uvicorn = two_listeners(limits)  # type: ignore[assignment]
    sys.argv = ["flower-superlink", *flower]
    cli.flower_superlink()


if __name__ == "__main__":
    main()
