"""Paired comparison of two methods over seeds.

A seed fixes the partition, the client sampling and the initialisation, so the runs of two
methods with one seed differ only in the method: the per-seed difference is the measured
effect, its standard error is std(d) / sqrt(n), and the sign test asks how likely as many
wins would be if each sign were a coin flip (exact binomial, two-sided, ties dropped).

Runs of one seed made again elsewhere (another device: a GPU rerun is not bit-identical to a
CPU run) are replicates, told apart by a `replicate` column: a seed's difference is taken
within each replicate, where both runs come from one machine, and averaged over them, so the
seed still counts once.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


def sign_test(diffs: list[float]) -> float:
    """Two-sided exact sign test p-value; zero differences are dropped."""
    wins, losses = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(wins, losses) + 1)) / 2**n
    return min(1.0, 2 * tail)


# compared when the runs report them: the final and last-10 accuracy, and ScaleFL's released
# statistic (the mean over its exits)
STATISTICS = ("final_acc", "last10_acc", "final_exits_mean")


def statistics(summaries: pd.DataFrame) -> list[str]:
    """The STATISTICS some run in `summaries` reports."""
    return [s for s in STATISTICS if s in summaries and summaries[s].notna().any()]


def paired(summaries: pd.DataFrame, method: str, base: str, metrics: list[str]) -> pd.DataFrame:
    """Per data set, alpha and metric: n pairs (seeds), mean difference (method - base), its
    standard error, wins/losses and the sign test's p; only seeds where both methods have a run
    in one replicate count."""
    rows = []
    if "replicate" not in summaries:
        summaries = summaries.assign(replicate=0)
    for (dataset, alpha), runs in summaries.groupby(["dataset", "alpha"], sort=True):
        wide = runs.pivot_table(index=["seed", "replicate"], columns="method", values=metrics, aggfunc="first")
        for metric in metrics:
            if (metric, method) not in wide or (metric, base) not in wide:
                continue
            d = (wide[(metric, method)] - wide[(metric, base)]).dropna().groupby(level="seed").mean()
            n = len(d)
            rows.append({"dataset": dataset, "alpha": alpha, "metric": metric, "n": n,
                         "mean_diff": float(d.mean()) if n else np.nan,
                         "se": float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else np.nan,
                         "wins": int((d > 0).sum()), "losses": int((d < 0).sum()),
                         "sign_p": sign_test(list(d)), "diffs": [round(float(x), 2) for x in d],
                         "seeds": [int(s) for s in d.index]})  # fmt: skip
    return pd.DataFrame(rows)


def to_markdown(table: pd.DataFrame, method: str, base: str) -> str:
    lines = [f"**{method} - {base}**, paired by seed: mean difference ± standard error (points), "
             "wins/losses, sign test p (two-sided), per-seed differences.", "",
             "| Data set | alpha | statistic | n | difference | wins/losses | sign p | per seed |",
             "| :--- | :---: | :--- | :---: | :---: | :---: | :---: | :--- |"]  # fmt: skip
    for r in table.itertuples():
        se = f" ± {r.se:.2f}" if not math.isnan(r.se) else ""
        diffs = ", ".join(f"{x:+.2f}" for x in r.diffs)
        lines.append(f"| {r.dataset} | {r.alpha} | {r.metric} | {r.n} | {r.mean_diff:+.2f}{se} | "
                     f"{r.wins}/{r.losses} | {r.sign_p:.3f} | {diffs} |")  # fmt: skip
    return "\n".join(lines) + "\n"
