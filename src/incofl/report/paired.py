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
import os
import sys
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from scipy.stats import t as student_t

from incofl.report.figures import STYLE, _save
from incofl.report.runs import dataset_label
from incofl.report.tables import METRIC_LABELS


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
STATISTIC_LABELS = {**METRIC_LABELS, "final_exits_mean": "final accuracy, mean over the exits"}


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
            rows.append(
                {
                    "dataset": dataset,
                    "alpha": alpha,
                    "metric": metric,
                    "n": n,
                    "mean_diff": float(d.mean()) if n else np.nan,
                    "se": float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else np.nan,
                    "wins": int((d > 0).sum()),
                    "losses": int((d < 0).sum()),
                    "sign_p": sign_test(list(d)),
                    "diffs": [round(float(x), 2) for x in d],
                    "seeds": [int(s) for s in d.index],
                }
            )
    return pd.DataFrame(rows)


def to_markdown(table: pd.DataFrame, method: str, base: str) -> str:
    lines = [
        f"**{method} - {base}**, paired by seed: mean difference ± standard error (points), "
        "wins/losses, sign test p (two-sided), per-seed differences.",
        "",
        "| Data set | alpha | statistic | n | difference | wins/losses | sign p | per seed |",
        "| :--- | :---: | :--- | :---: | :---: | :---: | :---: | :--- |",
    ]
    for r in table.itertuples():
        se = f" ± {r.se:.2f}" if not math.isnan(r.se) else ""
        diffs = ", ".join(f"{x:+.2f}" for x in r.diffs)
        lines.append(
            f"| {r.dataset} | {r.alpha} | {r.metric} | {r.n} | {r.mean_diff:+.2f}{se} | "
            f"{r.wins}/{r.losses} | {r.sign_p:.3f} | {diffs} |"
        )
    return "\n".join(lines) + "\n"


def interval95(diffs: list[float]) -> tuple[float, float]:
    """The 95% t-interval of the mean of `diffs` (n - 1 degrees of freedom); NaN for n < 2."""
    n = len(diffs)
    if n < 2:
        return math.nan, math.nan
    mean, se = float(np.mean(diffs)), float(np.std(diffs, ddof=1)) / math.sqrt(n)
    half = float(student_t.ppf(0.975, n - 1)) * se
    return mean - half, mean + half


def _row_label(pair: str, dataset: str, alpha: float, n: int) -> str:
    return f"{pair}\n{dataset_label(dataset)} α={float(alpha)}, n={n}"


def paired_figure(differences: pd.DataFrame) -> Figure:
    """`differences`: paired.csv of `incofl metrics` (pair, dataset, alpha, statistic, seed,
    difference). One panel per statistic, a row per pair and (data set, alpha): each seed's
    difference (dots), their mean (diamond) and its 95% t-interval (bar), a line at zero."""
    keys = ["pair", "dataset", "alpha", "statistic"]
    cells = differences.groupby(keys, sort=False)["difference"].agg(list).reset_index()
    cells["label"] = [_row_label(c.pair, c.dataset, c.alpha, len(c.difference)) for c in cells.itertuples()]
    stats, labels = list(dict.fromkeys(cells["statistic"])), list(dict.fromkeys(cells["label"]))
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(3.4 * len(stats) + 1.5, 0.6 * len(labels) + 1.4), layout="constrained")
        axes = fig.subplots(1, len(stats), sharey=True, squeeze=False)[0]
    for ax, stat in zip(axes, stats, strict=True):
        for c in cells[cells["statistic"] == stat].itertuples():
            y = labels.index(c.label)
            ax.plot(
                c.difference,
                [y] * len(c.difference),
                "o",
                ms=4,
                color="tab:gray",
                alpha=0.7,
                label="one seed's difference",
            )
            ax.plot(interval95(c.difference), [y, y], color="black", lw=1.5, label="95% t-interval of the mean")
            ax.plot([np.mean(c.difference)], [y], "D", ms=6, color="tab:blue", label="mean difference")
        ax.axvline(0, color="tab:red", lw=0.8, ls="--", label="no difference")
        ax.set(xlabel="difference (accuracy points)", title=STATISTIC_LABELS[stat])
        ax.grid(axis="y", visible=False)
    axes[0].set_yticks(range(len(labels)), labels, fontsize=8)
    axes[0].invert_yaxis()
    handles, names = axes[0].get_legend_handles_labels()
    unique = dict(zip(names, handles, strict=True))
    fig.legend(unique.values(), unique.keys(), loc="outside lower center", ncols=4, fontsize=8)
    fig.suptitle("Method - base, paired by seed (same partition, sampling and initialisation)")
    return fig


def plot_paired(paired_csv: str | os.PathLike, png: str | os.PathLike) -> list[Path]:
    """paired_figure of an `incofl metrics` paired.csv as `png` and a PDF beside it."""
    png = Path(png)
    return _save(paired_figure(pd.read_csv(paired_csv)), png.parent, png.stem)


if __name__ == "__main__":  # dvc.yaml's report stages: python -m incofl.report.paired PAIRED_CSV PNG
    print("\n".join(str(path) for path in plot_paired(*sys.argv[1:3])))
