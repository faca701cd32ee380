"""Collect finished runs (`<root>/<dataset>/a<alpha>/<method>/s<seed>/summary.json`) into frames.

Directories are only used to find runs; every value comes from the run's summary.json. Its
`method` is the name the run is shown under: a variant's name (the run's `label`), else the method.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pandas as pd

KEYS = ["method", "dataset", "alpha", "seed"]
# Paper spelling of the dataset names used in table headers and figure titles.
DATASET_LABELS = {
    "fmnist": "FMNIST",
    "svhn": "SVHN",
    "cifar10": "CIFAR10",
    "cinic10": "CINIC10",
    "cifar100": "CIFAR100",
}


def dataset_label(name: str) -> str:
    return DATASET_LABELS.get(name.lower(), name)


def alpha_tag(alpha: float) -> str:
    """`0.5` -> `a0.5`, `1` -> `a1.0` (the run-directory spelling)."""
    return f"a{float(alpha)}"


def summary_files(runs_root: str | os.PathLike) -> list[Path]:
    files = sorted(Path(runs_root).rglob("summary.json"))
    if not files:
        raise FileNotFoundError(f"no runs (summary.json) found under {Path(runs_root).resolve()}")
    return files


class RunFileError(ValueError):
    """A run's file that cannot be read (truncated, not JSON or CSV, a key missing): names the file."""


def read_summary(path: str | os.PathLike) -> dict[str, Any]:
    """A run's summary.json; `status` is completed or diverged (runs from before it: completed).
    Every report reads summaries here, so a damaged one is one line naming it."""
    path = Path(path)
    try:
        s = json.loads(path.read_text())
        return {"status": "completed"} | s | {"alpha": float(s["alpha"]), "seed": int(s["seed"])}
    except (json.JSONDecodeError, UnicodeDecodeError) as err:  # a run killed while writing it, a damaged disk
        raise RunFileError(f"{path}: not valid JSON ({err.__class__.__name__}): rerun that run or remove it") from None
    except (KeyError, TypeError, ValueError) as err:
        raise RunFileError(f"{path}: not a run summary (bad or missing {err})") from None


def read_csv(path: str | os.PathLike, **kwargs: Any) -> pd.DataFrame:
    """A run's CSV (metrics.csv, the observers' files); a damaged one is one line naming it."""
    try:
        return pd.read_csv(path, **kwargs)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as err:
        raise RunFileError(f"{path}: not a readable CSV ({str(err).splitlines()[0]})") from None


def completed(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs that finished training (a diverged run has no accuracy to average)."""
    return runs[runs["status"] == "completed"]


def collect_summaries(runs_root: str | os.PathLike) -> pd.DataFrame:
    """One row per run: method, dataset, alpha, seed, then every other summary field."""
    df = pd.DataFrame([read_summary(p) for p in summary_files(runs_root)])
    dup = df[df.duplicated(KEYS, keep=False)]
    if not dup.empty:
        raise RunFileError(
            f"runs under {runs_root} repeat (method, dataset, alpha, seed): "
            f"{dup[KEYS].drop_duplicates().to_dict('records')}"
        )
    return df[KEYS + [c for c in df.columns if c not in KEYS]]


def collect_curves(runs_root: str | os.PathLike) -> pd.DataFrame:
    """Long form, one row per (run, evaluated round): method, dataset, alpha, seed, status,
    round, mean_acc, mean_loss (a diverged run's rows stop before it diverged)."""
    return read_curves(summary_files(runs_root))


def read_curves(summaries: list[Path]) -> pd.DataFrame:
    """collect_curves of the runs whose summary.json files are given."""
    frames = []
    columns = KEYS + ["status", "round", "mean_acc", "mean_loss"]
    for path in map(Path, summaries):
        s = read_summary(path)
        metrics = path.with_name("metrics.csv")
        m = read_csv(metrics, usecols=columns[-3:]) if metrics.exists() else pd.DataFrame(columns=columns[-3:])
        frames.append(m.assign(**{k: s[k] for k in KEYS + ["status"]}))
    return pd.concat(frames, ignore_index=True)[columns]
