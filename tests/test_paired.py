"""Paired comparison over seeds: differences, standard error and the exact sign test."""

import math

import pandas as pd
import pytest

from incofl.report.paired import interval95, paired, paired_figure, plot_paired, sign_test, statistics, to_markdown


def test_sign_test_is_the_exact_binomial():
    assert sign_test([1.0] * 5) == pytest.approx(2 / 32)  # 5 of 5 wins: p = 2 * (1/2)^5
    assert sign_test([1.0, 1.0, 1.0, -1.0, 0.0]) == pytest.approx(2 * (1 + 4) / 16)  # tie dropped: 3/1 of 4
    assert sign_test([1.0, -1.0]) == 1.0 and sign_test([0.0]) == 1.0


def test_paired_differences_by_seed():
    runs = pd.DataFrame(
        [
            {"dataset": "cifar10", "alpha": 0.5, "seed": s, "method": m, "final_acc": acc, "last10_acc": acc - 1}
            for s, (a, b) in enumerate([(30.0, 28.0), (31.0, 30.0), (29.0, 29.5)])
            for m, acc in (("InCoAvg", a), ("HeteroAvg", b))
        ]
        + [{"dataset": "cifar10", "alpha": 0.5, "seed": 3, "method": "InCoAvg", "final_acc": 99.0, "last10_acc": 9.0}]
    )  # seed 3 has no HeteroAvg run: not a pair
    table = paired(runs, "InCoAvg", "HeteroAvg", ["final_acc", "last10_acc"])
    final = table[table.metric == "final_acc"].iloc[0]
    diffs = [2.0, 1.0, -0.5]
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
    assert (final.n, final.wins, final.losses, final.diffs) == (3, 2, 1, diffs)
    assert final.mean_diff == pytest.approx(mean) and final.se == pytest.approx(sd / math.sqrt(3))
    assert final.sign_p == pytest.approx(1.0)
    assert table[table.metric == "last10_acc"].iloc[0].mean_diff == pytest.approx(mean)
    assert "| cifar10 | 0.5 | final_acc | 3 | +0.83 ± 0.73 | 2/1 | 1.000 | +2.00, +1.00, -0.50 |" in to_markdown(
        table, "InCoAvg", "HeteroAvg"
    )


def test_replicates_of_a_seed_are_paired_within_and_averaged():
    """A seed rerun on another device (a replicate) is paired within its replicate, and the
    seed counts once, with the mean of its replicates' differences."""
    rows = [(0, 0, 30.0, 28.0), (0, 1, 31.0, 32.0), (1, 0, 25.0, 24.0), (1, 1, 27.0, None)]
    runs = pd.DataFrame(
        [
            {"dataset": "cifar10", "alpha": 0.5, "seed": s, "replicate": r, "method": m, "final_acc": acc}
            for s, r, a, b in rows
            for m, acc in (("InCoAvg", a), ("HeteroAvg", b))
            if acc is not None
        ]
    )  # seed 1's replicate 1 has no HeteroAvg: its InCoAvg run pairs with nothing
    final = paired(runs, "InCoAvg", "HeteroAvg", ["final_acc"]).iloc[0]
    assert (final.n, final.diffs) == (2, [0.5, 1.0])  # seed 0: (+2 - 1) / 2; seed 1: +1


def test_scalefl_runs_are_also_compared_on_the_mean_over_exits():
    """ScaleFL's summaries carry the release's statistic; other methods' do not, and get no row for it."""
    scalefl = pd.DataFrame(
        [
            {
                "dataset": "cifar10",
                "alpha": 0.5,
                "seed": 0,
                "method": m,
                "final_acc": a,
                "last10_acc": a,
                "final_exits_mean": e,
            }
            for m, a, e in (("InCoScaleFL", 22.5, 23.3), ("ScaleFL", 21.1, 23.0))
        ]
    )
    assert statistics(scalefl) == ["final_acc", "last10_acc", "final_exits_mean"]
    table = paired(scalefl, "InCoScaleFL", "ScaleFL", statistics(scalefl))
    assert table[table.metric == "final_exits_mean"].iloc[0].mean_diff == pytest.approx(0.3)
    others = scalefl.drop(columns="final_exits_mean").assign(final_exits_mean=float("nan"))
    assert statistics(others) == ["final_acc", "last10_acc"]


def test_the_interval_is_students_t_with_n_minus_1_degrees_of_freedom():
    low, high = interval95([1.0, 2.0, 3.0])  # mean 2, sd 1, se 1/sqrt(3); t(0.975, 2) = 4.3027
    assert (low, high) == pytest.approx((2 - 4.302653 / math.sqrt(3), 2 + 4.302653 / math.sqrt(3)))
    assert all(math.isnan(x) for x in interval95([1.0]))


def test_paired_figure_has_a_row_per_pair_and_cell_and_a_panel_per_statistic(tmp_path):
    diffs = pd.DataFrame(
        [
            {"pair": p, "dataset": "cifar10", "alpha": a, "statistic": s, "seed": seed, "difference": d}
            for p in ("InCoRolex - FedRolex", "InCoHeteroFL - HeteroFL")
            for a in (0.5, 1.0)
            for s in ("final_acc", "last10_acc")
            for seed, d in enumerate((1.0, 2.0, 3.0))
        ]
    )
    fig = paired_figure(diffs)
    assert [ax.get_title() for ax in fig.axes] == ["final-round accuracy", "mean accuracy of the last 10 rounds"]
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[0] == "InCoRolex - FedRolex\nCIFAR10 α=0.5, n=3" and len(labels) == 4
    seeds, interval, mean = fig.axes[0].get_lines()[:3]
    assert list(seeds.get_xdata()) == [1.0, 2.0, 3.0] and list(mean.get_xdata()) == [2.0]
    assert tuple(interval.get_xdata()) == pytest.approx(interval95([1.0, 2.0, 3.0]))
    diffs.to_csv(tmp_path / "paired.csv", index=False)
    assert [p.name for p in plot_paired(tmp_path / "paired.csv", tmp_path / "fig" / "paired.png")] == [
        "paired.png",
        "paired.pdf",
    ]
