"""`flower-superlink` with its Fleet API on a listener of its own, behind the gate: what `incofl
federation up` starts, and what a real federation's server runs behind its edge proxy.

    python -m incofl.deploy.superlink --fleet-socket PATH [--max-message-mb 512]
        FLOWER_SUPERLINK_ARGS...

Flower 1.42 serves its Fleet (nodes), Control (`flwr run`, `flwr supernode register`, ...) and
Runtime (the ServerApp's) APIs as one FastAPI app on one listener (`--host`, `--port`), and its
Control API has no user authentication without OIDC: every site that reaches that port could
start a run (code that runs as the operator), register keys or unregister other sites' nodes.
This runs Flower's own `flower-superlink` through the Flower adapter (flower/link.py), with the one
app served twice by uvicorn:

- whole, on Flower's `--host`/`--port`, which must be a loopback address (the operator's
  `flwr` commands and the ServerApp's processes, on the server machine);
- the Fleet API alone, through `FleetGate` (server/gate.py: the protocol's own rules), as plain HTTP on
  the unix socket `--fleet-socket` (made 0600 in a private folder), which only the edge proxy
  dials (edge.py: nginx terminates the sites' TLS and bounds every connection, head and body
  before a byte reaches this process). The sites' port is nginx's, never this process's.

With `--database FILE` (as `up --link-state disk` starts it) Flower keeps its state and objects in SQLite on disk,
not in memory. It refuses any Flower but the adapter's, and a non-loopback `--host` (one line,
exit 2).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from incofl.config import ConfigError
from incofl.deploy.flower import require
from incofl.deploy.flower.link import run
from incofl.deploy.server.gate import MIB, FleetGate, log
from incofl.deploy.wire.credentials import check_private


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Limits:
    fleet: Path  # the unix socket of the Fleet listener (the edge proxy's upstream)
    max_message: int


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
    parser.add_argument("--fleet-socket", type=Path, required=True, help="the unix socket the edge proxy dials")
    parser.add_argument("--max-message-mb", type=float, default=512.0, help="the largest reply, its objects summed")
    ours, flower = parser.parse_known_args(argv)
    host = flag_value(flower, "--host", "127.0.0.1")  # Flower's default (UVICORN_DEFAULT_HOST)
    if not loopback(host):
        parser.error(f"--host {host}: the Control and Runtime APIs listen on a loopback address only")
    for flag in ("--fleet-api-address", "--control-api-address"):
        if flag in flower:
            parser.error(f"{flag}: not with this wrapper (--fleet-socket, and --host/--port for the rest)")
    if not ours.max_message_mb > 0:
        parser.error("--max-message-mb must be positive")
    folder = ours.fleet_socket.resolve().parent
    try:
        check_private(folder)  # uvicorn makes the socket 0666: its folder keeps others out
    except (ConfigError, OSError) as err:
        parser.error(f"--fleet-socket {ours.fleet_socket}: its folder must exist and be private (mode 0700): {err}")
    limits = Limits(ours.fleet_socket.resolve(), int(ours.max_message_mb * MIB))
    return limits, flower


def main() -> None:
    require("python -m incofl.deploy.superlink")
    limits, flower = parse(sys.argv[1:])
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    run(flower, limits.fleet, partial(FleetGate, max_message=limits.max_message))


if __name__ == "__main__":
    main()
