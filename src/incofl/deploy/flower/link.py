"""`flower-superlink` with its one app served twice, and its clean-up of finished runs made
periodic (Flower RELEASE's SuperLink).

Flower serves its Fleet (nodes), Control (`flwr run`, `flwr supernode register`, ...) and Runtime
(the ServerApp's) APIs as one FastAPI app on one listener, which its CLI starts with `uvicorn.run`
(`flwr/superlink/cli/flower_superlink.py`); its Control API has no user authentication without
OIDC. `run` runs Flower's own `flower-superlink` with that module's `uvicorn` replaced by one whose
`run` serves the app whole on Flower's own address (loopback: the entry point checks it) and, in the
same event loop, `fleet(app)` (the caller's wrapper: the gate) on a unix socket; signals stop both.

Flower cleans up a finished run (`LinkState.cleanup_run`: its messages, their objects, its upload
sessions) only when a later request names that run or `flwr ls` lists it, so replies never pulled
stay in its database until then; `prune` does it every PRUNE_EVERY seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

PRUNE_EVERY = 30.0  # seconds between two clean-ups of finished runs (prune_finished)
Asgi = Callable[..., Any]
log = logging.getLogger("incofl.gate")  # the Fleet listener's: the gate's lines and these


async def prune(app: Any) -> None:
    """Every PRUNE_EVERY seconds, `prune_finished` (in a worker thread); a failure logged, tried again."""
    while True:
        await asyncio.sleep(PRUNE_EVERY)
        try:
            await asyncio.to_thread(prune_finished, app)
        except Exception as err:  # noqa: BLE001 (a database busy for a moment: the next turn tries again)
            log.warning("pruning finished runs failed: %s", err)


def prune_finished(app: Any) -> list[int]:
    """Flower's own clean-up of each finished run (module docstring). What is kept of a finished run
    is its row, its logs and its traffic counts (`flwr ls`, `flwr log`); a resume needs none of it
    (the run's checkpoint is the ServerApp's). The runs cleaned."""
    from flwr.common.constant import Status

    state = app.state.linkstate_factory.state()
    finished = [run.run_id for run in state.get_run_info(statuses=[Status.FINISHED])]
    for run_id in finished:
        state.cleanup_run(run_id)
    return finished


def two_listeners(socket: Path, fleet: Callable[[Asgi], Asgi]) -> types.ModuleType:
    """`uvicorn`, but with `run` serving Flower's app whole on its own address and `fleet(app)` on
    the unix socket `socket`, in one event loop; signals stop both."""
    import uvicorn

    class Quiet(uvicorn.Server):  # the loopback server handles the signals; this one is stopped with it
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    def run(app: Any, host: str, port: int, **options: Any) -> None:
        options.pop("workers", None)
        options.pop("reload", None)
        whole = uvicorn.Server(uvicorn.Config(app, host=host, port=port, **options))
        plain = {k: v for k, v in options.items() if not k.startswith("ssl_")}  # the edge proxy terminates TLS
        wrapped = Quiet(
            uvicorn.Config(
                fleet(app),
                uds=str(socket),
                lifespan="off",  # Flower's lifespan (its SuperExec, its state) runs once, in the loopback server
                **{**plain, "access_log": False},  # refusals: the wrapper's own bounded lines
            )
        )

        async def both() -> None:
            task, pruning = asyncio.create_task(wrapped.serve()), asyncio.create_task(prune(app))
            try:
                await whole.serve()
            finally:
                wrapped.should_exit = True
                pruning.cancel()
                await task

        with contextlib.suppress(FileNotFoundError):
            socket.unlink()  # an earlier run's socket (its folder is private: no one else's)
        asyncio.run(both())

    shim = types.ModuleType("uvicorn")
    shim.__dict__.update(uvicorn.__dict__)
    shim.run = run  # type: ignore[attr-defined]
    return shim


def run(flower_args: list[str], socket: Path, fleet: Callable[[Asgi], Asgi]) -> None:
    """Flower's `flower-superlink` with `flower_args`, its app also served as `fleet(app)` on `socket`."""
    cli = importlib.import_module("flwr.superlink.cli.flower_superlink")  # the package exports a function of that name
    cli.uvicorn = two_listeners(socket, fleet)  # type: ignore[attr-defined]
    sys.argv = ["flower-superlink", *flower_args]
    cli.flower_superlink()
