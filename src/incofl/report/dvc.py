"""What `dvc metrics` and `dvc plots` read of one experiment (README, "Reproduce with DVC"),
written by `incofl metrics` into the experiment's `dvc/` folder:

- metrics.json: per runs root, Table 2's numbers (mean, std, seeds, improvement over the base
  per method x data set x alpha); with pairs, per pair the paired differences over the roots
  (n, mean difference, standard error, wins, losses, sign test p) per data set, alpha, statistic;
- curves.csv: seed-mean test accuracy per evaluated round with its std, per root (template
  workflow/dvc/curves.json);
- paired.csv: with pairs, the per-seed differences (template workflow/dvc/paired.json).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd

from incofl.atomic import write_json, write_text
from incofl.report.paired import paired, statistics
from incofl.report.runs import alpha_tag, completed

CURVE_KEYS = ["runs", "dataset", "alpha", "method", "round"]


def seed_mean_curves(curves: pd.DataFrame, runs: str) -> pd.DataFrame:
    """Accuracy per round (mean, std and count over seeds) of the completed runs of `curves`
    (collect_curves' long form), labelled with the runs root's name `runs`."""
    done = completed(curves).assign(runs=runs)
    out = done.groupby(CURVE_KEYS, sort=False)["mean_acc"].agg(accuracy="mean", std="std", seeds="count")
    out = out.reset_index().round({"accuracy": 3, "std": 3})
    return out.astype({"std": float}).fillna({"std": 0.0})


def pair_tables(summaries: pd.DataFrame, pairs: list[tuple[str, str]]) -> dict[str, pd.DataFrame]:
    """`incofl paired`'s table per (method, base), over the roots as replicates (`replicate`)."""
    stats = statistics(summaries)
    return {f"{method} - {base}": paired(summaries, method, base, stats) for method, base in pairs}


def _number(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


def paired_metrics(tables: dict[str, pd.DataFrame]) -> dict:
    """{pair: {dataset: {"a0.5": {statistic: {n, mean_diff, se, wins, losses, sign_p}}}}}."""
    out: dict = {}
    for pair, table in tables.items():
        for r in table.itertuples():
            cell = out.setdefault(pair, {}).setdefault(r.dataset, {}).setdefault(alpha_tag(r.alpha), {})
            cell[r.metric] = {
                "n": int(r.n),
                "mean_diff": _number(r.mean_diff),
                "se": _number(r.se),
                "wins": int(r.wins),
                "losses": int(r.losses),
                "sign_p": float(r.sign_p),
            }
    return out


def paired_rows(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per pair, data set, alpha, statistic and seed: the difference (points)."""
    rows = [
        {"pair": pair, "dataset": r.dataset, "alpha": r.alpha, "statistic": r.metric, "seed": seed, "difference": diff}
        for pair, table in tables.items()
        for r in table.itertuples()
        for seed, diff in zip(r.seeds, r.diffs, strict=True)
    ]
    return pd.DataFrame(rows, columns=["pair", "dataset", "alpha", "statistic", "seed", "difference"])


def write_dvc_files(
    out: str | os.PathLike, tables: dict[str, dict], curves: pd.DataFrame, pairs: dict[str, pd.DataFrame]
) -> list[Path]:
    """metrics.json ({root: Table 2 metrics} and, with pairs, "paired"), curves.csv and, with
    pairs, paired.csv into `out`, atomically."""
    out = Path(out)
    metrics = dict(tables) | ({"paired": paired_metrics(pairs)} if pairs else {})
    write_json(out / "metrics.json", metrics)
    write_text(out / "curves.csv", curves.to_csv(index=False))
    paths = [out / "metrics.json", out / "curves.csv"]
    if pairs:
        write_text(out / "paired.csv", paired_rows(pairs).to_csv(index=False))
        paths.append(out / "paired.csv")
    return paths
