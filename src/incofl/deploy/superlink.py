"""`flower-superlink` with its Fleet API on a listener of its own, behind the gate: what `incofl
federation up` starts, and what a real federation's server runs behind its edge proxy.

    python -m incofl.deploy.superlink --fleet-socket PATH [--max-message-mb 512]
        FLOWER_SUPERLINK_ARGS...

Flower 1.42 serves its Fleet (nodes), Control (`flwr run`, `flwr supernode register`, ...) and
Runtime (the ServerApp's) APIs as one FastAPI app on one listener (`--host`, `--port`), and its
Control API has no user authentication without OIDC: every site that reaches that port could
start a run (code that runs as the operator), register keys or unregister other sites' nodes.
This runs Flower's own `flower-superlink` unchanged, with the one app served twice by uvicorn:

- whole, on Flower's `--host`/`--port`, which must be a loopback address (the operator's
  `flwr` commands and the ServerApp's processes, on the server machine);
- the Fleet API alone, through `FleetGate` (gate.py: the protocol's own rules), as plain HTTP on
  the unix socket `--fleet-socket` (made 0600 in a private folder), which only the edge proxy
  dials (edge.py: nginx terminates the sites' TLS and bounds every connection, head and body
  before a byte reaches this process). The sites' port is nginx's, never this process's.

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
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from incofl.config import ConfigError
from incofl.deploy.credentials import check_private
from incofl.deploy.gate import MIB, FleetGate, log
from incofl.deploy.supernode import require_flower

PRUNE_EVERY = 30.0  # seconds between two clean-ups of finished runs (prune_finished)


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
    through FleetGate on the Fleet socket, in one event loop; signals stop both."""
    import uvicorn

    class Quiet(uvicorn.Server):  # the loopback server handles the signals; this one is stopped with it
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    def run(app: Any, host: str, port: int, **options: Any) -> None:
        options.pop("workers", None)
        options.pop("reload", None)
        whole = uvicorn.Server(uvicorn.Config(app, host=host, port=port, **options))
        gate = FleetGate(app, limits.max_message)
        plain = {k: v for k, v in options.items() if not k.startswith("ssl_")}  # nginx terminates the sites' TLS
        fleet = Quiet(
            uvicorn.Config(
                gate,
                uds=str(limits.fleet),
                lifespan="off",  # Flower's lifespan (its SuperExec, its state) runs once, in the loopback server
                **{**plain, "access_log": False},  # refusals: the gate's own bounded lines
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

        with contextlib.suppress(FileNotFoundError):
            limits.fleet.unlink()  # an earlier run's socket (its folder is private: no one else's)
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
