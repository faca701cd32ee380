"""Paper-style figures: accuracy-vs-round curves with a seed band, and ablation bars (Fig. 8).

Figures are built on `matplotlib.figure.Figure` (Agg canvas, no pyplot state), so this
works headless and never leaks open figures.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from incofl.atomic import atomic_path
from incofl.registry import METHODS
from incofl.report.runs import alpha_tag, dataset_label
from incofl.report.tables import METRIC_LABELS, table2

STYLE = {
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linestyle": "--",
    "font.size": 9,
    "legend.frameon": False,
}
ACC_LABEL = "Test accuracy (%)"
# the curves' legend title: what the line, the markers and the band are
BAND_TITLE = "line: mean over n seeds\n(markers: evaluated rounds)\nband: ± 1 std over seeds"


def _colors(methods: Sequence[str], base_of: Mapping[str, str | None]) -> dict[str, tuple]:
    """tab20 hues, one per method, except that a shown base method and the first shown method
    built on it (FedProx and InCoProx) share a hue: light for the base, dark for the other."""
    cmap = matplotlib.colormaps["tab20"]
    partnered = {base_of.get(m) for m in methods} & set(methods)
    open_pairs: dict[str, int] = {}  # base -> hue whose dark shade is still free
    colors, hue = {}, 0
    for m in methods:
        base = base_of.get(m)
        if base in open_pairs:
            colors[m] = cmap(2 * open_pairs.pop(base))
            continue
        colors[m] = cmap((2 * hue + (m in partnered)) % cmap.N)
        if m in partnered:
            open_pairs[m] = hue
        hue += 1
    return colors


def _title(dataset: str, alpha: float) -> str:
    return f"{dataset_label(dataset)}, α={float(alpha)}"


def _save(fig: Figure, out_dir: str | os.PathLike, name: str) -> list[Path]:
    """Save `name`.png (dpi 150) and `name`.pdf atomically; the PDF carries no date, so
    unchanged data gives identical files."""
    paths = []
    for fmt in ("png", "pdf"):
        path = Path(out_dir) / f"{name}.{fmt}"
        with atomic_path(path) as tmp:
            fig.savefig(
                tmp, format=fmt, dpi=150, bbox_inches="tight", metadata={"CreationDate": None} if fmt == "pdf" else None
            )
        paths.append(path)
    return paths


def _seed_band(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean and std of mean_acc over seeds per round, on the rounds every seed evaluated
    (a seed that stopped early or evaluated other rounds never makes the curve jump)."""
    stats = runs.groupby("round")["mean_acc"].agg(["mean", "std", "count"])
    return stats[stats["count"] == runs["seed"].nunique()].fillna({"std": 0.0})


def _curve_label(method: str, done: pd.DataFrame, diverged: pd.DataFrame) -> str:
    """`InCoAvg (n=3)`: the seeds the line averages, and the diverged ones it leaves out."""
    label = method + (f" (n={done['seed'].nunique()})" if not done.empty else "")
    return label + (f" ({diverged['seed'].nunique()} diverged)" if not diverged.empty else "")


def _curve_figure(cell: pd.DataFrame, colors: dict[str, tuple], title: str) -> Figure:
    """Seed-mean accuracy with a marker at each evaluated round and a ± std band (n seeds in
    the legend)."""
    fig = Figure(figsize=(6.4, 3.8))
    ax = fig.add_subplot()
    for method, color in colors.items():
        runs = cell[cell["method"] == method]
        done, diverged = runs[runs["status"] == "completed"], runs[runs["status"] == "diverged"]
        label = _curve_label(method, done, diverged)
        if not done.empty:
            s = _seed_band(done)
            ax.plot(s.index, s["mean"], color=color, lw=1.4, marker="o", ms=3, label=label)
            ax.fill_between(s.index, s["mean"] - s["std"], s["mean"] + s["std"], color=color, alpha=0.18, lw=0)
        for i, (_, run) in enumerate(diverged.groupby("seed")):  # dotted up to the divergence, x where it ended
            ax.plot(
                run["round"],
                run["mean_acc"],
                color=color,
                ls=":",
                lw=1.0,
                marker="x",
                markevery=[-1],
                label=label if done.empty and i == 0 else None,
            )
    ax.set(xlabel="Communication rounds", ylabel=ACC_LABEL, title=title)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), title=BAND_TITLE, alignment="left")
    return fig


def plot_curves(
    curves: pd.DataFrame,
    out_dir: str | os.PathLike,
    *,
    methods: Sequence[str] | None = None,
    base_of: Mapping[str, str | None] | None = None,
) -> list[Path]:
    """One figure per (dataset, alpha): seed-mean test accuracy vs round per method, with a
    mean ± std band. Writes curves_<dataset>_a<alpha>.{png,pdf}; returns the paths.
    `base_of` (method -> base method) pairs the colours of a method and its base."""
    methods = list(pd.unique(curves["method"]) if methods is None else methods)
    shown = curves[curves["method"].isin(methods)]
    colors, paths = _colors(methods, base_of or {}), []
    with matplotlib.rc_context(STYLE):
        for (dataset, alpha), cell in shown.groupby(["dataset", "alpha"], sort=False):
            fig = _curve_figure(cell, colors, _title(dataset, alpha))
            paths += _save(fig, out_dir, f"curves_{dataset}_{alpha_tag(alpha)}")
    return paths


def _setting_of(name: str) -> str | None:
    """The method a registered `F-x` is a setting of: F, when it runs F's stages with other
    defaults (InCoAvg-noNorm: InCoAvg without normalisation)."""
    if name not in METHODS:  # a variant without runs: its method is unknown here
        return None
    m = METHODS[name]
    stages = (m.objective, m.aggregator, m.pre, m.post, m.planner)
    return next(
        (
            f.name
            for f in METHODS.values()
            if name.startswith(f.name + "-") and (f.objective, f.aggregator, f.pre, f.post, f.planner) == stages
        ),
        None,
    )


def _without_step(method: str) -> str | None:
    """The registered method that is `method` without its step after aggregation (InCoAvg
    without InCo's: HeteroAvg; InCoHeteroFL: HeteroFL), None if it has no such step."""
    m = METHODS.get(method)
    if m is None or not m.post:
        return None
    rest = (m.objective, m.aggregator, m.pre, m.planner, m.defaults)
    return next(
        (
            o.name
            for o in METHODS.values()
            if not o.post and (o.objective, o.aggregator, o.pre, o.planner, o.defaults) == rest
        ),
        None,
    )


def registered_methods(summaries: pd.DataFrame) -> dict[str, str]:
    """Name shown -> the registered method its runs ran (a variant's method; from each run's
    config), the name itself for runs whose summary has no config."""
    configs = summaries["config"] if "config" in summaries else [None] * len(summaries)
    return {
        name: config.get("method", name) if isinstance(config, dict) else name
        for name, config in zip(summaries["method"], configs, strict=True)
    }


def ablation_methods(names: Sequence[str], method_of: Callable[[str], str | None]) -> list[str]:
    """The grid's ablation (paper Fig. 8), in grid order: every name that is a setting of
    another method (a variant: `method_of` gives its method; or a registered setting,
    InCoAvg-noNorm of InCoAvg) with that method, and every method with a step after
    aggregation beside the grid's method without it (InCoAvg beside HeteroAvg). All of `names`
    when the grid holds no such pair."""
    members: set[str] = set()
    for name in names:
        method = method_of(name) or name
        full = method if method != name else _setting_of(name)
        stripped = _without_step(method)
        if full:
            members |= {name} | ({full} & set(names))
        if stripped in names:
            members |= {name, stripped}
    return [n for n in names if n in members] or list(names)


def seeds_text(n_seeds: pd.Series) -> str:
    """`n=3 seeds`, or `n=2-3 seeds` when cells differ."""
    low, high = int(n_seeds.min()), int(n_seeds.max())
    return f"n={low} seed{'s' * (high > 1)}" if low == high else f"n={low}-{high} seeds"


def _ablation_figure(t: pd.DataFrame, colors: dict[str, tuple], metric: str) -> Figure:
    groups = list(dict.fromkeys(zip(t["dataset"], t["alpha"], strict=True)))
    fig = Figure(figsize=(max(4.5, 1.3 * len(groups) + 2.5), 3.6))
    ax = fig.add_subplot()
    width = 0.8 / len(colors)
    x = np.arange(len(groups))
    for i, (method, color) in enumerate(colors.items()):
        bars = t[t["method"] == method]
        ax.bar(
            x + (i - (len(colors) - 1) / 2) * width,
            bars["mean"],
            width,
            color=color,
            yerr=bars["std"].fillna(0),
            capsize=2,
            error_kw={"lw": 0.8},
            label=method,
        )
    low = (t["mean"] - t["std"].fillna(0)).min()
    ax.set_ylim(bottom=max(0.0, 10 * math.floor((low - 5) / 10)))  # zoom in like the paper
    ax.set_xticks(x, [f"{dataset_label(d)}\nα={a}" for d, a in groups])
    ax.grid(axis="x", visible=False)
    shown = t[t["n_seeds"] > 0]["n_seeds"]
    title = f"{METRIC_LABELS[metric].capitalize()}: bar mean, error bar ± 1 std over {seeds_text(shown)}"
    ax.set(ylabel=ACC_LABEL, title=title)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


def plot_ablation(
    summaries: pd.DataFrame,
    out_dir: str | os.PathLike,
    *,
    metric: str = "final_acc",
    methods: Sequence[str],
    base_of: Mapping[str, str | None] | None = None,
) -> list[Path]:
    """Grouped bars (groups = dataset/alpha, bars = the ablation of the grid's `methods`:
    `ablation_methods`, each name's registered method read from its runs' configs) of the
    seed-mean `metric` with std error bars. Writes ablation.{png,pdf}; returns the paths."""
    methods = ablation_methods(methods, registered_methods(summaries).get)
    t = table2(summaries, metric=metric, methods=methods, base_of={})
    if not t["n_seeds"].any():
        raise ValueError(f"no runs of any of {list(methods)}")
    with matplotlib.rc_context(STYLE):
        base_of = base_of or {}
        palette = _colors(list(dict.fromkeys([*base_of, *methods])), base_of)  # the curves' colours
        colors = {m: palette[m] for m in methods}
        return _save(_ablation_figure(t, colors, metric), out_dir, "ablation")
