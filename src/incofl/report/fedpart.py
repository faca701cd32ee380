"""FedPart's poster table (docs/methods.md, FedPart): full network updates ("FNU") against partial ones,
per base method and number of cycles, with the costs per cycle and the measured wall time of
full and partial rounds; and the warm-up comparison.

A partial method's run (a `PartPlanner` method, or a variant of one) is paired with the runs
of its base method (FedPart -> FedAvg, FedPartProx -> FedProx, FedPartMOON -> MOON) in the same
data set, alpha and seeds. Accuracy "after C cycles" is the test accuracy at round C x L
(L = W + R x G rounds a cycle), read from metrics.csv: the poster does not say whether it
reports the final or the best accuracy, so we report the accuracy at the end of each cycle.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from incofl.models.family import build_model
from incofl.models.groups import layer_groups
from incofl.registry import METHODS
from incofl.report.runs import read_csv, read_summary

# The poster, CIFAR-10, ResNet-8, 40 clients: (FNU, FedPart) accuracy after C cycles (docs/methods.md, FedPart).
POSTER = {
    "FedAvg": [(56.0, 57.7), (58.6, 60.2), (59.6, 61.7), (60.7, 62.8)],
    "FedProx": [(54.4, 57.5), (60.2, 59.9), (62.3, 61.3), (62.8, 62.3)],
    "MOON": [(58.9, 57.8), (61.1, 59.4), (62.3, 59.8), (62.3, 60.5)],
}
POSTER_COSTS = "upload per cycle 4.83 -> 1.35 GB, compute 4.38 -> 3.21 units (poster)"


@dataclass(frozen=True)
class RunFiles:
    label: str  # the name the run is shown under (method or variant)
    method: str  # the registered method
    dataset: str
    alpha: float
    seed: int
    config: dict[str, Any]
    metrics: pd.DataFrame
    rounds: pd.DataFrame

    @property
    def partial(self) -> bool:
        return METHODS[self.method].partial

    def cycle(self) -> int | None:
        """Rounds a cycle (W + R x G), None for full updates or `schedule: once`."""
        hp = METHODS[self.method].parse_args(self.config["method_args"])
        if not self.partial or hp.schedule != "cycles":
            return None
        return hp.warmup + hp.rounds_per_group * _group_count(self.config["models"][-1])

    def acc_at(self, round_: int) -> float | None:
        row = self.metrics[self.metrics["round"] == round_]
        return None if row.empty else float(row["mean_acc"].iloc[0])


@cache
def _group_count(model: str) -> int:
    """FedPart's layer groups of a model (built once per name: the tables ask for it per run)."""
    return len(layer_groups(build_model(model, 10, 3)))


def read_runs(
    runs_root: str | os.PathLike, labels: list[str], grid: dict[str, list[Any]] | None = None
) -> list[RunFiles]:
    """The completed runs under a root whose label is one of `labels` (and, with `grid`, whose
    dataset, alpha and seed are in its lists), with their per-round files."""
    runs = []
    for path in sorted(Path(runs_root).rglob("summary.json")):
        s = read_summary(path)
        point = {"dataset": s["dataset"], "alpha": float(s["alpha"]), "seed": int(s["seed"])}
        if s["method"] not in labels or s.get("status", "completed") != "completed":
            continue
        if grid and any(point[key] not in values for key, values in grid.items()):
            continue
        rounds = path.with_name("rounds.csv")
        metrics = read_csv(path.with_name("metrics.csv"))
        per_round = read_csv(rounds) if rounds.exists() else pd.DataFrame()
        runs.append(
            RunFiles(s["method"], s["config"]["method"], **point, config=s["config"], metrics=metrics, rounds=per_round)
        )
    return runs


def _mean_std(values: list[float]) -> str:
    s = pd.Series(values, dtype=float)
    return "" if s.empty else f"{s.mean():.1f} ± {s.std(ddof=1):.1f}" if len(s) > 1 else f"{s.mean():.1f}"


def cycle_table(runs: list[RunFiles]) -> pd.DataFrame:
    """One row per (data set, alpha, partial label, C): FNU and partial accuracy after C cycles."""
    rows = []
    for part in sorted({r.label for r in runs if r.cycle()}):
        mine = [r for r in runs if r.label == part]
        base = METHODS[mine[0].method].base
        for dataset, alpha in sorted({(r.dataset, r.alpha) for r in mine}):
            cell = [r for r in mine if (r.dataset, r.alpha) == (dataset, alpha)]
            full = [r for r in runs if r.label == base and (r.dataset, r.alpha) == (dataset, alpha)]
            length = cell[0].cycle() or 0
            for c in range(1, min(r.config["rounds"] for r in cell) // length + 1):
                fnu = [a for r in full if (a := r.acc_at(c * length)) is not None]
                ours = [a for r in cell if (a := r.acc_at(c * length)) is not None]
                poster = POSTER.get(base or "", [])
                rows.append(
                    {
                        "dataset": dataset,
                        "alpha": alpha,
                        "FNU": base,
                        "partial": part,
                        "C": c,
                        "round": c * length,
                        "FNU acc": _mean_std(fnu),
                        "partial acc": _mean_std(ours),
                        "seeds": f"{len(fnu)}/{len(ours)}",
                        "poster": f"{poster[c - 1][0]} -> {poster[c - 1][1]}" if c <= len(poster) else "",
                    }
                )
    return pd.DataFrame(rows)


def _per_cycle(run: RunFiles, length: int, key: str) -> float:
    return float(run.rounds[run.rounds["round"] <= length][key].sum())


def cost_table(runs: list[RunFiles]) -> pd.DataFrame:
    """Per partial label: upload (GB) and compute units in its first cycle against its base's
    first L rounds (means over seeds), and the measured wall time of full and partial rounds."""
    rows = []
    for part in sorted({r.label for r in runs if r.cycle() and not r.rounds.empty}):
        mine = [r for r in runs if r.label == part and not r.rounds.empty]
        base = METHODS[mine[0].method].base
        full = [r for r in runs if r.label == base and not r.rounds.empty]
        length = mine[0].cycle() or 0
        if not full:
            continue
        row: dict[str, Any] = {"FNU": base, "partial": part, "L": length}
        for key, scale in (("upload_bytes", 1e-9), ("compute_units", 1.0)):
            f = sum(_per_cycle(r, length, key) for r in full) / len(full) * scale
            p = sum(_per_cycle(r, length, key) for r in mine) / len(mine) * scale
            name = "upload GB" if key == "upload_bytes" else "compute units"
            row |= {f"{name} FNU": round(f, 3), f"{name} partial": round(p, 3), f"{name} ratio": round(p / f, 4)}
        rounds = pd.concat([r.rounds for r in mine])
        partial_round = rounds["compute_units"] < 3 * rounds["samples"]  # 2 units a sample: a partial round
        fnu_s = pd.concat([r.rounds for r in full])["seconds"].mean()
        row |= {
            "s/round FNU": round(fnu_s, 2),
            "s/full round": round(rounds[~partial_round]["seconds"].mean(), 2),
            "s/partial round": round(rounds[partial_round]["seconds"].mean(), 2),
            "wall ratio (cycle)": round(
                sum(_per_cycle(r, length, "seconds") for r in mine)
                / sum(_per_cycle(r, length, "seconds") for r in full)
                * len(full)
                / len(mine),
                3,
            ),
        }
        rows.append(row)
    return pd.DataFrame(rows)


def warmup_table(runs: list[RunFiles]) -> pd.DataFrame:
    """Every partial label with its schedule, warm-up and final accuracy, beside its base's."""
    rows = []
    for part in sorted({r.label for r in runs if r.partial}):
        mine = [r for r in runs if r.label == part]
        hp = METHODS[mine[0].method].parse_args(mine[0].config["method_args"])
        base = METHODS[mine[0].method].base
        full = [r.acc_at(r.config["rounds"]) for r in runs if r.label == base]
        rows.append(
            {
                "partial": part,
                "schedule": hp.schedule,
                "W": hp.warmup,
                "R": hp.rounds_per_group,
                "rounds": mine[0].config["rounds"],
                "final acc": _mean_std([a for r in mine if (a := r.acc_at(r.config["rounds"])) is not None]),
                "FNU": base,
                "FNU final acc": _mean_std([a for a in full if a is not None]),
                "seeds": len(mine),
            }
        )
    return pd.DataFrame(rows)


def fedpart_report(runs_root: str | os.PathLike, labels: list[str], grid: dict[str, list[Any]] | None = None) -> str:
    """The three tables as one markdown page."""
    runs = read_runs(runs_root, labels, grid)
    parts = [
        "# FedPart: full (FNU) vs partial network updates",
        "",
        "Accuracy (%) at the end of cycle C (round C x L), mean ± std over seeds (seeds: FNU/partial);"
        " poster: CIFAR-10, ResNet-8, 40 clients, E = 8 (docs/methods.md, FedPart).",
        "",
        _markdown(cycle_table(runs)),
        "",
        f"Costs of one cycle (means over seeds) and measured wall time; {POSTER_COSTS}.",
        "",
        _markdown(cost_table(runs)),
        "",
        "Warm-up: full rounds before partial ones (poster: 0 / 5 / 60 full rounds give 58.48 / 61.25 / 66.18).",
        "",
        _markdown(warmup_table(runs)),
    ]
    return "\n".join(parts) + "\n"


def _markdown(table: pd.DataFrame) -> str:
    return "(no runs)" if table.empty else table.to_markdown(index=False)
