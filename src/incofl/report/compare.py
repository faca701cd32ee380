"""Did a rerun reproduce committed runs? A verdict per cell (data set, alpha, method) and overall.

Seed s fixes a run's partition, client sampling and initialisation, and every run records the
kind of hardware it ran on (summary.json's `hardware`: CPU model, instruction set, torch
version; the GPU's name on a GPU). Per seed:

- IDENTICAL: the rerun's final weights are the committed run's bit for bit (`state_sha256`), or
  both diverged in the same round. A cell whose every rerun seed is identical reproduced.
- On the CPU a run is deterministic for a kind of hardware and a thread count, so a cell with a
  seed that is not identical there is NOT REPRODUCED outright: the code, a version or the data
  changed.

On another kind or thread count, on a GPU (cuDNN's kernels are not deterministic), or where a
side does not record its kind (runs made before `hardware`), each seed drifts away from its
committed twin (Adam turns last-bit differences into visibly different runs), and the cell is
judged on the evidence:

- a seed that diverged on one side and not on the other is NOT REPRODUCED (a divergence is not
  a drift of the accuracy; it is never dropped);
- otherwise the difference of the means (rerun - committed) and its 95% t-interval: paired,
  from the within-seed differences, when every rerun seed has a committed twin (the seed's
  shared partition, sampling and initialisation cancel), else Welch's from both sides' seeds;
- the margin: how far a cell's mean may move and still count as reproduced, in points, declared
  (`--margin`) or by default one seed standard deviation of the committed runs (their variance
  pooled over every cell). It does not shrink with the number of seeds: more seeds narrow the
  interval, never the margin, so they make a yes easier, not harder;
- REPRODUCED when the whole interval lies inside [-margin, margin] (two one-sided tests at 2.5%),
  NOT REPRODUCED when it lies wholly outside, INCONCLUSIVE when it crosses +-margin; an
  inconclusive cell says how many seeds a side would make a yes reachable at its observed spread
  (`seeds_needed`).

Why this margin, and the verdict's simulated power for cross-CPU drift of the committed spread:
docs/workflow.md, "Did my rerun reproduce?" (`python tests/test_compare.py` prints the numbers).
"""

from __future__ import annotations

import filecmp
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from incofl.config import Affects, Role, run_settings
from incofl.report.runs import RunFileError, collect_summaries, completed, dataset_label, summary_files

CELL = ["dataset", "alpha", "method"]
# run settings that may differ between a rerun and the committed runs: what changes nothing a run
# computes (paths, checkpoint cadence, memory budget), what changes only its last bits (the thread
# count, device, numerics: no identity then, _kind), and the seed, in which a cell's runs differ
NOT_SETTINGS = run_settings(Affects.NOTHING, Affects.BITS, Role.REPLICATE)
IDENTICAL, REPRODUCED, INCONCLUSIVE, NOT_REPRODUCED = "IDENTICAL", "REPRODUCED", "INCONCLUSIVE", "NOT REPRODUCED"
PASSED = (IDENTICAL, REPRODUCED)
# exit codes of `incofl compare` (2: bad input); `make run` fails on 1 and reports 3
EXIT = {REPRODUCED: 0, NOT_REPRODUCED: 1, INCONCLUSIVE: 3}
# the default margin, in committed seed standard deviations (docs/workflow.md says why one)
MARGIN_SDS = 1.0
# seeds_needed: the chance of REPRODUCED it aims at for a rerun that changed nothing (a power
# of 80%, the usual planning target), and the most seeds it looks at
POWER, MAX_SEEDS = 0.8, 10_000


def paired_interval(d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean of within-seed differences `d` (last axis: seeds) and its 95% t-interval (n - 1
    degrees of freedom); NaN bounds with one seed. Any leading axes are replicates."""
    d = np.asarray(d, float)
    n, mean = d.shape[-1], d.mean(axis=-1)
    if n < 2:
        return mean, np.full_like(mean, np.nan), np.full_like(mean, np.nan)
    half = student_t.ppf(0.975, n - 1) * d.std(axis=-1, ddof=1) / math.sqrt(n)
    return mean, mean - half, mean + half


def welch_interval(rerun: np.ndarray, committed: np.ndarray) -> tuple[Any, Any, Any]:
    """Difference of means (rerun - committed) and its 95% Welch t-interval; NaN bounds when a
    side has one seed; both sides without spread: the interval is the difference itself."""
    a, b = np.asarray(rerun, float), np.asarray(committed, float)
    na, nb = a.shape[-1], b.shape[-1]
    diff = a.mean(axis=-1) - b.mean(axis=-1)
    if min(na, nb) < 2:
        return diff, diff * np.nan, diff * np.nan
    va, vb = a.var(axis=-1, ddof=1) / na, b.var(axis=-1, ddof=1) / nb
    spread = va + vb
    with np.errstate(invalid="ignore", divide="ignore"):
        df = spread**2 / (va**2 / (na - 1) + vb**2 / (nb - 1))
    half = np.where(spread > 0, student_t.ppf(0.975, np.where(spread > 0, df, 1.0)) * np.sqrt(spread), 0.0)
    return diff, diff - half, diff + half


def decide(low: Any, high: Any, margin: Any) -> np.ndarray:
    """The statistical verdict of intervals [low, high] against +-margin (NaN: inconclusive)."""
    low, high, margin = np.asarray(low, float), np.asarray(high, float), np.asarray(margin, float)
    inside = (low >= -margin) & (high <= margin)
    outside = (low > margin) | (high < -margin)
    return np.where(inside, REPRODUCED, np.where(outside, NOT_REPRODUCED, INCONCLUSIVE))


def seeds_needed(variances: tuple[float, ...], margin: float) -> int | None:
    """The fewest seeds a side with which a rerun that changed nothing is REPRODUCED with
    probability POWER at this spread: the smallest n with (t_.975 + t_.90) * sqrt(var / n) <=
    margin (the interval's half-width plus the mean's own 80% spread), var the variance of one
    seed's difference. One variance: paired differences (n - 1 degrees of freedom); two, each
    side's seed variance: Welch with n seeds a side. None: no n up to MAX_SEEDS (margin 0, NaN)."""
    var = float(sum(variances))
    if not margin > 0 or math.isnan(var):
        return None
    if var == 0:
        return 2  # no spread: the interval is the difference itself
    n = np.arange(2, MAX_SEEDS + 1)
    df = n - 1 if len(variances) == 1 else (n - 1) * var**2 / sum(v**2 for v in variances)
    width = (student_t.ppf(0.975, df) + student_t.ppf((1 + POWER) / 2, df)) * np.sqrt(var / n)
    fits = np.flatnonzero(width <= margin)
    return int(n[fits[0]]) if len(fits) else None


def seed_spread(committed: pd.DataFrame, metric: str) -> float:
    """The committed seeds' standard deviation, their variance pooled over every cell."""
    groups = completed(committed).groupby(CELL)[metric]
    df = int((groups.count() - 1).clip(lower=0).sum())
    if df < 1:
        return math.nan
    return math.sqrt(float(groups.var(ddof=1).fillna(0).mul(groups.count() - 1).sum() / df))


def default_margin(committed: pd.DataFrame, metric: str) -> float:
    """The module docstring's default margin: MARGIN_SDS committed seed standard deviations, the
    same for every cell and whatever its number of seeds (NaN: no committed cell has two)."""
    return MARGIN_SDS * seed_spread(committed, metric)


def _settings(run: pd.Series) -> dict[str, Any]:
    config = run["config"] if isinstance(run["config"], dict) else {}
    return {k: v for k, v in config.items() if k not in NOT_SETTINGS}


def check_not_itself(rerun_root: str | os.PathLike, committed_root: str | os.PathLike) -> None:
    """Refuses comparing a folder with itself (the same folder, or the same summary files): it
    would pass whatever the runs hold."""
    if Path(rerun_root).resolve() == Path(committed_root).resolve():
        raise RunFileError(f"{Path(rerun_root).resolve()}: the rerun and the committed runs are the same folder")
    ours, theirs = summary_files(rerun_root), summary_files(committed_root)
    names = [p.relative_to(rerun_root) for p in ours]
    if names == [p.relative_to(committed_root) for p in theirs] and all(
        filecmp.cmp(a, b, shallow=False) for a, b in zip(ours, theirs, strict=True)
    ):
        raise RunFileError(
            f"{rerun_root}: holds the same summary.json files as {committed_root}: a copy of the committed "
            "runs, not a rerun"
        )


def check_same_experiment(rerun: pd.DataFrame, committed: pd.DataFrame) -> None:
    """Refuses a cell whose runs, on either side, were trained with settings other than its first
    committed run's (those both sides' code records): its difference would measure the change of
    settings, not reproduction."""
    reference = {key: runs.iloc[0] for key, runs in committed.groupby(CELL)}
    if not any(key in reference for key in rerun.groupby(CELL).groups):
        raise RunFileError("the rerun and the committed runs have no cell (dataset, alpha, method) in common")
    for side, frame in (("the rerun's", rerun), ("the committed", committed)):
        for _, run in frame.iterrows():
            key = tuple(run[CELL])
            if key not in reference:
                continue
            ours, other = _settings(reference[key]), _settings(run)
            for name in sorted(set(ours) & set(other)):
                if ours[name] != other[name]:
                    raise RunFileError(
                        f"{_label(key)}: {side} seed {run['seed']} was trained with {name}={other[name]!r}, the "
                        f"committed seed {reference[key]['seed']} with {name}={ours[name]!r}: not the same experiment"
                    )


def _label(key: tuple) -> str:
    dataset, alpha, method = key
    return f"{dataset_label(dataset)} alpha={float(alpha)} {method}"


def _identical(a: pd.Series, b: pd.Series) -> bool:
    """The same run bit for bit: the same final weights, or diverged in the same round."""
    if a["status"] == b["status"] == "diverged":
        return a.get("diverged_round") == b.get("diverged_round")
    ha, hb = a.get("state_sha256"), b.get("state_sha256")
    return a["status"] == b["status"] == "completed" and isinstance(ha, str) and ha == hb


# why a cell's runs need not be bit-identical, in the order the verdict names it
UNKNOWN, GPU, OTHER = "hardware unknown (not recorded)", "GPU runs (not bit-deterministic)", "other hardware or threads"


def _kind(run: pd.Series) -> str:
    """What makes two CPU runs of a seed bit-identical: the hardware kind and the thread count
    (a GPU's cuDNN kernels are not deterministic; runs made before `hardware` do not say)."""
    hardware, config = run.get("hardware"), run["config"] if isinstance(run["config"], dict) else {}
    if not isinstance(hardware, str):
        return UNKNOWN
    device = run.get("device")
    return GPU if isinstance(device, str) and device != "cpu" else f"{hardware} | threads {config.get('threads')}"


def _deterministic(rerun: pd.DataFrame, committed: pd.DataFrame) -> str | None:
    """None when every run of both sides is a CPU run of one kind and thread count; else why not."""
    kinds = {_kind(run) for frame in (rerun, committed) for _, run in frame.iterrows()}
    for reason in (UNKNOWN, GPU):
        if reason in kinds:
            return reason
    return None if len(kinds) == 1 else OTHER


def _divergence_mismatch(rerun: pd.DataFrame, twins: pd.DataFrame) -> str | None:
    """The first seed that diverged on one side and not on the other (a rerun seed without a
    twin diverged where no committed run did)."""
    for _, run in rerun.iterrows():
        twin = twins.loc[run["seed"]] if run["seed"] in twins.index else None
        theirs = twin["status"] if twin is not None else "absent"
        if (run["status"] == "diverged") != (theirs == "diverged"):
            return f"seed {run['seed']} {run['status']} in the rerun, {theirs} in the committed runs"
    return None


def judge(rerun: pd.DataFrame, committed: pd.DataFrame, metric: str, margin: float) -> dict[str, Any]:
    """One cell's verdict and its evidence (the module docstring's rules)."""
    twins = committed.set_index("seed")
    same = sum(run["seed"] in twins.index and _identical(run, twins.loc[run["seed"]]) for _, run in rerun.iterrows())
    row: dict[str, Any] = {"identical": same}
    done_r, done_c = completed(rerun), completed(committed)
    if len(done_r) and len(done_c):
        row |= {"rerun": done_r[metric].mean(), "committed": done_c[metric].mean()}
    if same == len(rerun):
        return row | {"verdict": IDENTICAL, "why": f"{same} of {same} seeds bit-identical"}
    where = _deterministic(rerun, committed)
    if where is None:
        off = len(rerun) - same
        return row | {"verdict": NOT_REPRODUCED, "why": f"same hardware and threads, {off} seed(s) not identical"}
    mismatch = _divergence_mismatch(rerun, twins)
    if mismatch is not None:
        return row | {"verdict": NOT_REPRODUCED, "why": f"{where}; {mismatch}"}
    return row | _statistics(done_r, done_c, metric, margin, where)


def _interval(rerun: pd.DataFrame, committed: pd.DataFrame, metric: str) -> tuple[str, tuple, tuple, int]:
    """The test, (difference, low, high), the variances seeds_needed reads and the seeds a side."""
    twins, ours = committed.set_index("seed")[metric], rerun[metric].to_numpy(float)
    if len(rerun) >= 2 and set(rerun["seed"]) <= set(twins.index):
        d = ours - twins.loc[rerun["seed"]].to_numpy(float)
        return "paired", paired_interval(d), (float(np.var(d, ddof=1)),), len(d)
    theirs = committed[metric].to_numpy(float)
    spread = tuple(float(np.var(x, ddof=1)) if len(x) > 1 else math.nan for x in (ours, theirs))
    return "Welch", welch_interval(ours, theirs), spread, min(len(ours), len(theirs))


def _statistics(rerun: pd.DataFrame, committed: pd.DataFrame, metric: str, margin: float, where: str) -> dict[str, Any]:
    test, (diff, low, high), spread, seeds = _interval(rerun, committed, metric)
    verdict = str(decide(low, high, margin))
    row = {"difference": float(diff), "low": float(low), "high": float(high), "verdict": verdict}
    if math.isnan(low):
        return row | {"why": f"{where}; {test}: one seed, no interval"}
    if verdict != INCONCLUSIVE:
        return row | {"why": f"{where}; {test}"}
    needed = seeds_needed(spread, margin)
    return row | {"seeds_needed": needed, "why": f"{where}; {test}; {_reach(needed, seeds)}"}


def _reach(needed: int | None, seeds: int) -> str:
    """What an inconclusive cell would take, in words (seeds_needed)."""
    if needed is None:
        return f"no number of seeds up to {MAX_SEEDS:,} reaches a yes at this margin"
    if needed <= seeds:
        return "the interval fits the margin but the difference lies near it"
    return f"a yes reachable with {needed} seeds a side at this spread"


def compare(rerun: pd.DataFrame, committed: pd.DataFrame, metric: str, margin: float | None = None) -> pd.DataFrame:
    """One row per cell of either side: seeds of each side, identical seeds, means, difference,
    interval, margin, the seeds a side an inconclusive cell needs, verdict and why (NOT
    REPRODUCED for a cell missing on one side). `margin`: declared, in points (default:
    default_margin)."""
    margin = default_margin(committed, metric) if margin is None else margin
    keys = sorted(set(map(tuple, committed[CELL].to_numpy())) | set(map(tuple, rerun[CELL].to_numpy())))
    ours, theirs = dict(tuple(committed.groupby(CELL))), dict(tuple(rerun.groupby(CELL)))
    rows = []
    for key in keys:
        r, c = theirs.get(key, rerun.iloc[:0]), ours.get(key, committed.iloc[:0])
        row = dict(zip(CELL, key, strict=True)) | {"n_rerun": len(r), "n_committed": len(c), "margin": margin}
        if len(r) and len(c):
            row |= judge(r, c, metric, margin)
        else:
            row |= {"verdict": NOT_REPRODUCED, "why": f"not in the {'rerun' if not len(r) else 'committed runs'}"}
        rows.append(row)
    table = pd.DataFrame(rows)
    for column in ("identical", "rerun", "committed", "difference", "low", "high", "seeds_needed"):
        if column not in table:
            table[column] = math.nan
    return table


def read_runs(root: str | os.PathLike) -> pd.DataFrame:
    """Every run under `root` (summary.json files), its settings kept for the check."""
    runs = collect_summaries(root)
    if "config" not in runs:
        runs["config"] = None
    return runs


def _number(value: float, form: str) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, form)


def _cell_text(r: Any) -> str:
    label = _label((r.dataset, r.alpha, r.method))
    seeds = f"| {label} | {r.n_rerun} / {r.n_committed} | {_number(r.identical, '.0f')} |"
    means = f"{_number(r.rerun, '.2f')} | {_number(r.committed, '.2f')} | {_number(r.difference, '+.2f')}"
    interval = f"[{r.low:+.2f}, {r.high:+.2f}]" if not math.isnan(r.low) else ""
    verdict = r.verdict if r.verdict in PASSED else f"**{r.verdict}**"
    return f"{seeds} {means} | {interval} | {verdict} ({r.why}) |"


def _margin_text(margin: float, declared: bool) -> str:
    """The margin and where it comes from, as the report records it."""
    if declared:
        return f"+-{margin:.2f} points (declared: --margin)"
    if math.isnan(margin):
        return "none (no committed cell has two seeds to measure their spread; --margin POINTS sets one)"
    return f"+-{margin:.2f} points (the default: {MARGIN_SDS:g} seed standard deviation of the committed runs)"


def to_markdown(table: pd.DataFrame, metric: str, declared: bool = False) -> str:
    """The margin, the per-cell table and the overall verdict line; `declared`: the margin was
    given (--margin), not the default."""
    margin = float(table["margin"].iloc[0])
    lines = [
        f"**Reproduction** of {metric} (points): identical seeds (the same final weights); else rerun - "
        "committed and its 95% interval against the margin: inside, reproduced; outside, not; across, "
        "inconclusive.",
        "",
        f"Margin: {_margin_text(margin, declared)}.",
        "",
        "| cell | seeds rerun / committed | identical | rerun | committed | difference | 95% interval | verdict |",
        "| :--- | :---: | :---: | :---: | :---: | :---: | :---: | :--- |",
        *(_cell_text(r) for r in table.itertuples()),
        "",
        verdict(table),
    ]
    return "\n".join(lines) + "\n"


def overall(table: pd.DataFrame) -> str:
    """REPRODUCED when every cell is identical or reproduced; NOT REPRODUCED when some cell is
    not; else INCONCLUSIVE."""
    verdicts = set(table["verdict"])
    if NOT_REPRODUCED in verdicts:
        return NOT_REPRODUCED
    return INCONCLUSIVE if INCONCLUSIVE in verdicts else REPRODUCED


def exit_code(table: pd.DataFrame) -> int:
    return EXIT[overall(table)]


def verdict(table: pd.DataFrame) -> str:
    """One line: the overall verdict and the cells that make it."""
    result, counts = overall(table), table["verdict"].value_counts()
    order = (IDENTICAL, REPRODUCED, INCONCLUSIVE, NOT_REPRODUCED)
    tally = ", ".join(f"{counts[v]} {v.lower()}" for v in order if v in counts)
    line = f"Verdict: {result} ({len(table)} cells: {tally})"
    if result == REPRODUCED:
        return line + "."
    off = table.loc[table["verdict"] == result, CELL].itertuples(index=False)
    return f"{line}; {result.lower()}: {', '.join(_label(tuple(k)) for k in off)}."
