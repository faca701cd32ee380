"""`incofl compare`: the reproduction verdict of a rerun against committed runs (per cell: means,
difference, 95% Welch interval, tolerance; overall line; exit 0 / 1 / 2), and `make run` ending
with it."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from incofl.cli import run
from incofl.report.compare import compare, read_runs, tolerance, welch_interval

REPO = Path(__file__).resolve().parents[1]
SETTINGS = {"rounds": 16, "clients": 20, "model_scale": 0.5, "threads": 1, "cache_dir": "resources/data"}
# committed final accuracies per (alpha, method), three seeds each
COMMITTED = {
    (0.5, "FedAvg"): [37.0, 35.0, 40.0],
    (0.5, "InCoAvg"): [66.0, 71.0, 64.0],
    (1.0, "FedAvg"): [50.0, 42.0, 46.0],
    (1.0, "InCoAvg"): [72.0, 72.0, 53.0],
}


def write_runs(root: Path, accs: dict, **settings) -> Path:
    for (alpha, method), values in accs.items():
        for seed, acc in enumerate(values):
            folder = root / "digits" / f"a{alpha}" / method / f"s{seed}"
            folder.mkdir(parents=True)
            config = {**SETTINGS, **settings, "seed": seed}
            summary = {
                "method": method,
                "dataset": "digits",
                "alpha": alpha,
                "seed": seed,
                "status": "completed",
                "final_acc": acc,
                "best_acc": acc + 1,
                "config": config,
            }
            (folder / "summary.json").write_text(json.dumps(summary))
    return root


def shifted(by: dict) -> dict:
    return {cell: [v + by.get(cell, 0.0) for v in values] for cell, values in COMMITTED.items()}


def test_welch_interval_is_scipys():
    a, b = np.array([61.0, 70.5, 59.25]), np.array([66.0, 71.0, 64.0, 68.5])
    diff, low, high = welch_interval(a, b)
    expected = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert diff == pytest.approx(a.mean() - b.mean())
    assert (low, high) == pytest.approx((expected.low, expected.high))


def test_tolerance_is_the_bonferroni_pooled_t_threshold():
    committed = pd.DataFrame(
        [
            {"dataset": "digits", "alpha": a, "method": m, "seed": s, "final_acc": v}
            for (a, m), vs in COMMITTED.items()
            for s, v in enumerate(vs)
        ]
    )
    pooled = np.mean([np.var(v, ddof=1) for v in COMMITTED.values()])  # equal seeds: the mean variance
    expected = stats.t.ppf(1 - 0.025 / 4, 4 * 2) * math.sqrt(pooled * (1 / 3 + 1 / 3))
    assert tolerance(committed, "final_acc", cells=4, n_rerun=3) == pytest.approx(expected)


def test_the_committed_runs_reproduce_themselves(tmp_path, capsys):
    committed = write_runs(tmp_path / "committed", COMMITTED)
    rerun = write_runs(tmp_path / "rerun", COMMITTED, threads=2, cache_dir="/elsewhere")  # no setting: paths, threads
    assert run(["compare", str(rerun), str(committed)]) == 0
    out = capsys.readouterr().out
    assert "| digits alpha=0.5 FedAvg | 3 / 3 | 37.33 | 37.33 | +0.00 | [-5.71, +5.71] | yes (tol 16.33) |" in out
    assert out.strip().splitlines()[-1] == "Verdict: REPRODUCED (4 of 4 cells)."


def test_seed_noise_reproduces_and_a_shift_does_not(tmp_path, capsys):
    committed = write_runs(tmp_path / "committed", COMMITTED)
    noise = write_runs(tmp_path / "noise", shifted({(0.5, "FedAvg"): 3.0, (1.0, "InCoAvg"): -4.0}))
    assert run(["compare", str(noise), str(committed)]) == 0
    broken = write_runs(tmp_path / "broken", shifted({(0.5, "FedAvg"): -20.0}))
    assert run(["compare", str(broken), str(committed)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    row = "| digits alpha=0.5 FedAvg | 3 / 3 | 17.33 | 37.33 | -20.00 | [-25.71, -14.29] | **no** (tol 16.33) |"
    assert row in lines[-6]
    assert lines[-1] == "Verdict: NOT REPRODUCED (3 of 4 cells reproduced; not: digits alpha=0.5 FedAvg)."


def test_a_fixed_tolerance_and_another_metric(tmp_path):
    committed = write_runs(tmp_path / "committed", COMMITTED)
    broken = write_runs(tmp_path / "broken", shifted({(0.5, "FedAvg"): -20.0}))
    assert run(["compare", str(broken), str(committed), "--tolerance", "25"]) == 0
    table = compare(read_runs(broken), read_runs(committed), "best_acc")
    assert table["difference"].tolist() == pytest.approx([-20.0, 0.0, 0.0, 0.0])


def test_a_cell_missing_on_one_side_is_not_reproduced(tmp_path, capsys):
    committed = write_runs(tmp_path / "committed", COMMITTED)
    partial = write_runs(tmp_path / "partial", {k: v for k, v in COMMITTED.items() if k != (1.0, "InCoAvg")})
    assert run(["compare", str(partial), str(committed)]) == 1
    assert "| digits alpha=1.0 InCoAvg | 0 / 3 | | | | | no: not in the rerun |" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("make_rerun", "message"),
    [
        (
            lambda root: write_runs(root, COMMITTED, rounds=30),
            "the rerun was trained with rounds=30, the committed runs with rounds=16: not the same experiment",
        ),
        (lambda root: write_runs(root, {(0.1, "FedAvg"): [1.0]}), "no cell (dataset, alpha, method) in common"),
        (lambda root: root, "no runs (summary.json) found under"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, make_rerun, message):
    committed = write_runs(tmp_path / "committed", COMMITTED)
    (tmp_path / "rerun").mkdir()
    assert run(["compare", str(make_rerun(tmp_path / "rerun")), str(committed)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_bad_tolerance_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        run(["compare", str(tmp_path), str(tmp_path), "--tolerance", "-1"])
    assert exit_.value.code == 2 and "--tolerance: '-1': a number of points >= 0" in capsys.readouterr().err


def test_make_run_ends_with_the_verdict():
    recipe = subprocess.run(
        ["make", "-C", str(REPO), "-n", "--no-print-directory", "run", "-o", "bin/.installed", "BIN=bin", "RUN_DIR=rr"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert recipe[-1] == "bin/incofl compare rr/results/runs results/runs || [ $? -eq 1 ]"
