"""The round loop: one run's server side and a transport to its client side.

A round is plan -> train -> transform -> aggregate (-> transform) -> apply -> observe, and
every few rounds evaluate. It is split where a real federation splits it: the server side
(server.py) plans the round and gives each planned client its start weights and what its
objective broadcasts; a transport (exchange.py) carries them to the client side (clients.py),
which trains each planned client to its update, and carries the updates back; the server folds
each into the round as it arrives (fold.py) and concludes it. The simulator's transport calls
the client side in process (simulator.py); a Flower federation's sends messages to SuperNodes
(incofl.deploy.server.transport). The engine is the same for both: it names no transport, method,
model family or model (a test greps it).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from incofl.fl.contracts import Round, RoundReport
from incofl.fl.engine.exchange import MissingClients, Transport
from incofl.fl.engine.fold import RoundFold
from incofl.fl.engine.server import Server
from incofl.fl.stages.evaluation import Scores
from incofl.fl.stages.layout import ClientEval


class Engine:
    """One run's rounds (module docstring): `run_round`, `evaluate`, and the checkpoint of both sides.
    `allow_missing`: a round goes on without planned clients the transport got no accepted reply
    from (rounds.csv names them); otherwise the run stops naming them."""

    tick: Callable[[], object] | None = None  # called as each client's update is folded in (a progress bar)

    def __init__(self, server: Server, transport: Transport, allow_missing: bool = False):
        self.server, self.transport, self.allow_missing = server, transport, allow_missing

    def run_round(self, round_: Round) -> RoundReport:
        """Round `round_`: plan -> the transport (train on the client side) -> fold each
        update in as it arrives -> conclude; the round's report."""
        server = self.server
        plans = server.plan(round_)
        fold = RoundFold(server, round_, plans, self.tick)
        why: dict[int, str] = {}
        for reply in self.transport.train(round_, plans, server.start, server.broadcasts(plans)):
            if reply.update is None:
                why[reply.client] = reply.error or "no reply"
                fold.drop(reply.client)
            else:
                fold.add(reply.update)
        missing = sorted(why)
        if missing and not self.allow_missing:
            raise MissingClients(round_, missing, why)
        report = fold.finish()
        if self.transport.lossy:
            report.missing = missing
        return report

    def observe(self, report: RoundReport) -> None:
        self.server.observe(report)

    def evaluate(self, round_: Round) -> dict[str, float]:
        """The metrics after round `round_` (Round(0): before any): the layout scores the global
        weights, and each client model it lists where it must be scored (Layout.on_client: on the
        client side, through the transport) or here."""

        def scores(jobs: list[ClientEval]) -> list[Scores]:
            there = [job for job in jobs if self.server.layout.on_client(job)]
            scored = dict(zip(there, self.transport.score(round_, there, self.server.sub_state), strict=True))
            return [scored[job] if job in scored else self.server.score(job) for job in jobs]

        return self.server.evaluate(scores)

    def fingerprint(self) -> str:
        """The run's weights as one SHA-256: the global weights and what clients keep (fingerprint.py)."""
        return self.server.fingerprint(self.transport.kept_sha256())

    def attach(self, folder: Path) -> None:
        """The run directory's folder for the client side's state beyond its memory budget."""
        self.transport.attach(folder)

    def state_dict(self) -> dict[str, Any]:
        """The server side's state and what the transport holds of the client side."""
        return {**self.server.state_dict(), "clients": self.transport.state_dict()}

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        self.server.load_state_dict(payload)
        self.transport.load_state_dict(payload["clients"])
