"""Report layer on a hand-written runs tree: Table 2 numbers, layout, files and figures."""

from __future__ import annotations

import html
import json
import math
from html.parser import HTMLParser
from pathlib import Path

import matplotlib
import pandas as pd
import pytest
import yaml

from incofl.cli import run
from incofl.models.names import RESNETS, VITS
from incofl.report import figures
from incofl.report.figures import (
    BAND_TITLE,
    _colors,
    _curve_figure,
    _seed_band,
    ablation_methods,
    plot_ablation,
    plot_curves,
    registered_methods,
)
from incofl.report.published import is_resnet_family, paper_table2
from incofl.report.runs import collect_curves, collect_summaries
from incofl.report.tables import metrics_json, table2, to_html, to_markdown, write_metrics_json, write_tables

METHODS = ["FedAvg", "FedProx", "FedNova", "InCoNova", "InCoProx", "InCoAvg"]
BASE_OF = {
    "FedAvg": None,
    "FedProx": None,
    "FedNova": None,
    "InCoAvg": "FedAvg",
    "InCoProx": "FedProx",
    "InCoNova": "FedNova",
}
# (method, dataset, alpha) -> final accuracy per seed; FedNova has no runs at all.
FINAL = {
    ("FedAvg", "cifar10", 0.5): [50, 52, 54],
    ("InCoAvg", "cifar10", 0.5): [60, 64, 68],
    ("FedProx", "cifar10", 0.5): [40, 42],
    ("InCoProx", "cifar10", 0.5): [38, 39, 40],
    ("InCoNova", "cifar10", 0.5): [30, 32, 34],
    ("FedAvg", "cifar10", 1.0): [61],
    ("InCoAvg", "cifar10", 1.0): [70, 71, 72],
    ("HeteroAvg", "cifar10", 0.5): [55, 57, 59],
    ("HeteroAvg", "cifar10", 1.0): [63, 65],
}


def write_run(
    root: Path,
    method: str,
    dataset: str,
    alpha: float,
    seed: int,
    accs: list[float],
    groups: int = 5,
    models: tuple[str, ...] = RESNETS,
) -> Path:
    """One run directory as the engine writes it; `accs` is mean_acc per round 1..len(accs)."""
    run = root / dataset / f"a{alpha}" / method / f"s{seed}"
    run.mkdir(parents=True)
    final = float(accs[-1])
    summary = {
        "method": method,
        "dataset": dataset,
        "alpha": alpha,
        "seed": seed,
        "rounds": len(accs),
        "final_acc": final,
        "best_acc": final + 1,
        "last10_acc": final - 1,
        "group_final_acc": [final] * groups,
        "wall_s": 10.0,
        "samples_per_s": 100.0,
        "config": {"models": list(models)},
    }
    (run / "summary.json").write_text(json.dumps(summary))
    rows = [
        {"round": r, "mean_acc": a, "mean_loss": 2.0 / r, **{f"acc_g{g}": a for g in range(groups)}, "seconds": 1.0}
        for r, a in enumerate(accs, start=1)
    ]
    pd.DataFrame(rows).to_csv(run / "metrics.csv", index=False)
    return run


@pytest.fixture
def runs_root(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    for (method, dataset, alpha), finals in FINAL.items():
        for seed, final in enumerate(finals):
            write_run(root, method, dataset, alpha, seed, [final / 2, final * 0.8, final])
    return root


@pytest.fixture
def table(runs_root: Path) -> pd.DataFrame:
    return table2(collect_summaries(runs_root), methods=METHODS, base_of=BASE_OF)


def cell(table: pd.DataFrame, method: str, alpha: float) -> pd.Series:
    return table[(table["method"] == method) & (table["alpha"] == alpha)].iloc[0]


def test_collect(runs_root: Path) -> None:
    s = collect_summaries(runs_root)
    assert len(s) == sum(map(len, FINAL.values()))
    assert list(s.columns[:4]) == ["method", "dataset", "alpha", "seed"]
    assert set(s["alpha"]) == {0.5, 1.0}
    c = collect_curves(runs_root)
    assert list(c.columns) == ["method", "dataset", "alpha", "seed", "status", "round", "mean_acc", "mean_loss"]
    assert len(c) == 3 * len(s)


def test_no_runs_and_duplicates(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        collect_summaries(tmp_path)
    with pytest.raises(FileNotFoundError, match="no runs"):
        collect_curves(tmp_path)
    write_run(tmp_path / "x", "FedAvg", "cifar10", 0.5, 0, [50])
    write_run(tmp_path / "y", "FedAvg", "cifar10", 0.5, 0, [51])
    with pytest.raises(ValueError, match="repeat"):
        collect_summaries(tmp_path)


def test_numbers(table: pd.DataFrame) -> None:
    fedavg, inco = cell(table, "FedAvg", 0.5), cell(table, "InCoAvg", 0.5)
    assert (fedavg["mean"], fedavg["std"], fedavg["n_seeds"]) == (52.0, 2.0, 3)
    assert (inco["mean"], inco["std"], inco["improvement"]) == (64.0, 4.0, 12.0)
    assert cell(table, "InCoProx", 0.5)["improvement"] == pytest.approx(-2.0)
    assert math.isnan(cell(table, "FedAvg", 1.0)["std"])  # one seed: std undefined
    assert math.isnan(cell(table, "InCoNova", 0.5)["improvement"])  # base has no runs
    assert math.isnan(cell(table, "FedAvg", 0.5)["improvement"])  # no base
    assert cell(table, "InCoProx", 1.0)["n_seeds"] == 0


def test_metric_and_filters(runs_root: Path) -> None:
    t = table2(collect_summaries(runs_root), metric="best_acc", methods=["InCoAvg"], base_of=BASE_OF, alphas=[0.5])
    assert len(t) == 1  # base FedAvg is not shown but still gives the improvement
    assert (t["mean"].iloc[0], t["improvement"].iloc[0]) == (65.0, 12.0)
    with pytest.raises(ValueError, match="metric"):
        table2(collect_summaries(runs_root), metric="acc", methods=METHODS, base_of=BASE_OF)


def test_row_order(table: pd.DataFrame) -> None:
    assert list(pd.unique(table["method"])) == ["FedAvg", "FedProx", "FedNova", "InCoAvg", "InCoProx", "InCoNova"]


def test_markdown(table: pd.DataFrame, tmp_path: Path) -> None:
    write_tables(table, tmp_path, metric="final_acc", caption_extra="ResNets, 100 clients.")
    md = (tmp_path / "table2.md").read_text()
    assert "final-round accuracy" in md and "mean ± std over 1–3 seeds" in md
    assert "ResNets, 100 clients." in md
    assert "| Method | CIFAR10 α=0.5 | CIFAR10 α=1.0 |" in md
    for row in [
        "| FedAvg | 52.0 ± 2.0 | 61.0 [n=1] |",  # fewer seeds than the fullest cell
        "| FedProx | 41.0 ± 1.4 [n=2] | – |",
        "| FedNova | – | – |",
        "| InCoAvg | 64.0 ± 4.0 (+12.0) | 71.0 ± 1.0 (+10.0) |",
        "| InCoProx | 39.0 ± 1.0 (-2.0) | – |",
        "| InCoNova | 32.0 ± 2.0 | – |",
    ]:
        assert row + "\n" in md
    assert not list(tmp_path.glob("*.tmp"))


def test_paper_columns(table: pd.DataFrame, runs_root: Path, tmp_path: Path) -> None:
    write_tables(table, tmp_path, metric="final_acc", paper=paper_table2())
    md = (tmp_path / "table2.md").read_text()
    assert "| Method | CIFAR10 α=0.5 | CIFAR10 α=0.5 (paper) | CIFAR10 α=1.0 | CIFAR10 α=1.0 (paper) |" in md
    assert "| FedAvg | 52.0 ± 2.0 | 52.3 ± 3.4 | 61.0 [n=1] | 61.3 ± 3.2 |\n" in md
    assert "| InCoProx | 39.0 ± 1.0 (-2.0) | 74.5 ± 2.3 | – | 76.8 ± 1.8 |\n" in md
    assert "Columns (paper): the InCo paper's Table 2 (ResNet family" in md
    assert "paper" not in (tmp_path / "table2.tex").read_text()
    # A data set the paper does not report gets no paper column; a method it lacks gets "–".
    digits = table.assign(dataset="digits")
    assert "paper" not in to_markdown(digits, metric="final_acc", paper=paper_table2())  # nor its caption
    hetero = table2(collect_summaries(runs_root), methods=["HeteroAvg"], base_of={})
    assert "| HeteroAvg | 57.0 ± 2.0 | – | 64.0 ± 1.4 [n=2] | – |" in to_markdown(
        hetero, metric="final_acc", paper=paper_table2()
    )


def _html_rows(page: str) -> list[list[str]]:
    """The text of every th/td cell of an HTML table, row by row."""

    class Cells(HTMLParser):
        def __init__(self):
            super().__init__()
            self.rows: list[list[str]] = []
            self.cell: str | None = None

        def handle_starttag(self, tag, attrs):
            if tag == "tr":
                self.rows.append([])
            elif tag in ("td", "th"):
                self.cell = ""

        def handle_endtag(self, tag):
            if tag in ("td", "th"):
                self.rows[-1].append(self.cell.strip())
                self.cell = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell += data

    parser = Cells()
    parser.feed(page)
    return parser.rows


def test_html_table_holds_the_markdown_tables_cells_and_caption(table: pd.DataFrame, tmp_path: Path) -> None:
    """table2.html (what the Snakemake report shows) parses back to the Markdown table's rows."""
    write_tables(table, tmp_path, metric="final_acc", paper=paper_table2())
    md, page = (tmp_path / "table2.md").read_text(), (tmp_path / "table2.html").read_text()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines() if line.startswith("| ")]
    assert _html_rows(page) == [rows[0], *rows[2:]]  # the header, then every method's row
    caption = md.split("\n")[0].removeprefix("**Table 2.** ")
    assert f"<b>Table 2.</b> {html.escape(caption)}</p>" in page
    assert to_html(table, metric="final_acc").startswith("<!DOCTYPE html>")


def test_published_numbers() -> None:
    paper = paper_table2().set_index(["method", "dataset", "alpha"])
    assert len(paper) == 10 * 4 * 2 and not paper.isna().any().any()
    assert tuple(paper.loc[("InCoScaffold", "cinic10", 1.0)]) == (61.7, 3.0)
    assert tuple(paper.loc[("FedNova", "fmnist", 0.5)]) == (12.7, 0.2)
    resnet = pd.DataFrame({"config": [{"models": ["resnet10", "resnet26"]}]})
    vit = pd.DataFrame({"config": [{"models": ["resnet10"]}, {"models": ["vit_d8", "vit_d12"]}]})
    assert is_resnet_family(resnet) and not is_resnet_family(vit)
    assert not is_resnet_family(pd.DataFrame({"method": ["FedAvg"]}))  # no config recorded


def test_table_command_shows_paper_columns_for_resnet_runs(runs_root: Path, tmp_path: Path) -> None:
    config = tmp_path / "exp.yaml"
    config.write_text(
        yaml.safe_dump(
            {"datasets": ["cifar10"], "alphas": [0.5, 1.0], "methods": ["FedAvg", "InCoAvg"], "seeds": [0, 1, 2]}
        )
    )

    def table_md(root: Path, out: Path, *flags: str) -> str:
        assert run(["table", "-c", str(config), "--runs", str(root), "--out", str(out), *flags]) == 0
        return (out / "table2.md").read_text()

    assert "| FedAvg | 52.0 ± 2.0 | 52.3 ± 3.4 |" in table_md(runs_root, tmp_path / "resnet")
    assert "(paper)" not in table_md(runs_root, tmp_path / "no-paper", "--no-paper")
    vit = tmp_path / "vit"
    write_run(vit, "FedAvg", "cifar10", 0.5, 0, [50.0], models=VITS)
    assert "(paper)" not in table_md(vit, tmp_path / "vit-table")  # the paper's numbers are for the ResNet family


def test_latex(runs_root: Path, tmp_path: Path) -> None:
    table = table2(collect_summaries(runs_root), metric="last10_acc", methods=METHODS, base_of=BASE_OF)
    write_tables(table, tmp_path, metric="last10_acc")
    tex = (tmp_path / "table2.tex").read_text()
    for part in [
        r"\toprule",
        r"\cmidrule(lr){2-3}",
        r"\bottomrule",
        r"\multicolumn{2}{c}{CIFAR10}",
        r"$\alpha=0.5$ & $\alpha=1.0$",
        "mean accuracy of the last 10 rounds",
        r"InCoAvg & 63.0 $\pm$ 4.0 ($\uparrow$12.0) & 70.0 $\pm$ 1.0 ($\uparrow$10.0) \\",
        r"InCoProx & 38.0 $\pm$ 1.0 ($\downarrow$2.0) & -- \\",
    ]:
        assert part in tex
    assert tex.count(r"\midrule") == 2  # under the header, and between baselines and InCo


def test_csv_round_trip(table: pd.DataFrame, tmp_path: Path) -> None:
    write_tables(table, tmp_path, metric="final_acc")
    back = pd.read_csv(tmp_path / "table2.csv")
    assert list(back.columns) == [
        "method",
        "dataset",
        "alpha",
        "mean",
        "std",
        "n_seeds",
        "n_diverged",
        "base",
        "improvement",
    ]
    pd.testing.assert_frame_equal(back, table, check_dtype=False)


def test_metrics_json(table: pd.DataFrame, tmp_path: Path) -> None:
    m = metrics_json(table)
    json.dumps(m, allow_nan=False)
    assert m["cifar10"]["a0.5"]["InCoAvg"] == {
        "mean": 64.0,
        "std": 4.0,
        "n_seeds": 3,
        "n_diverged": 0,
        "improvement": 12.0,
    }
    assert m["cifar10"]["a1.0"]["FedAvg"]["std"] is None
    assert "FedNova" not in m["cifar10"]["a0.5"]  # no runs, no entry
    write_metrics_json(table, tmp_path / "metrics.json")
    assert json.loads((tmp_path / "metrics.json").read_text()) == m


def test_seed_band_aligns_rounds() -> None:
    runs = pd.DataFrame({"seed": [0, 0, 0, 1, 1], "round": [1, 2, 3, 1, 3], "mean_acc": [10.0, 20.0, 30.0, 14.0, 34.0]})
    band = _seed_band(runs)
    assert list(band.index) == [1, 3]
    assert list(band["mean"]) == [12.0, 32.0]


def assert_figures(paths: list[Path]) -> None:
    for path in paths:
        head = path.read_bytes()[:4]
        assert head == (b"\x89PNG" if path.suffix == ".png" else b"%PDF"), path
        assert path.stat().st_size > 1000
    assert not list(paths[0].parent.glob("*.tmp"))


def test_figures(runs_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "fig"
    curves = plot_curves(collect_curves(runs_root), out, methods=["FedAvg", "InCoAvg"])
    assert sorted(p.name for p in curves) == [
        "curves_cifar10_a0.5.pdf",
        "curves_cifar10_a0.5.png",
        "curves_cifar10_a1.0.pdf",
        "curves_cifar10_a1.0.png",
    ]
    assert_figures(curves)
    bars = plot_ablation(collect_summaries(runs_root), out, methods=["FedAvg", "HeteroAvg", "InCoAvg"])
    assert [p.name for p in bars] == ["ablation.png", "ablation.pdf"]
    assert_figures(bars)
    with pytest.raises(ValueError, match="no runs"):
        plot_ablation(collect_summaries(runs_root), out, methods=["Nope"])


def test_a_method_shares_its_base_methods_hue() -> None:
    """Light/dark shades of one tab20 hue for FedProx/InCoProx; every other colour distinct."""
    methods = ["FedAvg", "FedProx", "HeteroAvg", "InCoAvg", "InCoProx", "InCoAvg-noNorm"]
    base_of = {"InCoAvg": "FedAvg", "InCoProx": "FedProx", "InCoAvg-noNorm": "FedAvg"}
    colors = _colors(methods, base_of)
    tab20 = matplotlib.colormaps["tab20"].colors
    index = {m: tab20.index(c[:3]) for m, c in colors.items()}
    assert len(set(index.values())) == len(methods)
    for base, method in (("FedAvg", "InCoAvg"), ("FedProx", "InCoProx")):
        assert index[base] == index[method] + 1 and index[method] % 2 == 0  # (dark, light) pair
    assert index["InCoAvg-noNorm"] % 2 == 0  # the base's pair is taken: a hue of its own
    assert _colors(["HeteroAvg", "InCoAvg"], base_of) == _colors(["HeteroAvg", "InCoAvg"], {})


def test_curves_mark_each_evaluated_round_and_say_what_the_band_is() -> None:
    rows = [
        {"method": "InCoAvg", "seed": seed, "status": "completed", "round": r, "mean_acc": 10.0 * r + seed}
        for seed in (0, 1, 2)
        for r in (2, 4, 6)
    ]
    fig = _curve_figure(pd.DataFrame(rows), {"InCoAvg": (0.1, 0.2, 0.5)}, "t")
    (line,) = fig.axes[0].get_lines()
    assert line.get_marker() == "o" and list(line.get_xdata()) == [2, 4, 6]
    legend = fig.axes[0].get_legend()
    assert legend.get_title().get_text() == BAND_TITLE and "± 1 std" in BAND_TITLE
    assert [t.get_text() for t in legend.get_texts()] == ["InCoAvg (n=3)"]


@pytest.mark.parametrize(
    "grid,variants,ablation",
    [
        (["FedAvg", "HeteroAvg", "InCoAvg"], {}, ["HeteroAvg", "InCoAvg"]),  # InCo's step removed: HeteroAvg
        (["HeteroAvg", "InCoAvg-noNormOpt", "InCoAvg-noOpt", "InCoAvg"], {}, None),  # config/ablation.yaml
        (["FedAvg", "FedPer", "FedLAG", "FedLAG-K3"], {"FedLAG-K3": "FedLAG"}, ["FedLAG", "FedLAG-K3"]),  # a variant
        (["HeteroFL", "FedRolex", "InCoRolex"], {}, ["FedRolex", "InCoRolex"]),
        (["FedAvg", "FedProx", "InCoAvg", "InCoProx"], {}, None),  # no ablation: every method
    ],
)
def test_the_ablation_is_the_methods_with_a_switch_off_beside_the_full_method(grid, variants, ablation) -> None:
    assert ablation_methods(grid, lambda name: variants.get(name, name)) == (ablation or grid)


def test_the_ablation_figure_reads_variants_from_the_runs_configs(tmp_path: Path, monkeypatch) -> None:
    summaries = collect_summaries(_variant_runs(tmp_path / "runs"))
    assert registered_methods(summaries) == {"FedAvg": "FedAvg", "FedLAG": "FedLAG", "FedLAG-K3": "FedLAG"}
    drawn = []
    draw = figures._ablation_figure
    monkeypatch.setattr(
        figures, "_ablation_figure", lambda t, colors, metric: drawn.append(list(colors)) or draw(t, colors, metric)
    )
    plot_ablation(summaries, tmp_path / "fig", methods=["FedAvg", "FedLAG", "FedLAG-K3"])
    assert drawn == [["FedLAG", "FedLAG-K3"]]


def _variant_runs(root: Path) -> Path:
    for method in ("FedAvg", "FedLAG", "FedLAG-K3"):
        run = write_run(root, method, "cifar10", 0.5, 0, [40.0])
        summary = json.loads((run / "summary.json").read_text())
        summary["config"]["method"] = method.split("-")[0]
        (run / "summary.json").write_text(json.dumps(summary))
    return root
