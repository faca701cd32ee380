"""The paper's analyses from the runs' files (README "Analyses"): `incofl analysis <name>`.

Every function reads finished runs under a root (every value from the run's own files: its
summary.json and the observers' CSVs), writes figures (PNG and PDF, as report/figures.py) and
Markdown tables into an output folder, and returns the paths. Means are over client pairs
first, then mean ± std over seeds.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from sklearn.metrics import silhouette_score

from incofl.atomic import atomic_path
from incofl.config import ConfigError
from incofl.report.figures import STYLE, _save, seeds_text
from incofl.report.published import PAPER_TABLE1, PAPER_TABLE3
from incofl.report.runs import dataset_label, read_csv, read_summary

Runs = list[tuple[dict, Path]]  # (summary, run directory)


class NoRuns(FileNotFoundError):
    """No finished run under the root has the file an analysis reads."""


def runs_with(
    root: str | os.PathLike, filename: str | None, grid: dict[str, list] | None = None, cells: bool = False
) -> Runs:
    """Finished runs under `root` (in the grid's values, if given) that have `filename`; a run
    without it is named on stderr and skipped. A run from before `status` counts as completed
    (as in report/runs.py). Runs of several (dataset, alpha) cells are refused unless `cells`
    (the caller keeps them apart): seeds of different cells would be averaged together."""
    runs = []
    for path in sorted(Path(root).rglob("summary.json")):
        summary = read_summary(path)
        if summary.get("status", "completed") != "completed":
            continue
        if grid and any(summary[key] not in values for key, values in grid.items()):
            continue
        if filename and not (path.parent / filename).exists():
            print(f"incofl analysis: {path.parent} has no {filename}, skipped", file=sys.stderr)
            continue
        runs.append((summary, path.parent))
    if not runs:
        raise NoRuns(f"no {filename or 'finished run'} under {root}")
    found = sorted({(s["dataset"], float(s["alpha"])) for s, _ in runs})
    if len(found) > 1 and not cells:
        names = ", ".join(f"{d} a{a}" for d, a in found)
        raise ConfigError(
            f"runs under {root} span {len(found)} (dataset, alpha) cells ({names}): "
            "pass --config with one dataset and alpha, or a --runs folder of one cell"
        )
    return runs


def frame(runs: Runs, filename: str) -> pd.DataFrame:
    """One CSV of every run, with the run's method, seed, dataset and alpha."""
    parts = [
        read_csv(path / filename).assign(method=s["method"], seed=s["seed"], dataset=s["dataset"], alpha=s["alpha"])
        for s, path in runs
    ]
    return pd.concat(parts, ignore_index=True)


def ordered(values: Sequence[str], order: Sequence[str] | None) -> list[str]:
    """`values` in `order` (a config's methods), the others after them in their own order."""
    present = list(dict.fromkeys(values))
    first = [v for v in order or [] if v in present]
    return first + [v for v in present if v not in first]


def mean_std(values: pd.Series, digits: int = 1) -> str:
    std = values.std()
    return f"{values.mean():.{digits}f}" + ("" if math.isnan(std) else f" ± {std:.{digits}f}")


def model_label(name: str) -> str:
    """`resnet10` -> `ResNet10`, `vit_d8` -> `ViT_d8` (the paper's spelling)."""
    return name.replace("resnet", "ResNet").replace("vit", "ViT")


def group_models(runs: Runs) -> dict[tuple[str, int], list[str]]:
    """(method, seed) -> its model groups' names, group g training `models[g]` (the run's config)."""
    return {(s["method"], s["seed"]): [model_label(m) for m in s["config"]["models"]] for s, _ in runs}


def first_seed(rows: pd.DataFrame, method: str) -> pd.DataFrame:
    """A method's rows of its first seed (figures that show one run)."""
    mine = rows[rows["method"] == method]
    return mine[mine["seed"] == mine["seed"].min()]


def _write(out_dir: str | os.PathLike, name: str, text: str) -> Path:
    path = Path(out_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text)
    return path


def _markdown(table: pd.DataFrame) -> str:
    return table.to_markdown(index=False, disable_numparse=True) + "\n"


def _figure(rows: int, cols: int, width: float = 3.6, height: float = 3.0) -> tuple[Figure, np.ndarray]:
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(width * cols, height * rows), layout="constrained")
        axes = np.atleast_2d(fig.subplots(rows, cols, squeeze=False))
    return fig, axes


# --- CKA and update cosines (Figs. 1, 2a-b, 10) --------------------------------------------------
def last_probe(cka: pd.DataFrame) -> pd.DataFrame:
    """Each run's rows of its last probed round."""
    last = cka.groupby(["method", "seed"])["round"].transform("max")
    return cka[cka["round"] == last]


def layer_order(cka: pd.DataFrame) -> list[str]:
    """Probe points in network order, from the numbers in their names (layer1 < layer2, layer1.2 <
    layer2.0, blocks.2 < blocks.10), whatever order the pairs' rows list them in."""
    return sorted(dict.fromkeys(cka["layer"]), key=depth)


def main_points(cka: pd.DataFrame) -> pd.DataFrame:
    """The rows of the points cka.md, the heatmaps and the per-round curve use: stage outputs, or
    for a model without stages (ViT) block outputs."""
    return cka[cka["kind"] == ("stage" if (cka["kind"] == "stage").any() else "block")]


def spread(names: list[str], k: int = 4) -> list[str]:
    """At most `k` of `names`, evenly spread, first and last included (the ViT's heatmap columns)."""
    return names if len(names) <= k else [names[round(i * (len(names) - 1) / (k - 1))] for i in range(k)]


def cka_by_layer(cka: pd.DataFrame) -> pd.DataFrame:
    """Per method and layer: the mean over client pairs of each seed, then mean and std over seeds."""
    per_seed = cka.groupby(["method", "layer", "seed"])["cka"].mean()
    return per_seed.groupby(["method", "layer"]).agg(["mean", "std", "count"]).reset_index()


def cka_table(cka: pd.DataFrame, methods: Sequence[str]) -> pd.DataFrame:
    """cka.md: stage CKA (a ViT: block CKA) at the last probed round per method (mean ± std over
    seeds), and the first stage minus the last (positive: deeper layers less similar)."""
    stages = last_probe(main_points(cka))
    names = layer_order(stages)
    per_seed = stages.groupby(["method", "seed", "layer"])["cka"].mean().unstack("layer")
    rows = []
    for method in methods:
        seeds = per_seed.loc[method]
        row = {"method": method, "seeds": len(seeds)}
        row |= {name: mean_std(seeds[name], 3) for name in names}
        row[f"first - last {stages['kind'].iloc[0]}"] = mean_std(seeds[names[0]] - seeds[names[-1]], 3)
        rows.append(row)
    return pd.DataFrame(rows)


def cka_heatmaps(last: pd.DataFrame, methods: Sequence[str], models: dict[tuple[str, int], list[str]]) -> Figure:
    """Client x client CKA per stage of each method's first seed, clients sorted by model
    group, each tick its client's model; one colour scale (0-1) for every panel."""
    stages = spread(layer_order(main_points(last)))
    fig, axes = _figure(len(methods), len(stages), 2.6, 2.4)
    for i, method in enumerate(methods):
        run = first_seed(last, method)
        names = models[(method, int(run["seed"].iloc[0]))]
        pairs = run[["client_a", "group_a"]].to_numpy().tolist() + run[["client_b", "group_b"]].to_numpy().tolist()
        order = sorted(set(map(tuple, pairs)), key=lambda c: (c[1], c[0]))
        index = {c: k for k, (c, _) in enumerate(order)}
        ticks = [names[g] for _, g in order]
        for j, stage in enumerate(stages):
            matrix = np.eye(len(order))
            for r in run[run["layer"] == stage].itertuples():
                matrix[index[r.client_a], index[r.client_b]] = matrix[index[r.client_b], index[r.client_a]] = r.cka
            ax = axes[i, j]
            image = ax.imshow(matrix, vmin=0, vmax=1, cmap="viridis")
            ax.set_xticks(range(len(order)), ticks, fontsize=6, rotation=90)
            ax.set_yticks(range(len(order)), ticks, fontsize=6)
            ax.grid(False)
            ax.set_title(f"{method} (seed {run['seed'].iloc[0]}): {stage}" if j == 0 else stage, fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.5, label="linear CKA between two clients' models")
    fig.suptitle("Linear CKA of each client pair at the last probed round (ticks: each client's model)")
    return fig


def plot_cka(
    cka: pd.DataFrame,
    similarity: pd.DataFrame,
    metrics: pd.DataFrame,
    out_dir: str | os.PathLike,
    methods: Sequence[str],
    models: dict[tuple[str, int], list[str]],
) -> list[Path]:
    colors = {m: matplotlib.colormaps["tab10"](i % 10) for i, m in enumerate(methods)}
    last = last_probe(cka)
    paths = []
    fig, axes = _figure(1, 2, 5.0)
    for ax, kind in zip(axes[0], ("stage", "block"), strict=True):
        rows = last[last["kind"] == kind]
        if rows.empty:  # a ViT has no stage outputs
            ax.set_axis_off()
            continue
        names = layer_order(rows)
        stats = cka_by_layer(rows)
        for method in methods:
            s = stats[stats["method"] == method].set_index("layer").reindex(names)
            x = np.arange(len(names))
            ax.plot(x, s["mean"], marker="o", ms=3, color=colors[method], label=method)
            ax.fill_between(
                x,
                s["mean"] - s["std"].fillna(0),
                s["mean"] + s["std"].fillna(0),
                color=colors[method],
                alpha=0.15,
                lw=0,
            )
        ax.set_xticks(np.arange(len(names)), names, rotation=90 if kind == "block" else 0, fontsize=7)
        n = seeds_text(stats.groupby("method")["count"].max())
        ax.set(
            ylabel="linear CKA between clients",
            ylim=(0, 1.02),
            title=f"{kind} outputs, last probed round\nmean over client pairs; band ± 1 std over {n}",
        )
    next(ax for ax in axes[0] if ax.axison).legend(loc="lower left")
    paths += _save(fig, out_dir, "cka_layers")

    paths += _save(cka_heatmaps(last, methods, models), out_dir, "cka_heatmaps")

    fig, axes = _figure(1, len(methods), 3.4)
    per_round = main_points(cka).groupby(["method", "seed", "round"])["cka"].mean()
    for ax, method in zip(axes[0], methods, strict=True):
        curve = per_round.loc[method].groupby("round").mean()
        ax.plot(curve.index, curve.to_numpy(), marker="o", color="tab:blue", label="mean stage CKA")
        n = seeds_text(pd.Series([per_round.loc[method].index.get_level_values("seed").nunique()]))
        ax.set(xlabel="round", title=f"{method} (mean over {n})", ylim=(0, 1.02))
        ax.set_ylabel("mean stage CKA (solid)", color="tab:blue")
        acc = metrics[metrics["method"] == method].groupby("round")["mean_acc"].mean()
        twin = ax.twinx()
        twin.plot(acc.index, acc.to_numpy(), ls="--", marker="s", ms=3, color="tab:red", label="accuracy")
        twin.set_ylabel("test accuracy (%) (dashed)", color="tab:red")
    paths += _save(fig, out_dir, "cka_rounds")

    if similarity.empty:  # no run wrote update_similarity.csv
        return paths
    fig, axes = _figure(1, len(methods), 4.0)
    sim = last_probe(similarity).assign(same=lambda d: d["group_a"] == d["group_b"])
    for ax, method in zip(axes[0], methods, strict=True):
        rows = sim[sim["method"] == method]
        names = list(dict.fromkeys(rows["layer"]))
        for same, style in ((True, "-"), (False, "--")):
            mean = rows[rows["same"] == same].groupby("layer")["cosine"].mean().reindex(names)
            label = "same model group" if same else "different groups"
            ax.plot(np.arange(len(names)), mean.to_numpy(), ls=style, marker=".", label=label)
        n = seeds_text(pd.Series([rows["seed"].nunique()]))
        ax.set(
            xlabel="layer (network order)",
            ylabel="cosine of two clients' updates",
            title=f"{method}\nmean over client pairs and {n}",
        )
    axes[0, 0].legend()
    paths += _save(fig, out_dir, "update_similarity")
    return paths


def cka_analysis(
    root: str | os.PathLike, out_dir: str | os.PathLike, methods: Sequence[str] | None = None, grid: dict | None = None
) -> list[Path]:
    runs = runs_with(root, "cka.csv", grid)
    cka = frame(runs, "cka.csv")
    metrics = frame(runs, "metrics.csv")
    cosines = [(s, path) for s, path in runs if (path / "update_similarity.csv").exists()]
    for _, path in (run for run in runs if run not in cosines):
        print(f"incofl analysis: {path} has no update_similarity.csv, left out of update_similarity", file=sys.stderr)
    similarity = frame(cosines, "update_similarity.csv") if cosines else pd.DataFrame()
    methods = ordered(cka["method"], methods)
    paths = plot_cka(cka, similarity, metrics, out_dir, methods, group_models(runs))
    text = (
        "Linear CKA between the sampled clients' models at each stage output, last probed round "
        "(mean over client pairs, then mean ± std over seeds).\n\n"
    )
    return [*paths, _write(out_dir, "cka.md", text + _markdown(cka_table(cka, methods)))]


# --- update histograms (Figs. 2c-d, 3) -------------------------------------------------------------
def histogram_moments(hist: pd.DataFrame) -> tuple[float, float]:
    """(std, excess kurtosis) of a histogram, its values at the bin centres."""
    centre = (hist["bin_left"] + hist["bin_right"]).to_numpy() / 2
    weight = hist["count"].to_numpy().astype(float)
    mean = np.average(centre, weights=weight)
    var = np.average((centre - mean) ** 2, weights=weight)
    kurt = np.average((centre - mean) ** 4, weights=weight) / var**2 - 3.0 if var > 0 else math.nan
    return float(np.sqrt(var)), float(kurt)


def depth(name: str) -> tuple[int, ...]:
    """A state entry's place in the network from the numbers in its name (conv1 < layer1.0.conv1 <
    layer4.2.conv2; the classifier, without numbers, last), for files that list entries in another order."""
    return tuple(int(n) for n in re.findall(r"\d+", name)) or (sys.maxsize,)


def gradients_figure(hist: pd.DataFrame, methods: Sequence[str]) -> Figure:
    """Per method (its first seed) the first conv's and the deepest block conv's update
    histogram, before and after the server's transforms, on a log density axis (the tails)."""
    fig, axes = _figure(len(methods), 2, 3.8, 2.6)
    for i, method in enumerate(methods):
        run = first_seed(hist, method)
        names = sorted(dict.fromkeys(run["layer"]), key=depth)
        deep = [n for n in names if re.fullmatch(r"(layer\d+\.\d+\.conv\d|blocks\.\d+\..+)\.weight", n)] or names
        for j, layer in enumerate((names[0], deep[-1])):
            ax = axes[i, j]
            for which, color, style in (("aggregated", "tab:gray", "-"), ("applied", "tab:orange", "--")):
                h = run[(run["layer"] == layer) & (run["which"] == which)]
                width = (h["bin_right"] - h["bin_left"]).to_numpy()
                density = h["count"].to_numpy() / max(h["count"].sum(), 1) / width
                ax.step(h["bin_left"], density, where="post", color=color, ls=style, label=which)
            ax.set_yscale("log", nonpositive="mask")
            ax.xaxis.set_major_locator(MaxNLocator(5, symmetric=True))
            ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
            ax.set_title(f"{method} (seed {run['seed'].iloc[0]}, round {run['round'].iloc[0]}): {layer}", fontsize=8)
            ax.set(xlabel="update value", ylabel="density (log)")
    axes[0, 0].legend(fontsize=7, title="server's update", title_fontsize=7)
    return fig


def gradients_analysis(
    root: str | os.PathLike, out_dir: str | os.PathLike, methods: Sequence[str] | None = None, grid: dict | None = None
) -> list[Path]:
    """The first conv's and the deepest block conv's histogram at each run's last histogrammed
    round (of its largest federation: FedAvg's is its ResNet26 group), before and after the
    server's transforms; gradients.md: std and excess kurtosis per layer."""
    hist = frame(runs_with(root, "gradients.csv", grid), "gradients.csv")
    for key in ("federation", "round"):
        hist = hist[hist[key] == hist.groupby(["method", "seed"])[key].transform("max")]
    methods = ordered(hist["method"], methods)
    fig = gradients_figure(hist, methods)
    paths = _save(fig, out_dir, "gradients")
    rows = []
    for (method, layer, which, seed), h in hist.groupby(["method", "layer", "which", "seed"], sort=False):
        rows.append((method, layer, which, seed, *histogram_moments(h)))
    moments = pd.DataFrame(rows, columns=["method", "layer", "which", "seed", "std", "kurtosis"])
    table = moments.groupby(["method", "layer", "which"], sort=False)[["std", "kurtosis"]].mean().reset_index()
    table["method"] = pd.Categorical(table["method"], methods)
    table = table.sort_values(["method", "layer"], key=lambda c: c.map(depth) if c.name == "layer" else c)
    text = (
        "Std and excess kurtosis of the averaged update per layer (bin centres), last histogrammed "
        "round, mean over seeds; `applied` is after the server's transforms (InCo's step).\n\n"
    )
    return [*paths, _write(out_dir, "gradients.md", text + table.to_markdown(index=False, floatfmt=".4g") + "\n")]


# --- theta and beta (Fig. 9a-c, Table 3) ----------------------------------------------------------
PAPER_NAMES = {"InCoAvg": "InCoAvg", "InCoAvg-noOpt": "w/o optimisation"}


def table3(
    inco: pd.DataFrame, methods: Sequence[str], layers: Sequence[int], paper_names: dict[str, str]
) -> pd.DataFrame:
    """The share (%) of slices with beta > 0 of target layers `layers` (1-based, inco.csv order),
    mean over rounds per seed, then mean ± std over seeds; the paper's number beside."""
    rows = []
    for method in methods:
        runs = inco[inco["method"] == method]
        row = {"method": method}
        for k in layers:
            shares = []
            for seed, run in runs.groupby("seed"):
                targets = list(dict.fromkeys(run["layer"]))
                if k > len(targets):
                    raise ConfigError(f"--layers: {k}, but {method} seed {seed} has {len(targets)} InCo targets")
                shares.append(100 * run[run["layer"] == targets[k - 1]]["beta_pos"].mean())
            row[f"layer {k}"] = mean_std(pd.Series(shares))
            paper = PAPER_TABLE3.get(paper_names.get(method, ""), {}).get(k)
            row[f"layer {k} (paper)"] = "n/a" if paper is None else f"{paper:.1f}"
        rows.append(row)
    return pd.DataFrame(rows)


def theta_beta_figure(inco: pd.DataFrame, methods: Sequence[str], layers: Sequence[int]) -> Figure:
    """Theta per InCo target layer over rounds (one panel per method, a colourbar numbering the
    targets), and the share of beta > 0 of `layers`; both means over slices and seeds."""
    fig, axes = _figure(1, len(methods) + 1, 3.8)
    cmap = matplotlib.colormaps["viridis"]
    for ax, method in zip(axes[0], methods, strict=False):
        runs = inco[inco["method"] == method]
        targets = list(dict.fromkeys(runs["layer"]))
        scale = Normalize(1, max(len(targets), 2))
        for k, layer in enumerate(targets, start=1):
            theta = runs[runs["layer"] == layer].groupby("round")["theta"].mean()
            ax.plot(theta.index, theta.to_numpy(), color=cmap(scale(k)), lw=1)
        n = seeds_text(pd.Series([runs["seed"].nunique()]))
        ax.set(xlabel="round", ylabel="theta (mean over slices)", title=f"{method} (mean over {n})")
        bar = fig.colorbar(matplotlib.cm.ScalarMappable(scale, cmap), ax=ax, pad=0.01)
        bar.set_label("InCo target layer (1 = shallowest)")
        bar.ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax = axes[0, -1]
    for method in methods:
        runs = inco[inco["method"] == method]
        targets = list(dict.fromkeys(runs["layer"]))
        for k, style in zip(layers, ("-", "--"), strict=False):
            share = runs[runs["layer"] == targets[k - 1]].groupby("round")["beta_pos"].mean() * 100
            ax.plot(share.index, share.to_numpy(), ls=style, label=f"{method}, target layer {k}")
    ax.set(xlabel="round", ylabel="slices with beta > 0 (%)", title="share of beta > 0 (mean over seeds)")
    ax.legend(fontsize=7)
    return fig


def theta_beta_analysis(
    root: str | os.PathLike,
    out_dir: str | os.PathLike,
    methods: Sequence[str] | None = None,
    grid: dict | None = None,
    layers: Sequence[int] | None = None,
    paper_names: dict[str, str] | None = None,
) -> list[Path]:
    """`layers` (1-based InCo targets): default the paper's 11 and 13, or the two deepest targets
    of a model with fewer (ResNet26 has 16)."""
    inco = frame(runs_with(root, "inco.csv", grid), "inco.csv")
    methods = ordered(inco["method"], methods)
    if layers is None:
        fewest = int(inco.groupby(["method", "seed"])["layer"].nunique().min())
        layers = (11, 13) if fewest >= 13 else tuple(range(max(fewest - 1, 1), fewest + 1))
    names = paper_names or PAPER_NAMES
    table = table3(inco, methods, layers, names)
    fig = theta_beta_figure(inco, methods, layers)
    paths = _save(fig, out_dir, "theta_beta")
    text = (
        f"Share of kernel slices with beta > 0 (%) of InCo target layers {', '.join(map(str, layers))} "
        "(1-based, in inco.csv order), mean over rounds, mean ± std over seeds; paper: Table 3.\n\n"
    )
    return [*paths, _write(out_dir, "table3.md", text + _markdown(table))]


# --- t-SNE (Fig. 9d-f) and per-group accuracy (Fig. 10e) ------------------------------------------
def separation(points: pd.DataFrame) -> pd.Series:
    """Silhouette (scikit-learn) of one t-SNE map's points by class and by client: near 1 when the
    points form one cluster per value of that label, near 0 or below when they do not. The
    paper's Fig. 9d-f reads by eye whether clients' features cluster by class or by client. NaN
    where the label has one value (a map of one client) or a value per point."""
    xy = points[["x", "y"]].to_numpy()
    return pd.Series(
        {
            by: float(silhouette_score(xy, points[column])) if 1 < points[column].nunique() < len(xy) else math.nan
            for by, column in (("class", "label"), ("client", "client"))
        }
    )


def tsne_figure(points: pd.DataFrame, methods: Sequence[str], models: dict[tuple[str, int], list[str]]) -> Figure:
    """One map per method (its first seed's last mapped round): colour = class, marker = client,
    each client named with its model."""
    fig, axes = _figure(1, len(methods), 3.6, 4.2)
    markers, colour = "o^sDv*", matplotlib.colormaps["tab10"]
    for ax, method in zip(axes[0], methods, strict=True):
        run = first_seed(points, method)
        names = models[(method, int(run["seed"].iloc[0]))]
        for k, (client, rows) in enumerate(run.groupby("client", sort=False)):
            ax.scatter(
                rows["x"],
                rows["y"],
                c=[colour(c % 10) for c in rows["label"]],
                marker=markers[k % len(markers)],
                s=9,
                alpha=0.8,
            )
            ax.scatter(
                [],
                [],
                c="grey",
                marker=markers[k % len(markers)],
                label=f"client {client} ({names[rows['group'].iloc[0]]})",
            )
        for c in sorted(run["label"].unique()):
            ax.scatter([], [], c=[colour(c % 10)], marker="o", label=f"class {c}")
        ax.set(title=f"{method} (seed {run['seed'].iloc[0]}, round {run['round'].iloc[0]})", xticks=[], yticks=[])
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, 0), ncols=3)  # below the map
    return fig


def tsne_analysis(
    root: str | os.PathLike, out_dir: str | os.PathLike, methods: Sequence[str] | None = None, grid: dict | None = None
) -> list[Path]:
    runs = runs_with(root, "tsne.csv", grid)
    points = frame(runs, "tsne.csv")
    points = points[points["round"] == points.groupby(["method", "seed"])["round"].transform("max")]
    methods = ordered(points["method"], methods)
    fig = tsne_figure(points, methods, group_models(runs))
    paths = _save(fig, out_dir, "tsne")
    scores = points.groupby(["method", "seed"])[["x", "y", "label", "client"]].apply(separation).reset_index()
    table = scores.groupby("method").agg(
        seeds=("seed", "size"), **{f"silhouette by {by}": (by, lambda v: mean_std(v, 3)) for by in ("class", "client")}
    )
    text = (
        "Silhouette of the t-SNE map (last mapped round) by class and by client: higher means the points "
        "cluster by that label; mean ± std over seeds.\n\n"
    )
    return [*paths, _write(out_dir, "tsne.md", text + _markdown(table.reindex(methods).reset_index()))]


def groups_analysis(
    root: str | os.PathLike, out_dir: str | os.PathLike, methods: Sequence[str] | None = None, grid: dict | None = None
) -> list[Path]:
    runs = runs_with(root, None, grid)
    rows = [(s["method"], s["seed"], g, acc) for s, _ in runs for g, acc in enumerate(s["group_final_acc"])]
    acc = pd.DataFrame(rows, columns=["method", "seed", "group", "acc"])
    methods = ordered(acc["method"], methods)
    stats = acc.groupby(["method", "group"])["acc"].agg(["mean", "std"]).reset_index()
    groups = sorted(acc["group"].unique())
    names = next(iter(group_models(runs).values()))
    fig, axes = _figure(1, 1, 6.0, 3.2)
    ax, width = axes[0, 0], 0.8 / len(methods)
    for i, method in enumerate(methods):
        s = stats[stats["method"] == method].set_index("group").reindex(groups)
        ax.bar(np.arange(len(groups)) + i * width, s["mean"], width, yerr=s["std"].fillna(0), label=method, capsize=2)
    ax.set_xticks(np.arange(len(groups)) + width * (len(methods) - 1) / 2, [f"group {g}\n{names[g]}" for g in groups])
    n = seeds_text(acc.groupby(["method", "group"])["seed"].nunique())
    ax.set(ylabel="final test accuracy (%)", title=f"Accuracy of each model group: mean, error bar ± 1 std over {n}")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    paths = _save(fig, out_dir, "groups")
    table = acc.groupby(["method", "group"])["acc"].apply(mean_std).unstack("group")
    table = table.reindex(methods).rename(columns=lambda g: f"group {g}").reset_index()
    text = "Final test accuracy (%) of each model group's global model, mean ± std over seeds.\n\n"
    return [*paths, _write(out_dir, "groups.md", text + _markdown(table))]


# --- studies: robustness (Fig. 7) and the case study (Table 1) -------------------------------------
def robustness_frame(root: str | os.PathLike) -> pd.DataFrame:
    """One row per run: method, seed, dataset, alpha, batch_size, noise, acc (from summary.json; a
    config without update_noise predates it: 0). `line` names a curve: the method, with its
    (dataset, alpha) cell when the study ran at several."""
    runs = runs_with(root, None, cells=True)
    frame = pd.DataFrame(
        [
            {
                "method": s["method"],
                "seed": s["seed"],
                "dataset": s["dataset"],
                "alpha": float(s["alpha"]),
                "batch_size": s["config"]["batch_size"],
                "noise": s["config"].get("update_noise") or 0.0,
                "acc": s["final_acc"],
            }
            for s, _ in runs
        ]
    )
    several = frame[["dataset", "alpha"]].drop_duplicates().shape[0] > 1
    cell = frame["dataset"].map(dataset_label) + " α=" + frame["alpha"].astype(str)
    return frame.assign(line=frame["method"] + (", " + cell if several else ""))


def robustness_figure(runs: pd.DataFrame) -> Figure:
    """Accuracy against batch size (runs without noise) and against noise (at the batch size
    the noisy runs share); error bars (± 1 std) only where a point has several seeds, and the
    seeds per point in the title."""
    methods = ordered(runs["line"], None)
    noisy = runs[runs["noise"] > 0]
    batch = int(noisy["batch_size"].mode().iloc[0]) if len(noisy) else int(runs["batch_size"].mode().iloc[0])
    axes_data = {
        "batch size (no noise)": (runs[runs["noise"] == 0], "batch_size"),
        f"update noise (batch {batch})": (runs[runs["batch_size"] == batch], "noise"),
    }
    fig, axes = _figure(1, 2, 3.8)
    for ax, (label, (data, key)) in zip(axes[0], axes_data.items(), strict=True):
        for method in methods:
            s = data[data["line"] == method].groupby(key)["acc"].agg(["mean", "std"])
            if s["std"].notna().any():  # error bars only where a point has several seeds
                ax.errorbar(s.index, s["mean"], yerr=s["std"].fillna(0), marker="o", capsize=3, label=method)
            else:
                ax.plot(s.index, s["mean"], marker="o", label=method)
        ax.set(xlabel=label, ylabel="final test accuracy (%)")
    axes[0, 0].set_xscale("log", base=2)
    axes[0, 0].legend()
    counts = runs.groupby(["line", "batch_size", "noise"])["seed"].nunique()
    bars = ", error bars ± 1 std over seeds" if counts.max() > 1 else " (no error bars)"
    fig.suptitle(f"Final test accuracy, {seeds_text(counts)} per point{bars}")
    return fig


def robustness_analysis(root: str | os.PathLike, out_dir: str | os.PathLike) -> list[Path]:
    """robustness_figure and robustness.md (accuracy per method, batch size and noise)."""
    runs = robustness_frame(root)
    methods = ordered(runs["line"], None)
    fig = robustness_figure(runs)
    paths = _save(fig, out_dir, "robustness")
    table = runs.groupby(["line", "batch_size", "noise"])["acc"].agg([mean_std, "count"]).reset_index()
    table = table.rename(columns={"line": "method", "mean_std": "final accuracy (%)", "count": "seeds"})
    table["method"] = pd.Categorical(table["method"], methods)
    text = "Final test accuracy against the local batch size and the noise on client updates.\n\n"
    return [*paths, _write(out_dir, "robustness.md", text + _markdown(table.sort_values(["method", "noise"])))]


def case_setting(config: dict) -> tuple[str, str, str]:
    """(family, partition, models) of a case-study run, from its config."""
    family = "ViT" if config["models"][0].startswith("vit") else "ResNet"
    partition = "IID" if config["partition"] in ("iid", "iid_draw") else "non-IID"
    return family, partition, "homogeneous" if len(config["models"]) == 1 else "heterogeneous"


def case_study_analysis(root: str | os.PathLike, out_dir: str | os.PathLike) -> list[Path]:
    """table1.md: rows data set x family x {IID, non-IID} (both partitions of every family that has
    a run), columns homogeneous / heterogeneous, the paper's number beside (CIFAR-10 only; "n/a"
    where the paper gives none); table1.csv: the tidy numbers."""
    runs = runs_with(root, None, cells=True)
    acc = pd.DataFrame(
        [(s["dataset"], *case_setting(s["config"]), s["final_acc"]) for s, _ in runs],
        columns=["dataset", "family", "partition", "models", "acc"],
    )
    rows = []
    cells = acc[["dataset", "family"]].drop_duplicates().itertuples(index=False)
    for dataset, family in cells:
        for partition in ("IID", "non-IID"):
            cell = acc[(acc["dataset"] == dataset) & (acc["family"] == family) & (acc["partition"] == partition)]
            row = {"dataset": dataset_label(dataset), "family": family, "partition": partition}
            for models in ("homogeneous", "heterogeneous"):
                ours = cell[cell["models"] == models]["acc"]
                paper = PAPER_TABLE1.get((family, partition, models)) if dataset == "cifar10" else None
                row[models] = mean_std(ours) if len(ours) else "–"
                row[f"{models} (paper)"] = "n/a" if paper is None else f"{paper:.1f}"
            rows.append(row)
    table = pd.DataFrame(rows)
    tidy = acc.groupby(["dataset", "family", "partition", "models"])["acc"].agg(["mean", "std", "count"]).reset_index()
    csv = Path(out_dir) / "table1.csv"
    csv.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(csv) as tmp:
        tidy.to_csv(tmp, index=False)
    text = (
        "Case study (paper Table 1): final test accuracy (%), mean ± std over seeds; homogeneous: every "
        "client the family's largest model; the paper's numbers where it gives them.\n\n"
    )
    return [_write(out_dir, "table1.md", text + _markdown(table)), csv]


ANALYSES = {
    "cka": cka_analysis,
    "gradients": gradients_analysis,
    "theta_beta": theta_beta_analysis,
    "tsne": tsne_analysis,
    "groups": groups_analysis,
}
STUDIES = {"robustness": robustness_analysis, "case_study": case_study_analysis}
