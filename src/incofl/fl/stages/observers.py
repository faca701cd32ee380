"""The observe stage: what a round did, for logs and analyses.

After each round the engine hands every observer a `RoundReport` (samples trained, bytes
uploaded, compute units, per-client training losses, the transforms' diagnostics). An
observer keeps what it needs, checkpoints it, and writes its file when the run ends. Methods
name extra observers in their registry entry (InCo's theta/beta log); the cost log runs for
every method. The analyses (fl/stages/probes.py) are observers that also look at the round's
trained models and averaged updates, in the rounds they ask for.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from incofl.atomic import atomic_path
from incofl.fl.contracts import RoundReport, Setup, State, Trained
from incofl.fl.stages.component import Stateful


class Observer(Stateful):
    """Keeps rows of the reports it is shown; `write` saves them as `filename` (CSV); its
    checkpointed state is its rows. A method's observers are built `(hp, setup)` like every
    component; the engine's analyses (fl/stages/probes.py) from their own inputs."""

    filename = ""
    state = ("rows",)

    def __init__(self, hp: Any = None, setup: Setup | None = None) -> None:
        self.rows: list[dict[str, Any]] = []

    def observe(self, report: RoundReport) -> None:
        """Keep what it needs of the round's report."""

    def wants(self, round_: int) -> bool:
        """Whether to be shown this round's trained client models and averaged updates."""
        return False

    def see_clients(self, round_: int, trained: list[Trained]) -> None:
        """The round's trained clients (fl/stages/probes.py), before any transform of their updates."""

    def see_average(self, round_: int, federation: int, aggregated: State, applied: State) -> None:
        """One federation's averaged update before and after the server's transforms."""

    def write(self, out_dir: Path) -> None:
        write_rows(out_dir / self.filename, self.rows)


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rows as a CSV, atomically; nothing when there are none."""
    if rows:
        with atomic_path(path) as tmp:
            pd.DataFrame(rows).to_csv(tmp, index=False)


def mean_trained(losses: Iterable[float]) -> float:
    """The mean loss of the clients that took a step (one without, under drop_last, has NaN)."""
    trained = [loss for loss in losses if not math.isnan(loss)]
    return float(np.mean(trained)) if trained else math.nan


class CostLog(Observer):
    """rounds.csv: per round its training time, samples, upload bytes, compute units and mean
    training loss (and, where a transport can lose clients, those left out); totals for
    metrics.csv and summary.json."""

    filename = "rounds.csv"

    def observe(self, report: RoundReport) -> None:
        self.rows.append(
            {
                "round": report.round,
                "seconds": round(report.seconds, 3),
                "samples": report.samples,
                "upload_bytes": report.upload_bytes,
                "compute_units": report.compute_units,
                "train_loss": mean_trained(report.losses.values()),
                **({} if report.missing is None else {"missing": " ".join(map(str, report.missing))}),
            }
        )

    def totals(self) -> dict[str, int]:
        return {key: int(sum(r[key] for r in self.rows)) for key in ("upload_bytes", "compute_units")}
