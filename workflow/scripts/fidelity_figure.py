"""docs/evidence.md's collapse figure: the paper's collapse of FedProx and FedNova on CIFAR-10 (alpha 0.5)
beside our runs of each hypothesis for the collapse, and their metrics.json for `dvc metrics`.

    python workflow/scripts/fidelity_figure.py results/runs-collapse results/evidence-fidelity

Left: the paper's Table 2 (500 rounds of E = 5). Right: CPU scale (config/cifar10-mini.yaml,
20 rounds of E = 1): the hypothesis runs (results/runs-collapse/cifar10/a0.5/<variant>/s<seed>/
summary.json), mean and, with more than one seed, the standard deviation. The dashed line is
chance (10 classes). Our FedAvg, FedProx and FedNova at this scale came from the cifar10-mini
grid, whose runs were not kept: they are not shown."""

import json
import sys
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from incofl.atomic import atomic_path, write_json
from incofl.report.figures import ACC_LABEL, STYLE
from incofl.report.published import paper_table2

VARIANTS = {  # run folder -> label
    "FedNova-sgd": "FedNova\nSGD, no\nmomentum",
    "FedProx-initial": "FedProx\nanchor at\ninitial model",
    "FedProx-mu10": "FedProx\nmu = 10",
}


def ours(runs: Path) -> dict[str, tuple[str, float, float, int]]:
    """Run folder -> (label, mean, std, seeds) of the final accuracy of each hypothesis's runs."""
    bars = {}
    for folder, label in VARIANTS.items():
        accs = [
            json.loads(p.read_text())["final_acc"]
            for p in sorted((runs / "cifar10" / "a0.5" / folder).glob("s*/summary.json"))
        ]
        if accs:
            std = float(np.std(accs, ddof=1)) if len(accs) > 1 else 0.0
            bars[folder] = (label, float(np.mean(accs)), std, len(accs))
    return bars


def figure(bars: list[tuple[str, float, float, int]]) -> Figure:
    paper = paper_table2().query("dataset == 'cifar10' and alpha == 0.5").set_index("method")
    fig = Figure(figsize=(12, 4.2))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 6.5]}, sharey=True)
    names = ["FedAvg", "FedProx", "FedNova"]
    left.bar(names, paper.loc[names, "mean"], yerr=paper.loc[names, "std"], color=["0.55", "C1", "C0"], capsize=3)
    left.set(title="Paper (500 rounds of E = 5)", ylabel=ACC_LABEL)
    right.bar(
        [b[0] for b in bars],
        [b[1] for b in bars],
        yerr=[b[2] for b in bars],
        capsize=3,
        color=["C0", "C1", "C1"][: len(bars)],
        hatch="//",
    )
    for x, (_, mean, std, n) in enumerate(bars):
        right.text(x, mean + std + 0.8, f"{mean:.1f}\nn={n}", ha="center", va="bottom", fontsize=7)
    right.set(title="Ours, CIFAR-10 alpha = 0.5, CPU scale (20 rounds of E = 1)")
    right.tick_params(axis="x", labelsize=7)
    for ax in (left, right):
        ax.axhline(10, color="k", ls="--", lw=0.8, label="chance (10 classes)")
    right.legend(loc="upper left", fontsize=8)
    fig.text(
        0.5,
        -0.04,
        "Bars: mean final test accuracy; error bars: ± 1 standard deviation (paper: its Table 2's; "
        "ours: over the n seeds above each bar). Hatched: our runs of each hypothesis for the collapse.",
        ha="center",
        fontsize=8,
    )
    return fig


def main(runs: str, out: str) -> None:
    bars = ours(Path(runs))
    with matplotlib.rc_context(STYLE):
        fig = figure(list(bars.values()))
        for fmt in ("png", "pdf"):
            with atomic_path(Path(out) / f"collapse.{fmt}") as tmp:
                fig.savefig(
                    tmp,
                    format=fmt,
                    dpi=150,
                    bbox_inches="tight",
                    metadata={"CreationDate": None} if fmt == "pdf" else None,
                )
    metrics = {folder: {"mean": mean, "std": std, "n_seeds": n} for folder, (_, mean, std, n) in bars.items()}
    write_json(Path(out) / "dvc" / "metrics.json", metrics)


if __name__ == "__main__":
    main(*sys.argv[1:])
