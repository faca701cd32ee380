"""Did a rerun reproduce committed runs? A verdict per cell (data set, alpha, method) and overall.

Seed s fixes a run's partition, client sampling and initialisation, so a rerun on the same kind
of CPU gives the committed numbers bit for bit (difference 0). On another kind of CPU each
seed's run drifts away from its committed twin (Adam turns last-bit differences into different
runs: docs/workflow.md, "Determinism and resume"), and the rerun is a fresh draw of the same
seed-to-seed noise. A cell is then compared as two samples of that noise:

- the difference of the means (rerun - committed) and its 95% Welch t-interval (unequal
  variances, Welch-Satterthwaite degrees of freedom from both sides' seeds): holding 0, the cell
  is consistent with seed noise on its own evidence;
- a tolerance: the difference that seed noise alone exceeds in some cell of the table with at
  most 5% probability, from the committed runs' spread (Bonferroni over the m cells, the committed
  seeds' variance pooled over all cells, which a 3-seed cell alone estimates badly):
  tol = t(1 - 0.025 / m; sum of (n_c - 1)) * s_pooled * sqrt(1 / n_r + 1 / n_c).

A cell reproduced when its interval holds 0 or its |difference| <= tol: with no change but the
CPU, some cell of a 6-cell, 3-seed table fails by chance in 2.4% of reruns (a simulation of
normal seed noise); a change of 3 seed standard deviations in one cell is caught about half the
time. What the verdict can and cannot tell: docs/workflow.md, "Did my rerun reproduce?".
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from incofl.report.runs import RunFileError, collect_summaries, completed, dataset_label

CELL = ["dataset", "alpha", "method"]
# run settings that do not change what a run computes on one machine: they may differ between a
# rerun and the committed runs (paths, the thread count the job was given, checkpoint cadence)
NOT_SETTINGS = frozenset(
    {
        "seed",
        "threads",
        "progress",
        "cache_dir",
        "data_dir",
        "partition_file",
        "device",
        "checkpoint_every",
        "keep_checkpoint",
    }
)


def welch_interval(rerun: np.ndarray, committed: np.ndarray) -> tuple[float, float, float]:
    """Difference of means (rerun - committed) and its 95% Welch t-interval; NaN bounds when a
    side has one seed; both sides without spread: the interval is the difference itself."""
    diff = float(rerun.mean() - committed.mean())
    if min(len(rerun), len(committed)) < 2:
        return diff, math.nan, math.nan
    va, vb = rerun.var(ddof=1) / len(rerun), committed.var(ddof=1) / len(committed)
    if va + vb == 0:
        return diff, diff, diff
    df = (va + vb) ** 2 / (va**2 / (len(rerun) - 1) + vb**2 / (len(committed) - 1))
    half = float(student_t.ppf(0.975, df)) * math.sqrt(va + vb)
    return diff, diff - half, diff + half


def tolerance(committed: pd.DataFrame, metric: str, cells: int, n_rerun: int) -> float:
    """The module docstring's tol for a cell with n_rerun rerun seeds, from every committed cell."""
    groups = committed.groupby(CELL)[metric]
    df = int((groups.count() - 1).sum())
    if df < 1:
        return 0.0
    pooled = float(groups.var(ddof=1).mul(groups.count() - 1).sum() / df)
    n_committed = groups.count().mean()
    return float(student_t.ppf(1 - 0.025 / cells, df)) * math.sqrt(pooled * (1 / n_rerun + 1 / n_committed))


def _settings(run: pd.Series) -> dict[str, Any]:
    config = run["config"] if isinstance(run["config"], dict) else {}
    return {k: v for k, v in config.items() if k not in NOT_SETTINGS}


def check_same_experiment(rerun: pd.DataFrame, committed: pd.DataFrame) -> None:
    """Refuses a cell whose two sides were trained with different settings (those both sides'
    code records): its difference would measure the change of settings, not reproduction."""
    theirs = {key: runs.iloc[0] for key, runs in rerun.groupby(CELL)}
    shared = [key for key in committed.groupby(CELL).groups if key in theirs]
    if not shared:
        raise RunFileError("the rerun and the committed runs have no cell (dataset, alpha, method) in common")
    for key, runs in committed.groupby(CELL):
        if key not in theirs:
            continue
        ours, other = _settings(runs.iloc[0]), _settings(theirs[key])
        for name in sorted(set(ours) & set(other)):
            if ours[name] != other[name]:
                raise RunFileError(
                    f"{_label(key)}: the rerun was trained with {name}={other[name]!r}, the "
                    f"committed runs with {name}={ours[name]!r}: not the same experiment"
                )


def _label(key: tuple) -> str:
    dataset, alpha, method = key
    return f"{dataset_label(dataset)} alpha={float(alpha)} {method}"


def compare(rerun: pd.DataFrame, committed: pd.DataFrame, metric: str, tol: float | None = None) -> pd.DataFrame:
    """One row per cell of either side: seeds and mean of each side, difference, interval,
    tolerance and `reproduced` (False for a cell missing on one side). `tol`: a fixed tolerance
    in points instead of the family-wise one."""
    rerun, committed = completed(rerun), completed(committed)
    keys = sorted(set(map(tuple, committed[CELL].to_numpy())) | set(map(tuple, rerun[CELL].to_numpy())))
    ours, theirs = committed.groupby(CELL)[metric], rerun.groupby(CELL)[metric]
    rows = []
    for key in keys:
        a = theirs.get_group(key).to_numpy(float) if key in theirs.groups else np.array([])
        b = ours.get_group(key).to_numpy(float) if key in ours.groups else np.array([])
        row = dict(zip(CELL, key, strict=True)) | {"n_rerun": len(a), "n_committed": len(b)}
        if len(a) and len(b):
            diff, low, high = welch_interval(a, b)
            cell_tol = tol if tol is not None else tolerance(committed, metric, len(keys), len(a))
            holds = not math.isnan(low) and low <= 0 <= high
            row |= {
                "rerun": a.mean(),
                "committed": b.mean(),
                "difference": diff,
                "low": low,
                "high": high,
                "tolerance": cell_tol,
                "reproduced": holds or abs(diff) <= cell_tol,
            }
        else:
            row |= {"reproduced": False}
        rows.append(row)
    return pd.DataFrame(rows)


def read_runs(root: str | os.PathLike) -> pd.DataFrame:
    """Every run under `root` (summary.json files), its settings kept for the check."""
    runs = collect_summaries(root)
    if "config" not in runs:
        runs["config"] = None
    return runs


def _cell_text(r: Any) -> str:
    seeds = f"| {_label((r.dataset, r.alpha, r.method))} | {r.n_rerun} / {r.n_committed} |"
    if not (r.n_rerun and r.n_committed):
        return f"{seeds} | | | | no: not in the {'rerun' if not r.n_rerun else 'committed runs'} |"
    interval = "n/a (one seed)" if math.isnan(r.low) else f"[{r.low:+.2f}, {r.high:+.2f}]"
    verdict = "yes" if r.reproduced else "**no**"
    means = f"{r.rerun:.2f} | {r.committed:.2f} | {r.difference:+.2f}"
    return f"{seeds} {means} | {interval} | {verdict} (tol {r.tolerance:.2f}) |"


def to_markdown(table: pd.DataFrame, metric: str) -> str:
    """The per-cell table and the overall verdict line."""
    lines = [
        f"**Reproduction** of {metric} (points): rerun - committed, 95% Welch interval; a cell reproduced "
        "when the interval holds 0 or |difference| <= tol.",
        "",
        "| cell | seeds rerun / committed | rerun | committed | difference | 95% interval | reproduced |",
        "| :--- | :---: | :---: | :---: | :---: | :---: | :--- |",
        *(_cell_text(r) for r in table.itertuples()),
        "",
        verdict(table),
    ]
    return "\n".join(lines) + "\n"


def verdict(table: pd.DataFrame) -> str:
    """One line: whether every cell reproduced."""
    good = int(table["reproduced"].sum())
    if good == len(table):
        return f"Verdict: REPRODUCED ({good} of {len(table)} cells)."
    bad = ", ".join(_label(k) for k in table.loc[~table["reproduced"], CELL].itertuples(index=False))
    return f"Verdict: NOT REPRODUCED ({good} of {len(table)} cells reproduced; not: {bad})."
