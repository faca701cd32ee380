"""`incofl compare`: the reproduction verdict of a rerun against committed runs (per seed:
identical weights; per cell: the paired or Welch interval of the difference against +-margin,
and the seeds an inconclusive cell would need; overall line; exit 0 / 1 / 3 / 2), `make run`
failing on a cell not reproduced, the verdict's power by identity (a rerun with InCo's step
switched off, trained here) and, for cross-CPU drift drawn from the committed spread, by
simulation (`python tests/test_compare.py` prints the numbers docs/workflow.md quotes)."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from incofl import registry
from incofl.cli import run
from incofl.config import RunConfig
from incofl.data.sources import dataset_for
from incofl.fl.engine.simulator import train
from incofl.report.compare import (
    INCONCLUSIVE,
    MAX_SEEDS,
    NOT_REPRODUCED,
    REPRODUCED,
    compare,
    decide,
    default_margin,
    paired_interval,
    read_runs,
    seed_spread,
    seeds_needed,
    welch_interval,
)
from incofl.spec import CE, SHARED, Method

REPO = Path(__file__).resolve().parents[1]
SETTINGS = {"rounds": 16, "clients": 20, "model_scale": 0.5, "threads": 1, "cache_dir": "resources/data"}
# committed final accuracies per (alpha, method), three seeds each
COMMITTED = {
    (0.5, "FedAvg"): [37.0, 35.0, 40.0],
    (0.5, "InCoAvg"): [66.0, 71.0, 64.0],
    (1.0, "FedAvg"): [50.0, 42.0, 46.0],
    (1.0, "InCoAvg"): [72.0, 72.0, 53.0],
}
DRIFT = [0.5, -0.3, 0.2]  # another CPU: each seed's run a little away from its committed twin
MARGIN = math.sqrt(np.mean([np.var(v, ddof=1) for v in COMMITTED.values()]))  # equal seeds: the mean variance


def write_runs(root: Path, accs: dict, hardware: str | None = None, device: str = "cpu", **settings) -> Path:
    """Runs with these accuracies; a run's weights' hash follows from its cell, seed and accuracy
    (equal accuracies: the same run)."""
    for (alpha, method), values in accs.items():
        for seed, acc in enumerate(values):
            folder = root / "digits" / f"a{alpha}" / method / f"s{seed}"
            folder.mkdir(parents=True)
            summary = {
                "method": method,
                "dataset": "digits",
                "alpha": alpha,
                "seed": seed,
                "status": "completed",
                "final_acc": acc,
                "best_acc": acc + 1,
                "state_sha256": hashlib.sha256(f"{alpha} {method} {seed} {acc}".encode()).hexdigest(),
                "wall_s": 10.0 + len(str(root)),  # a rerun's own timings: never the same file
                "device": device,
                "config": {**SETTINGS, **settings, "seed": seed},
            }
            if hardware is not None:
                summary["hardware"] = hardware
            (folder / "summary.json").write_text(json.dumps(summary))
    return root


def diverge(root: Path, alpha: float, method: str, seed: int, round_: int = 5) -> None:
    """Make a run of `root` one that diverged in `round_` (no accuracy, no weights)."""
    path = root / "digits" / f"a{alpha}" / method / f"s{seed}" / "summary.json"
    summary = json.loads(path.read_text())
    for key in ("final_acc", "best_acc", "state_sha256"):
        del summary[key]
    path.write_text(json.dumps(summary | {"status": "diverged", "diverged_round": round_}))


def shifted(by: dict, drift: list[float] | None = None) -> dict:
    drift = drift or [0.0] * 3
    return {
        cell: [v + by.get(cell, 0.0) + d for v, d in zip(values, drift, strict=True)]
        for cell, values in COMMITTED.items()
    }


def verdicts(out: str) -> dict[str, str]:
    """Cell label -> its verdict column, from the printed table."""
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| digits")]
    return {r[1].strip(): r[8].strip().split(" (")[0].strip("*") for r in rows}


def test_welch_interval_is_scipys():
    a, b = np.array([61.0, 70.5, 59.25]), np.array([66.0, 71.0, 64.0, 68.5])
    diff, low, high = welch_interval(a, b)
    expected = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert diff == pytest.approx(a.mean() - b.mean())
    assert (float(low), float(high)) == pytest.approx((expected.low, expected.high))


def test_paired_interval_is_scipys_and_runs_over_replicates():
    a, b = np.array([61.0, 70.5, 59.25, 66.0]), np.array([66.0, 71.0, 64.0, 68.5])
    diff, low, high = paired_interval(a - b)
    expected = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert diff == pytest.approx((a - b).mean()) and (low, high) == pytest.approx((expected.low, expected.high))
    many = paired_interval(np.stack([a - b, b - a]))  # rows: replicates (the simulation's use)
    assert many[1] == pytest.approx([expected.low, -expected.high])


def test_decide_is_inside_outside_or_across_the_margin():
    low, high = np.array([-1.0, 3.5, -9.0, -4.0, math.nan]), np.array([1.0, 6.0, -3.1, 1.0, math.nan])
    assert list(decide(low, high, 3.0)) == [REPRODUCED, NOT_REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, INCONCLUSIVE]
    assert list(decide(low, high, math.nan)) == [INCONCLUSIVE] * 5  # no margin: no verdict either way


def _frame(accs: dict) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"dataset": "digits", "alpha": a, "method": m, "seed": s, "final_acc": v, "status": "completed"}
            for (a, m), vs in accs.items()
            for s, v in enumerate(vs)
        ]
    )


def test_the_default_margin_is_one_committed_seed_sd_whatever_the_seed_count():
    """The old tol (s / sqrt(n)) shrank as seeds were added; the margin does not."""
    assert seed_spread(_frame(COMMITTED), "final_acc") == pytest.approx(MARGIN)
    assert default_margin(_frame(COMMITTED), "final_acc") == pytest.approx(MARGIN)
    more = {cell: [*values, *values, *values] for cell, values in COMMITTED.items()}  # 9 seeds: not divided by 3
    assert default_margin(_frame(more), "final_acc") == pytest.approx(MARGIN * math.sqrt(6 / 8))  # (9 - 1) vs 3 (3 - 1)
    assert math.isnan(default_margin(_frame({(0.5, "FedAvg"): [37.0]}), "final_acc"))  # one seed: no spread


def test_seeds_needed_is_the_fewest_seeds_whose_interval_and_spread_fit_the_margin():
    """n = min {n : (t_.975 + t_.90) sqrt(var / n) <= margin}: paired with n - 1 degrees of freedom,
    Welch with n seeds a side and its degrees of freedom."""

    def width(n: int, variances: tuple[float, ...]) -> float:
        var = sum(variances)
        df = n - 1 if len(variances) == 1 else (n - 1) * var**2 / sum(v**2 for v in variances)
        return (stats.t.ppf(0.975, df) + stats.t.ppf(0.9, df)) * math.sqrt(var / n)

    for variances, margin in (((16.0,), 5.0), ((16.0,), 1.0), ((9.0, 25.0), 5.0), ((9.0, 0.0), 3.0)):
        n = seeds_needed(variances, margin)
        assert width(n, variances) <= margin < width(n - 1, variances)
    assert seeds_needed((16.0,), 2.5) > seeds_needed((16.0,), 5.0) > seeds_needed((4.0,), 5.0)
    assert seeds_needed((0.0,), 1.0) == 2  # no spread: the interval is the difference
    assert seeds_needed((16.0,), 0.0) is None and seeds_needed((16.0,), math.nan) is None
    assert seeds_needed((16.0,), 0.01) is None  # more than MAX_SEEDS
    assert seeds_needed((16.0,), 4.0 * 3.3 / math.sqrt(MAX_SEEDS - 100)) is not None


def test_identical_seeds_reproduce_whatever_the_paths_and_threads(tmp_path, capsys):
    committed = write_runs(tmp_path / "committed", COMMITTED)
    rerun = write_runs(tmp_path / "rerun", COMMITTED, hardware="cpu X", threads=2, cache_dir="/elsewhere")
    assert run(["compare", str(rerun), str(committed)]) == 0
    out = capsys.readouterr().out
    row = "| digits alpha=0.5 FedAvg | 3 / 3 | 3 | 37.33 | 37.33 |  |  | IDENTICAL (3 of 3 seeds bit-identical)"
    assert row in out
    assert "Margin: +-6.24 points (the default: 1 seed standard deviation of the committed runs)." in out
    assert out.strip().splitlines()[-1] == "Verdict: REPRODUCED (4 cells: 4 identical)."


def test_on_the_same_hardware_a_seed_not_identical_is_not_reproduced(tmp_path, capsys):
    committed = write_runs(tmp_path / "committed", COMMITTED, hardware="cpu X")
    rerun = write_runs(tmp_path / "rerun", shifted({}, [0.0, 0.0, 0.01]), hardware="cpu X")  # one seed, 0.01 off
    assert run(["compare", str(rerun), str(committed)]) == 1
    out = capsys.readouterr().out
    assert set(verdicts(out).values()) == {NOT_REPRODUCED}
    assert "same hardware and threads, 1 seed(s) not identical" in out


@pytest.mark.parametrize(
    ("settings", "why"),
    [({"threads": 2}, "other hardware or threads"), ({"device": "cuda:0"}, "GPU runs (not bit-deterministic)")],
)
def test_other_threads_or_a_gpu_are_judged_on_the_evidence(tmp_path, capsys, settings, why):
    """A CPU run's floats depend on its thread count, a GPU's on cuDNN's kernel choice: no identity there."""
    committed = write_runs(tmp_path / "committed", COMMITTED, hardware="cpu X", device=settings.get("device", "cpu"))
    rerun = write_runs(tmp_path / "rerun", shifted({}, DRIFT), hardware="cpu X", **settings)
    assert run(["compare", str(rerun), str(committed)]) == 0
    assert f"| REPRODUCED ({why}; paired) |" in capsys.readouterr().out


def test_other_hardware_is_judged_on_the_evidence_and_unknown_hardware_says_so(tmp_path, capsys):
    committed = write_runs(tmp_path / "committed", COMMITTED, hardware="cpu X")
    noise = write_runs(tmp_path / "noise", shifted({}, DRIFT), hardware="cpu Y")
    assert run(["compare", str(noise), str(committed)]) == 0
    out = capsys.readouterr().out
    assert set(verdicts(out).values()) == {REPRODUCED} and "(other hardware or threads; paired)" in out
    legacy = write_runs(tmp_path / "legacy", COMMITTED)  # made before runs recorded their hardware
    assert run(["compare", str(noise), str(legacy)]) == 0
    assert "(hardware unknown (not recorded); paired)" in capsys.readouterr().out


def test_a_shift_beyond_the_margin_is_not_reproduced(tmp_path, capsys):
    committed = write_runs(tmp_path / "committed", COMMITTED)
    broken = write_runs(tmp_path / "broken", shifted({(0.5, "FedAvg"): -20.0}, DRIFT))
    assert run(["compare", str(broken), str(committed)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert "| digits alpha=0.5 FedAvg | 3 / 3 | 0 | 17.47 | 37.33 | -19.87 | [-20.87, -18.86] | **NOT" in lines[6]
    assert lines[-1] == (
        "Verdict: NOT REPRODUCED (4 cells: 3 reproduced, 1 not reproduced); not reproduced: digits alpha=0.5 FedAvg."
    )


def test_the_old_verdicts_false_pass_is_never_reproduced(tmp_path, capsys):
    """A rerun 6.5 points lower, one seed far off: the old rule (interval holds 0) passed it."""
    committed = write_runs(tmp_path / "committed", {(0.5, "FedAvg"): [80.1, 81.0, 82.3]})
    rerun = write_runs(tmp_path / "rerun", {(0.5, "FedAvg"): [62.0, 80.5, 81.5]})
    assert run(["compare", str(rerun), str(committed)]) == 3
    assert verdicts(capsys.readouterr().out) == {"digits alpha=0.5 FedAvg": INCONCLUSIVE}
    table = compare(read_runs(rerun), read_runs(committed), "final_acc", margin=10.0)  # even with a wide margin
    assert table["verdict"].tolist() == [INCONCLUSIVE]


def test_diverged_seeds_are_compared_on_both_sides(tmp_path, capsys):
    committed = write_runs(tmp_path / "committed", COMMITTED)
    rerun = write_runs(tmp_path / "rerun", shifted({}, DRIFT))
    diverge(rerun, 1.0, "InCoAvg", 1)
    diverge(rerun, 1.0, "InCoAvg", 2)  # one seed left: the old verdict judged it alone
    assert run(["compare", str(rerun), str(committed)]) == 1
    out = capsys.readouterr().out
    assert verdicts(out)["digits alpha=1.0 InCoAvg"] == NOT_REPRODUCED
    assert "seed 1 diverged in the rerun, completed in the committed runs" in out
    diverge(committed, 1.0, "InCoAvg", 1)
    diverge(committed, 1.0, "InCoAvg", 2)  # the same seeds diverged in the same round: the same outcome
    table = compare(read_runs(rerun), read_runs(committed), "final_acc")
    assert table.set_index("method").loc["InCoAvg", "verdict"].tolist() == [REPRODUCED, INCONCLUSIVE]  # 1 seed


def test_a_declared_margin_is_recorded_and_another_metric(tmp_path, capsys):
    committed = write_runs(tmp_path / "committed", COMMITTED)
    broken = write_runs(tmp_path / "broken", shifted({(0.5, "FedAvg"): -20.0}, DRIFT))
    assert run(["compare", str(broken), str(committed), "--margin", "25"]) == 0
    assert "Margin: +-25.00 points (declared: --margin)." in capsys.readouterr().out
    assert run(["compare", str(broken), str(committed), "--tolerance", "25"]) == 0  # its old name
    table = compare(read_runs(broken), read_runs(committed), "best_acc")
    assert table["difference"].tolist() == pytest.approx([-20 + np.mean(DRIFT)] + [np.mean(DRIFT)] * 3)


def test_an_inconclusive_cell_says_how_many_seeds_would_reach_a_yes(tmp_path, capsys):
    """Paired: at the within-seed differences' spread; Welch: at both sides' seed spreads."""
    committed = write_runs(tmp_path / "committed", COMMITTED, hardware="cpu X")
    wide = [4.0, -3.0, 2.0]  # another CPU drifting more than DRIFT: the interval crosses the margin
    rerun = write_runs(tmp_path / "rerun", shifted({}, wide), hardware="cpu Y")
    assert run(["compare", str(rerun), str(committed)]) == 3
    out = capsys.readouterr().out
    needed = seeds_needed((float(np.var(wide, ddof=1)),), MARGIN)
    assert needed > 3 and set(verdicts(out).values()) == {INCONCLUSIVE}
    assert f"(other hardware or threads; paired; a yes reachable with {needed} seeds a side at this spread) |" in out
    table = compare(read_runs(rerun), read_runs(committed), "final_acc")
    assert table["seeds_needed"].tolist() == [needed] * 4 and table["margin"].tolist() == [MARGIN] * 4
    four = write_runs(tmp_path / "four", {(0.5, "FedAvg"): [40.0, 30.0, 45.0, 35.0]}, hardware="cpu Y")
    row = compare(read_runs(four), read_runs(committed), "final_acc").set_index(["alpha", "method"]).loc[0.5, "FedAvg"]
    spreads = (float(np.var([40, 30, 45, 35], ddof=1)), float(np.var(COMMITTED[0.5, "FedAvg"], ddof=1)))
    welch = seeds_needed(spreads, MARGIN)  # a rerun seed without a twin: Welch, at both sides' spreads
    assert (row["verdict"], row["seeds_needed"]) == (INCONCLUSIVE, welch) and welch > 4
    assert row["why"].endswith(f"Welch; a yes reachable with {welch} seeds a side at this spread")


def test_an_interval_narrower_than_the_margin_but_across_it_says_so(tmp_path):
    committed = write_runs(tmp_path / "committed", {(0.5, "FedAvg"): [37.0, 35.0, 40.0]}, hardware="cpu X")
    near = write_runs(tmp_path / "near", {(0.5, "FedAvg"): [43.0, 41.1, 46.2]}, hardware="cpu Y")  # +6.0, +6.1, +6.2
    [row] = compare(read_runs(near), read_runs(committed), "final_acc", margin=6.1).itertuples()
    assert (row.verdict, row.seeds_needed) == (INCONCLUSIVE, 2)
    assert row.why.endswith("paired; the interval fits the margin but the difference lies near it")
    [row] = compare(read_runs(near), read_runs(committed), "final_acc", margin=0.0).itertuples()
    assert row.verdict == NOT_REPRODUCED  # margin 0: only identity reproduces


def test_a_cell_missing_on_one_side_is_not_reproduced(tmp_path, capsys):
    committed = write_runs(tmp_path / "committed", COMMITTED)
    partial = write_runs(tmp_path / "partial", {k: v for k, v in COMMITTED.items() if k != (1.0, "InCoAvg")})
    assert run(["compare", str(partial), str(committed)]) == 1
    assert "| digits alpha=1.0 InCoAvg | 0 / 3 |  |  |  |  |  | **NOT REPRODUCED** (not in the rerun) |" in (
        capsys.readouterr().out
    )


def _one_rerun_seed_other(root: Path) -> Path:
    write_runs(root, COMMITTED)
    path = root / "digits" / "a0.5" / "FedAvg" / "s2" / "summary.json"
    summary = json.loads(path.read_text())
    path.write_text(json.dumps(summary | {"config": summary["config"] | {"rounds": 30}}))
    return root


@pytest.mark.parametrize(
    ("make_rerun", "message"),
    [
        (
            lambda root: write_runs(root, COMMITTED, rounds=30),
            "the rerun's seed 0 was trained with rounds=30, the committed seed 0 with rounds=16: not the same",
        ),
        (_one_rerun_seed_other, "digits alpha=0.5 FedAvg: the rerun's seed 2 was trained with rounds=30"),
        (lambda root: write_runs(root, {(0.1, "FedAvg"): [1.0]}), "no cell (dataset, alpha, method) in common"),
        (lambda root: root, "no runs (summary.json) found under"),
        (lambda root: root.parent / "committed", "the rerun and the committed runs are the same folder"),
        (
            lambda root: shutil.copytree(root.parent / "committed", root, dirs_exist_ok=True),
            "holds the same summary.json files as",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, make_rerun, message):
    committed = write_runs(tmp_path / "committed", COMMITTED)
    (tmp_path / "rerun").mkdir()
    assert run(["compare", str(make_rerun(tmp_path / "rerun")), str(committed)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_every_committed_runs_settings_are_checked(tmp_path, capsys):
    committed = _one_rerun_seed_other(tmp_path / "committed")
    rerun = write_runs(tmp_path / "rerun", COMMITTED)
    assert run(["compare", str(rerun), str(committed)]) == 2
    assert "the committed seed 2 was trained with rounds=30, the committed seed 0 with rounds=16" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("key", "committed_value", "value"),
    [("client_memory_mb", 2048, 0), ("checkpoint_every", 5, 1), ("numerics", "native", "portable")],
)
def test_a_rerun_differing_in_what_changes_nothing_or_only_bits_is_the_same_experiment(
    tmp_path, capsys, key, committed_value, value
):
    """A memory budget or checkpoint cadence (config.Affects.NOTHING) or the CPU kernels (BITS) may differ."""
    committed = write_runs(tmp_path / "committed", COMMITTED, **{key: committed_value})
    rerun = write_runs(tmp_path / "rerun", COMMITTED, **{key: value})
    assert run(["compare", str(rerun), str(committed)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "Verdict: REPRODUCED (4 cells: 4 identical)."


def test_a_rerun_scored_in_other_batches_is_not_the_same_experiment(tmp_path, capsys):
    """eval_batch_size decides which test images are scored (drop_last) and batch BN's statistics: a result."""
    committed = write_runs(tmp_path / "committed", COMMITTED, eval_batch_size=1000)
    rerun = write_runs(tmp_path / "rerun", COMMITTED, eval_batch_size=512)
    assert run(["compare", str(rerun), str(committed)]) == 2
    assert "with eval_batch_size=512, the committed seed 0 with eval_batch_size=1000" in capsys.readouterr().err


def test_a_bad_margin_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        run(["compare", str(tmp_path), str(tmp_path), "--margin", "-1"])
    assert exit_.value.code == 2 and "--margin/--tolerance: '-1': a number of points >= 0" in capsys.readouterr().err


def test_make_run_fails_on_a_cell_not_reproduced():
    recipe = subprocess.run(
        ["make", "-C", str(REPO), "-n", "--no-print-directory", "run", "-o", "bin/.installed", "BIN=bin", "RUN_DIR=rr"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert recipe[-1] == "bin/incofl compare rr/results/runs results/runs || [ $? -eq 3 ]"  # 1 fails make
    for code, fails in ((0, False), (1, True), (3, False)):
        verdict = recipe[-1].replace("bin/incofl compare rr/results/runs results/runs", f"(exit {code})")
        shell = subprocess.run(["sh", "-c", verdict], check=False)
        assert (shell.returncode != 0) == fails


# Power by identity: a rerun of a tiny digits experiment on this CPU whose code lost InCo's step
TINY = {
    "dataset": "digits",
    "method": "InCoAvg",
    "clients": 4,
    "ratio": 0.5,
    "models": ["resnet10", "resnet14"],
    "model_scale": 0.25,
    "rounds": 2,
    "batch_size": 64,
    "eval_every": 1,
    "threads": 1,
    "device": "cpu",
    "progress": False,
}


def _train(root: Path, cache: Path) -> Path:
    """The tiny experiment's one run (seed 0) under `root`."""
    cfg = RunConfig(**TINY, seed=0, cache_dir=str(cache))
    train(cfg, root / "digits" / "a0.5" / "InCoAvg" / "s0", data=dataset_for(cfg))
    return root


@pytest.mark.slow
def test_a_rerun_without_incos_step_is_not_reproduced_on_the_same_cpu(tmp_path, monkeypatch, capsys):
    committed = _train(tmp_path / "committed", tmp_path / "cache")
    assert run(["compare", str(_train(tmp_path / "rerun", tmp_path / "cache")), str(committed)]) == 0
    assert "| IDENTICAL (1 of 1 seeds bit-identical) |" in capsys.readouterr().out  # this CPU: bit for bit
    inco = registry.METHODS["InCoAvg"]
    assert inco.post  # the InCo step, which the plugin below leaves out (HeteroAvg under InCoAvg's name)
    monkeypatch.setitem(registry.METHODS, "InCoAvg", Method("InCoAvg", CE, SHARED, base="FedAvg", source=inco.source))
    broken = _train(tmp_path / "broken", tmp_path / "cache")
    assert run(["compare", str(broken), str(committed)]) == 1
    out = capsys.readouterr().out
    assert "**NOT REPRODUCED** (same hardware and threads, 1 seed(s) not identical)" in out
    assert json.loads((broken / "digits/a0.5/InCoAvg/s0/summary.json").read_text())["hardware"]


# Power for cross-CPU drift, simulated from the committed spread of the default experiment (read
# from its files at test time: the runs may be remade, and the spread with them)
RUNS = REPO / "results" / "runs"
REPLICATES = 20_000
SEEDS = 10  # docs/workflow.md: the seeds a side with which the verdict can say yes across CPU kinds
MEASURED_DRIFT = 0.8  # a seed's drift across CPU kinds, in committed seed sds (docs/workflow.md)
SHIFTS = (0.0, 1.0, 2.0)  # in margins
VERDICTS = (REPRODUCED, INCONCLUSIVE, NOT_REPRODUCED)


def completed_runs(runs: Path) -> pd.DataFrame:
    frame = read_runs(runs)
    return frame[frame["status"] == "completed"]


def committed_spread(runs: Path = RUNS) -> tuple[float, float, int]:
    """The committed runs' seed standard deviation and default margin (points), and their seeds a cell."""
    committed = completed_runs(runs)
    seeds = int(committed.groupby(["dataset", "alpha", "method"]).size().min())
    return seed_spread(committed, "final_acc"), default_margin(committed, "final_acc"), seeds


def simulate(sd: float, margin: float, drift_sd: float, paired: bool, seeds: int) -> dict[float, dict[str, float]]:
    """Per shift (in margins): how often one cell of `seeds` seeds a side is each verdict, for a
    rerun whose every seed is its committed twin + shift + normal drift of `drift_sd` seed standard
    deviations (paired), or a fresh draw of the seed noise (Welch: the twins share nothing)."""
    rng, out = np.random.default_rng(0), {}
    for shift in SHIFTS:
        twins = rng.normal(0.0, sd, (REPLICATES, seeds))
        if paired:
            reruns = twins + shift * margin + rng.normal(0.0, drift_sd * sd, (REPLICATES, seeds))
            _, low, high = paired_interval(reruns - twins)
        else:
            _, low, high = welch_interval(rng.normal(shift * margin, sd, (REPLICATES, seeds)), twins)
        found = decide(low, high, margin)
        out[shift] = {v: float(np.mean(found == v)) for v in VERDICTS}
    return out


def drift(rerun: Path, committed: Path = RUNS) -> tuple[float, float]:
    """A rerun's within-seed drift from the committed runs: the root mean square of rerun -
    committed over every seed both have, in points and in committed seed standard deviations."""
    keys = ["dataset", "alpha", "method", "seed"]
    ours, theirs = completed_runs(committed).set_index(keys), completed_runs(rerun).set_index(keys)
    both = theirs.index.intersection(ours.index)
    d = theirs.loc[both, "final_acc"] - ours.loc[both, "final_acc"]
    rms = float(np.sqrt((d**2).mean()))
    return rms, rms / seed_spread(completed_runs(committed), "final_acc")


def test_with_the_docs_seeds_a_drifting_rerun_reproduces_and_one_twice_the_margin_off_does_not():
    """Issue 50: SEEDS a side, each rerun seed its twin + the measured cross-CPU drift: REPRODUCED
    in at least 80% of reruns; shifted by twice the margin, NOT REPRODUCED in at least 80%; a
    shift of exactly the margin is called reproduced at most at the test's 2.5%."""
    sd, margin, _ = committed_spread()
    found = simulate(sd, margin, MEASURED_DRIFT, True, SEEDS)
    assert found[0.0][REPRODUCED] >= 0.8 and found[2.0][NOT_REPRODUCED] >= 0.8
    assert found[0.0][NOT_REPRODUCED] < 0.001 and found[2.0][REPRODUCED] < 0.001
    assert found[1.0][REPRODUCED] < 0.03 and found[1.0][NOT_REPRODUCED] < 0.03


def test_with_the_default_experiments_seeds_the_verdict_is_rarely_wrong():
    """The committed runs' own seeds (3): mostly INCONCLUSIVE, rarely a wrong yes or no."""
    sd, margin, seeds = committed_spread()
    for found in (simulate(sd, margin, MEASURED_DRIFT, True, seeds), simulate(sd, margin, 0.0, False, seeds)):
        assert found[0.0][NOT_REPRODUCED] < 0.01 and found[2.0][REPRODUCED] < 0.001 and found[1.0][REPRODUCED] < 0.03


def test_seeds_needed_is_where_the_simulated_power_crosses_80_percent():
    """The count an inconclusive cell prints means what it says, paired and Welch."""
    sd, margin, _ = committed_spread()
    n = seeds_needed(((MEASURED_DRIFT * sd) ** 2,), margin)
    assert n <= SEEDS
    power = [simulate(sd, margin, MEASURED_DRIFT, True, k)[0.0][REPRODUCED] for k in (n - 1, n)]
    assert power[0] < 0.8 <= power[1]
    n = seeds_needed((sd**2, sd**2), margin)
    power = [simulate(sd, margin, 0.0, False, k)[0.0][REPRODUCED] for k in (n - 1, n)]
    assert power[0] < 0.8 <= power[1]


def test_the_docs_give_the_seeds_and_the_margin():
    text = (REPO / "docs" / "workflow.md").read_text()
    section = text[text.index("#### Did my rerun reproduce?") :]
    assert f"**{SEEDS} seeds a side**" in section and "one seed standard deviation of the committed runs" in section


def _print_power(drifts: list[float]) -> None:
    sd, margin, seeds = committed_spread()
    print(f"committed runs: seed sd {sd:.2f} points, margin {margin:.2f} points, {seeds} seeds a cell\n")
    print(
        "| rerun seeds: committed twin + shift + | seeds a side | shift (margins) | "
        + " | ".join(VERDICTS).lower()
        + " |"
    )
    print("| :--- | :---: | :---: | :---: | :---: | :---: |")
    cases = [(f"drift {d:g} sd (paired)", d, True, n) for d in drifts for n in (seeds, SEEDS)]
    for name, drift_sd, paired, n in [*cases, *(("a fresh draw (Welch)", 0.0, False, n) for n in (seeds, SEEDS))]:
        for shift, p in simulate(sd, margin, drift_sd, paired, n).items():
            shares = " | ".join(f"{p[v]:.1%}" for v in VERDICTS)
            print(f"| {name} | {n} | {shift:g} | {shares} |")


def _print_seeds(drifts: list[float]) -> None:
    print(
        "\n| margin (seed sd) | " + " | ".join(f"drift {d:g} sd (paired)" for d in drifts) + " | a fresh draw (Welch) |"
    )
    print("| :---: |" + " :---: |" * (len(drifts) + 1))
    for m in (0.5, 1.0, 1.5, 2.0):
        needed = [seeds_needed((d**2,), m) for d in drifts] + [seeds_needed((1.0, 1.0), m)]
        print(f"| {m:g} | " + " | ".join(map(str, needed)) + " |")


if __name__ == "__main__":  # docs/workflow.md's numbers
    # python tests/test_compare.py [DRIFT_SD ...]: the simulated verdicts and the seeds needed (default: the
    # drifts measured)
    # python tests/test_compare.py --drift RERUN [COMMITTED]: a rerun's drift (default: from results/runs)
    if sys.argv[1:2] == ["--drift"]:
        rms, ratio = drift(*map(Path, sys.argv[2:4]))
        print(f"{sys.argv[2]}: within-seed drift {rms:.2f} points rms = {ratio:.2f} committed seed sd")
    else:
        drifts = [float(d) for d in sys.argv[1:]] or [0.8, 0.97]
        _print_power(drifts)
        _print_seeds(drifts)
