"""`incofl analysis` (report/analyses.py) on small hand-made run folders: the tables hold the
numbers computed by hand (pairs, then seeds), histogram moments match the distribution they
came from, studies are read from each run's config, and bad input is one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from incofl.cli import run
from incofl.report.analyses import (
    case_setting,
    cka_heatmaps,
    gradients_figure,
    histogram_moments,
    layer_order,
    robustness_figure,
    robustness_frame,
    separation,
    theta_beta_figure,
    tsne_figure,
)

STAGES = ["layer1", "layer2"]


def _run(root: Path, method: str, seed: int, config: dict | None = None, **files: pd.DataFrame) -> Path:
    folder = root / "cifar10" / "a0.5" / method / f"s{seed}"
    folder.mkdir(parents=True)
    summary = {
        "method": method,
        "dataset": "cifar10",
        "alpha": 0.5,
        "seed": seed,
        "status": "completed",
        "final_acc": 10.0 * seed + len(method),
        "group_final_acc": [10.0 + seed, 20.0 + seed],
        "config": {
            "batch_size": 64,
            "update_noise": 0.0,
            "partition": "dirichlet",
            "models": ["resnet10", "resnet14"],
            **(config or {}),
        },
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    pd.DataFrame({"round": [5, 10], "mean_acc": [10.0, 20.0]}).to_csv(folder / "metrics.csv", index=False)
    for name, table in files.items():
        table.to_csv(folder / f"{name}.csv", index=False)
    return folder


def _cka(values: dict[str, list[float]]) -> pd.DataFrame:
    """Three clients (groups 0, 0, 1): pairs (0,1), (0,2), (1,2) per stage at round 10, and a
    round-5 row that the table must ignore (not the last probed round)."""
    rows = []
    for stage, (a, b, c) in values.items():
        for (ca, cb, gb), v in zip([(0, 1, 0), (0, 2, 1), (1, 2, 1)], (a, b, c), strict=True):
            rows.append(
                {
                    "round": 10,
                    "client_a": ca,
                    "client_b": cb,
                    "group_a": 0,
                    "group_b": gb,
                    "layer": stage,
                    "kind": "stage",
                    "cka": v,
                    "cka_debiased": v,
                }
            )
        rows.append({**rows[-1], "round": 5, "cka": 0.0})
    return pd.DataFrame(rows)


def _similarity() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "round": 10,
            "client_a": [0, 0],
            "client_b": [1, 2],
            "group_a": 0,
            "group_b": [0, 1],
            "layer": "conv1.weight",
            "cosine": [0.5, 0.1],
        }
    )


@pytest.mark.slow
def test_cka_table_averages_pairs_then_seeds(tmp_path):
    runs = tmp_path / "runs"
    _run(
        runs,
        "InCoAvg",
        0,
        cka=_cka({"layer1": [0.9, 0.6, 0.3], "layer2": [0.6, 0.3, 0.0]}),
        update_similarity=_similarity(),
    )
    _run(
        runs,
        "InCoAvg",
        1,
        cka=_cka({"layer1": [0.8, 0.8, 0.8], "layer2": [0.4, 0.4, 0.4]}),
        update_similarity=_similarity(),
    )
    assert run(["analysis", "cka", "--runs", str(runs), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "cka.md").read_text()
    # layer1: seed means 0.6 and 0.8 -> 0.700 ± 0.141; layer2: 0.3 and 0.4; first - last: 0.3 and 0.4
    row = next(line for line in text.splitlines() if line.startswith("| InCoAvg"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == ["InCoAvg", "2", "0.700 ± 0.141", "0.350 ± 0.071", "0.350 ± 0.071"]
    for name in ("cka_layers", "cka_heatmaps", "cka_rounds", "update_similarity"):
        assert (tmp_path / "out" / f"{name}.png").stat().st_size > 1000
        assert (tmp_path / "out" / f"{name}.pdf").exists()


def test_table3_puts_the_paper_beside_the_share_of_layers_11_and_13(tmp_path):
    targets = [f"t{k}" for k in range(1, 17)]
    inco = pd.DataFrame(
        [
            {
                "round": r,
                "layer": t,
                "theta": 1.0,
                "beta": 0.0,
                "beta_pos": 0.9 if t == "t11" else 0.6 if t == "t13" else 0.5,
            }
            for r in (1, 2)
            for t in targets
        ]
    )
    runs = tmp_path / "runs"
    _run(runs, "InCoAvg", 0, inco=inco)
    _run(runs, "InCoAvg-noOpt", 0, inco=inco.assign(beta_pos=0.5))
    assert run(["analysis", "theta_beta", "--runs", str(runs), "--out", str(tmp_path / "out")]) == 0
    lines = (tmp_path / "out" / "table3.md").read_text().splitlines()
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")] for line in lines[4:]}
    assert rows["InCoAvg"] == ["InCoAvg", "90.0", "83.8", "60.0", "74.4"]
    assert rows["InCoAvg-noOpt"] == ["InCoAvg-noOpt", "50.0", "53.5", "50.0", "50.2"]
    assert run(["analysis", "theta_beta", "--runs", str(runs), "--out", str(tmp_path / "o"), "--layers", "17"]) == 2


def test_histogram_moments_of_a_normal_sample():
    values = np.random.default_rng(0).normal(0.0, 2.0, 200_000)
    counts, edges = np.histogram(values, bins=200, range=(-12, 12))
    std, kurtosis = histogram_moments(pd.DataFrame({"bin_left": edges[:-1], "bin_right": edges[1:], "count": counts}))
    assert std == pytest.approx(2.0, rel=0.01)
    assert abs(kurtosis) < 0.05
    uniform = pd.DataFrame({"bin_left": np.arange(100.0), "bin_right": np.arange(1.0, 101.0), "count": 1})
    assert histogram_moments(uniform)[1] == pytest.approx(-1.2, abs=0.01)  # a uniform's excess kurtosis


def test_robustness_reads_batch_and_noise_from_each_run(tmp_path):
    runs = tmp_path / "runs"
    for i, (batch, noise) in enumerate([(32, 0.0), (64, 0.0), (64, 0.5)]):
        folder = _run(runs, "FedAvg", 0, {"batch_size": batch, "update_noise": noise})
        folder.rename(folder.with_name(f"run{i}"))  # the folder name carries nothing
    frame = robustness_frame(runs)
    assert sorted(zip(frame["batch_size"], frame["noise"], strict=True)) == [(32, 0.0), (64, 0.0), (64, 0.5)]
    assert run(["analysis", "robustness", "--runs", str(runs), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "robustness.png").stat().st_size > 1000


def test_case_study_settings_and_the_paper_beside(tmp_path):
    assert case_setting({"models": ["resnet26"], "partition": "iid"}) == ("ResNet", "IID", "homogeneous")
    assert case_setting({"models": ["vit_d8", "vit_d9"], "partition": "dirichlet"}) == (
        "ViT",
        "non-IID",
        "heterogeneous",
    )
    runs = tmp_path / "runs"
    _run(runs, "HeteroAvg", 0, {"models": ["resnet26"], "partition": "iid"})
    assert run(["analysis", "case_study", "--runs", str(runs), "--out", str(tmp_path / "out")]) == 0
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in (tmp_path / "out" / "table1.md").read_text().splitlines()[-2:]
    ]
    # final_acc 10 * 0 + len("HeteroAvg"); the heterogeneous cell has no run and the paper no number;
    # the non-IID row is there for the paper's numbers even without a run of ours
    assert rows == [
        ["CIFAR10", "ResNet", "IID", "9.0", "81.0", "–", "n/a"],
        ["CIFAR10", "ResNet", "non-IID", "–", "62.3", "–", "52.3"],
    ]
    assert pd.read_csv(tmp_path / "out" / "table1.csv")["count"].tolist() == [1]


def test_groups_table_is_the_seed_mean_of_each_group(tmp_path):
    runs = tmp_path / "runs"
    for seed in (0, 2):
        _run(runs, "FedAvg", seed)
    assert run(["analysis", "groups", "--runs", str(runs), "--out", str(tmp_path / "out")]) == 0
    row = next(line for line in (tmp_path / "out" / "groups.md").read_text().splitlines() if "FedAvg" in line)
    assert [c.strip() for c in row.strip("|").split("|")] == ["FedAvg", "11.0 ± 1.4", "21.0 ± 1.4"]


def _map(by_class: bool, seed: int = 0) -> pd.DataFrame:
    """Three clients (3 in group 0, 7 and 9 in group 1) x two classes x 20 points of a t-SNE map:
    tight clusters, one per class (every client's points of a class together) or one per client."""
    rng = np.random.default_rng(seed)
    rows = [
        {
            "round": 10,
            "client": client,
            "group": int(client > 5),
            "label": label,
            "x": 10.0 * (label if by_class else client) + rng.normal(0, 0.1),
            "y": rng.normal(0, 0.1),
        }
        for client in (3, 7, 9)
        for label in (0, 1)
        for _ in range(20)
    ]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("by_class", [True, False])
def test_tsne_separation_tells_class_clusters_from_client_clusters(by_class):
    score = separation(_map(by_class))
    clustered, mixed = ("class", "client") if by_class else ("client", "class")
    assert score[clustered] > 0.9 and score[mixed] < 0.1


def test_tsne_separation_of_a_one_client_map_is_nan_by_client():
    score = separation(_map(by_class=True).query("client == 3"))
    assert score["class"] > 0.9 and np.isnan(score["client"])


def test_tsne_legend_names_each_clients_model_and_each_class():
    fig = tsne_figure(
        _map(by_class=True).assign(method="InCoAvg", seed=0), ["InCoAvg"], {("InCoAvg", 0): ["ResNet10", "ResNet14"]}
    )
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["client 3 (ResNet10)", "client 7 (ResNet14)", "client 9 (ResNet14)", "class 0", "class 1"]


def test_tsne_table_is_the_seed_mean_of_each_runs_separation(tmp_path):
    runs = tmp_path / "runs"
    _run(runs, "FedAvg", 0, tsne=_map(by_class=False))
    _run(runs, "InCoAvg", 0, tsne=_map(by_class=True, seed=0))
    _run(runs, "InCoAvg", 1, tsne=_map(by_class=True, seed=1))
    assert run(["analysis", "tsne", "--runs", str(runs), "--out", str(tmp_path / "out")]) == 0
    rows = {
        line.split("|")[1].strip(): line.split("|")[2:5]
        for line in (tmp_path / "out" / "tsne.md").read_text().splitlines()
        if line.startswith("| ")
    }
    expected = np.mean([separation(_map(True, seed))["class"] for seed in (0, 1)])
    assert rows["InCoAvg"][0].strip() == "2" and rows["InCoAvg"][1].strip().startswith(f"{expected:.3f} ± ")
    assert float(rows["FedAvg"][2]) > 0.9  # one seed: no std


def test_a_missing_file_is_one_line_and_exit_2(tmp_path, capsys):
    runs = tmp_path / "runs"
    _run(runs, "FedAvg", 0)
    assert run(["analysis", "tsne", "--runs", str(runs), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"incofl analysis: error: no tsne.csv under {runs}"
    assert "has no tsne.csv, skipped" in err[0]


def test_probe_points_are_in_network_order_whatever_the_rows_order():
    # client 0 (ResNet26, group 4) before client 1 (ResNet10, group 0): the first pair lists only the
    # blocks both have, the deeper model's own blocks come later in the file
    rows = pd.DataFrame(
        {"group_a": [4, 4, 4, 4, 4], "layer": ["layer1.0", "layer2.0", "layer1.1", "layer2.1", "layer1.10"]}
    )
    assert layer_order(rows) == ["layer1.0", "layer1.1", "layer1.10", "layer2.0", "layer2.1"]
    assert layer_order(pd.DataFrame({"layer": ["blocks.10", "blocks.2", "blocks.0"]})) == [
        "blocks.0",
        "blocks.2",
        "blocks.10",
    ]


def test_a_vit_without_stage_outputs_is_compared_at_its_blocks(tmp_path, capsys):
    rows = [
        {
            "round": 10,
            "client_a": 0,
            "client_b": 1,
            "group_a": 0,
            "group_b": 0,
            "layer": f"blocks.{i}",
            "kind": "block",
            "cka": 1.0 - i / 20,
            "cka_debiased": 0.0,
        }
        for i in range(12)
    ]
    runs = tmp_path / "runs"
    _run(runs, "FedAvg", 0, {"models": ["vit_d12"]}, cka=pd.DataFrame(rows))  # and no update_similarity.csv
    assert run(["analysis", "cka", "--runs", str(runs), "--out", str(tmp_path / "out")]) == 0
    lines = (tmp_path / "out" / "cka.md").read_text().splitlines()
    header, row = ([c.strip() for c in line.strip("|").split("|")] for line in (lines[2], lines[4]))
    assert header[2:5] == ["blocks.0", "blocks.1", "blocks.2"] and header[-1] == "first - last block"
    assert row[2] == "1.000" and row[-1] == "0.550"  # blocks.0 - blocks.11 = 11 / 20
    assert (tmp_path / "out" / "cka_heatmaps.png").stat().st_size > 1000
    assert not (tmp_path / "out" / "update_similarity.png").exists()
    assert "has no update_similarity.csv" in capsys.readouterr().err


def _move(folder: Path, dataset: str) -> None:
    """The run re-labelled as a run of another data set (its summary says so)."""
    summary = json.loads((folder / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps({**summary, "dataset": dataset}))
    target = folder.parents[3] / dataset / "a0.5" / folder.parent.name / folder.name
    target.parent.mkdir(parents=True)
    folder.rename(target)


def test_runs_of_several_cells_are_refused_not_averaged(tmp_path, capsys):
    runs = tmp_path / "runs"
    _move(_run(runs, "FedAvg", 0, cka=_cka({"layer1": [0.9, 0.9, 0.9]})), "svhn")
    _run(runs, "FedAvg", 0, cka=_cka({"layer1": [0.1, 0.1, 0.1]}))  # same method and seed: must not be pooled
    assert run(["analysis", "cka", "--runs", str(runs), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "span 2 (dataset, alpha) cells (cifar10 a0.5, svhn a0.5)" in err[0]
    assert not (tmp_path / "out").exists()


def test_a_run_from_before_status_counts_as_completed(tmp_path):
    folder = _run(tmp_path / "runs", "FedAvg", 0)
    summary = json.loads((folder / "summary.json").read_text())
    del summary["status"]
    (folder / "summary.json").write_text(json.dumps(summary))
    assert run(["analysis", "groups", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0


def test_robustness_keeps_the_cells_of_a_study_apart(tmp_path):
    runs = tmp_path / "runs"
    _run(runs, "FedAvg", 0)
    _move(_run(runs, "FedAvg", 1), "svhn")
    frame = robustness_frame(runs)
    assert sorted(frame["line"]) == ["FedAvg, CIFAR10 α=0.5", "FedAvg, SVHN α=0.5"]
    assert run(["analysis", "robustness", "--runs", str(runs), "--out", str(tmp_path / "out")]) == 0
    rows = [line for line in (tmp_path / "out" / "robustness.md").read_text().splitlines() if "FedAvg" in line]
    assert [[c.strip() for c in row.strip("|").split("|")][::4] for row in rows] == [
        ["FedAvg, CIFAR10 α=0.5", "1"],
        ["FedAvg, SVHN α=0.5", "1"],
    ]  # one seed each, not two pooled


def test_a_config_of_several_cells_gets_a_folder_per_cell(tmp_path):
    runs = tmp_path / "runs"
    _move(_run(runs, "FedAvg", 0), "svhn")
    _run(runs, "FedAvg", 0, config={})
    config = tmp_path / "c.yaml"
    config.write_text("datasets: [cifar10, svhn]\nalphas: [0.5]\nmethods: [FedAvg]\nseeds: [0]\n")
    assert run(["analysis", "groups", "--config", str(config), "--runs", str(runs), "--out", str(tmp_path / "o")]) == 0
    assert sorted(p.parent.name for p in (tmp_path / "o").rglob("groups.md")) == ["cifar10_a0.5", "svhn_a0.5"]


# --- what the figures tell a reader -------------------------------------------------------------
def _colourbars(fig) -> list:
    return [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]


def test_cka_heatmaps_name_each_clients_model_and_show_the_colour_scale():
    last = _cka({"layer1": [0.9, 0.6, 0.3]}).query("round == 10").assign(method="InCoAvg", seed=0)
    fig = cka_heatmaps(last, ["InCoAvg"], {("InCoAvg", 0): ["ResNet10", "ResNet14"]})
    heatmap = fig.axes[0]  # clients 0, 1 train group 0 (ResNet10), client 2 group 1 (ResNet14)
    assert [t.get_text() for t in heatmap.get_yticklabels()] == ["ResNet10", "ResNet10", "ResNet14"]
    assert [t.get_text() for t in heatmap.get_xticklabels()] == ["ResNet10", "ResNet10", "ResNet14"]
    (bar,) = _colourbars(fig)
    assert "CKA" in bar.get_ylabel() and bar.get_ylim() == (0.0, 1.0)


def test_theta_panels_number_the_target_layers_on_a_colourbar():
    inco = pd.DataFrame(
        [
            {"method": m, "seed": 0, "round": r, "layer": f"t{k}", "theta": 1.0, "beta_pos": 0.5}
            for m in ("InCoAvg", "InCoAvg-noOpt")
            for r in (1, 2)
            for k in range(1, 17)
        ]
    )
    fig = theta_beta_figure(inco, ["InCoAvg", "InCoAvg-noOpt"], (11, 13))
    bars = _colourbars(fig)
    assert len(bars) == 2 and all("target layer" in b.get_ylabel() for b in bars)
    assert bars[0].get_ylim() == (1.0, 16.0)  # target 1 (shallowest) to 16
    legend = [t.get_text() for t in fig.axes[2].get_legend().get_texts()]
    assert legend == [f"{m}, target layer {k}" for m in ("InCoAvg", "InCoAvg-noOpt") for k in (11, 13)]


def test_update_histograms_have_a_log_density_axis_and_few_x_ticks():
    edges = np.linspace(-0.004, 0.004, 41)
    hist = pd.DataFrame(
        [
            {
                "method": "InCoAvg",
                "seed": 0,
                "round": 10,
                "layer": layer,
                "which": which,
                "bin_left": lo,
                "bin_right": hi,
                "count": int(1000 * np.exp(-abs(lo) * 2000)),
            }
            for layer in ("conv1.weight", "layer4.2.conv2.weight")
            for which in ("aggregated", "applied")
            for lo, hi in zip(edges[:-1], edges[1:], strict=True)
        ]
    )
    fig = gradients_figure(hist, ["InCoAvg"])
    for ax in fig.axes:
        assert ax.get_yscale() == "log"
        assert len(ax.xaxis.get_major_locator()()) <= 7  # at most 5 bins: labels that do not overlap
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["aggregated", "applied"]


def test_robustness_of_one_seed_says_so_and_draws_no_error_bars(tmp_path):
    runs = tmp_path / "runs"
    for i, (batch, noise) in enumerate([(32, 0.0), (64, 0.0), (64, 0.5)]):
        _run(runs, "FedAvg", 0, {"batch_size": batch, "update_noise": noise}).rename(runs / f"run{i}")
    one_seed = robustness_figure(robustness_frame(runs))
    assert "n=1 seed per point" in one_seed._suptitle.get_text()
    assert not any(ax.containers for ax in one_seed.axes)  # no ErrorbarContainer, none in the legend
    _run(runs, "FedAvg", 1, {"batch_size": 32, "update_noise": 0.0})
    two_seeds = robustness_figure(robustness_frame(runs))
    assert "n=1-2 seeds" in two_seeds._suptitle.get_text() and two_seeds.axes[0].containers
