"""Seed-mean test accuracy per round of every run in the grid, long form (dataset, alpha,
method, round, accuracy, std, seeds), for `dvc plots` (template workflow/dvc/curves.json).
Diverged runs are left out (the tables and figures count them)."""

import json
import sys
from pathlib import Path

import pandas as pd

from incofl.atomic import atomic_path


def curves(summaries: list[str]) -> pd.DataFrame:
    frames = []
    for path in map(Path, summaries):
        s = json.loads(path.read_text())
        if s.get("status", "completed") != "completed":  # a diverged run is not averaged in
            continue
        m = pd.read_csv(path.with_name("metrics.csv"), usecols=["round", "mean_acc"])
        frames.append(m.assign(dataset=s["dataset"], alpha=float(s["alpha"]), method=s["method"]))
    keys = ["dataset", "alpha", "method", "round"]
    if not frames:
        return pd.DataFrame(columns=[*keys, "accuracy", "std", "seeds"])
    runs = pd.concat(frames, ignore_index=True)
    out = runs.groupby(keys, sort=False)["mean_acc"].agg(accuracy="mean", std="std", seeds="count")
    return out.reset_index().round({"accuracy": 3, "std": 3}).fillna({"std": 0.0})


if __name__ == "__main__":
    # the job's log (rule plot_data): warnings and a traceback go there too
    sys.stderr = log = open(snakemake.log[0], "w")  # noqa: F821 (set by Snakemake's script:)
    inputs, output = snakemake.input, snakemake.output[0]  # noqa: F821
    table = curves(inputs)
    with atomic_path(output) as tmp:
        table.to_csv(tmp, index=False)
    print(f"{output}: {len(table)} rows from {len(inputs)} runs", file=log)
