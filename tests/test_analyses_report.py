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
from incofl.report.analyses import case_setting, histogram_moments, robustness_frame

STAGES = ["layer1", "layer2"]


def _run(root: Path, method: str, seed: int, config: dict | None = None, **files: pd.DataFrame) -> Path:
    folder = root / "cifar10" / "a0.5" / method / f"s{seed}"
    folder.mkdir(parents=True)
    summary = {"method": method, "dataset": "cifar10", "alpha": 0.5, "seed": seed, "status": "completed",
               "final_acc": 10.0 * seed + len(method), "group_final_acc": [10.0 + seed, 20.0 + seed],
               "config": {"batch_size": 64, "update_noise": 0.0, "partition": "dirichlet",
                          "models": ["resnet10", "resnet14"], **(config or {})}}  # fmt: skip
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
            rows.append({"round": 10, "client_a": ca, "client_b": cb, "group_a": 0, "group_b": gb, "layer": stage,
                         "kind": "stage", "cka": v, "cka_debiased": v})  # fmt: skip
        rows.append({**rows[-1], "round": 5, "cka": 0.0})
    return pd.DataFrame(rows)


def _similarity() -> pd.DataFrame:
    return pd.DataFrame({"round": 10, "client_a": [0, 0], "client_b": [1, 2], "group_a": 0, "group_b": [0, 1],
                         "layer": "conv1.weight", "cosine": [0.5, 0.1]})  # fmt: skip


def test_cka_table_averages_pairs_then_seeds(tmp_path):
    runs = tmp_path / "runs"
    _run(runs, "InCoAvg", 0, cka=_cka({"layer1": [0.9, 0.6, 0.3], "layer2": [0.6, 0.3, 0.0]}),
         update_similarity=_similarity())  # fmt: skip
    _run(runs, "InCoAvg", 1, cka=_cka({"layer1": [0.8, 0.8, 0.8], "layer2": [0.4, 0.4, 0.4]}),
         update_similarity=_similarity())  # fmt: skip
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
    inco = pd.DataFrame([{"round": r, "layer": t, "theta": 1.0, "beta": 0.0,
                          "beta_pos": 0.9 if t == "t11" else 0.6 if t == "t13" else 0.5}
                         for r in (1, 2) for t in targets])  # fmt: skip
    runs = tmp_path / "runs"
    _run(runs, "InCoAvg", 0, inco=inco)
    _run(runs, "InCoAvg-noOpt", 0, inco=inco.assign(beta_pos=0.5))
    assert run(["analysis", "theta-beta", "--runs", str(runs), "--out", str(tmp_path / "out")]) == 0
    lines = (tmp_path / "out" / "table3.md").read_text().splitlines()
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")] for line in lines[4:]}
    assert rows["InCoAvg"] == ["InCoAvg", "90.0", "83.8", "60.0", "74.4"]
    assert rows["InCoAvg-noOpt"] == ["InCoAvg-noOpt", "50.0", "53.5", "50.0", "50.2"]
    assert run(["analysis", "theta-beta", "--runs", str(runs), "--out", str(tmp_path / "o"), "--layers", "17"]) == 2


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
    assert case_setting({"models": ["vit_d8", "vit_d9"], "partition": "dirichlet"}) == ("ViT", "non-IID",
                                                                                       "heterogeneous")  # fmt: skip
    runs = tmp_path / "runs"
    _run(runs, "HeteroAvg", 0, {"models": ["resnet26"], "partition": "iid"})
    assert run(["analysis", "case-study", "--runs", str(runs), "--out", str(tmp_path / "out")]) == 0
    row = (tmp_path / "out" / "table1.md").read_text().splitlines()[-1]
    # final_acc 10 * 0 + len("HeteroAvg"); the heterogeneous cell has no run and the paper no number
    assert [c.strip() for c in row.strip("|").split("|")] == ["ResNet", "IID", "9.0", "81.0", "–", "n/a"]
    assert pd.read_csv(tmp_path / "out" / "table1.csv")["count"].tolist() == [1]


def test_groups_table_is_the_seed_mean_of_each_group(tmp_path):
    runs = tmp_path / "runs"
    for seed in (0, 2):
        _run(runs, "FedAvg", seed)
    assert run(["analysis", "groups", "--runs", str(runs), "--out", str(tmp_path / "out")]) == 0
    row = next(line for line in (tmp_path / "out" / "groups.md").read_text().splitlines() if "FedAvg" in line)
    assert [c.strip() for c in row.strip("|").split("|")] == ["FedAvg", "11.0 ± 1.4", "21.0 ± 1.4"]


def test_a_missing_file_is_one_line_and_exit_2(tmp_path, capsys):
    runs = tmp_path / "runs"
    _run(runs, "FedAvg", 0)
    assert run(["analysis", "tsne", "--runs", str(runs), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"incofl analysis: error: no tsne.csv under {runs}"
    assert "has no tsne.csv, skipped" in err[0]
