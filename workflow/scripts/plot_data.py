"""Seed-mean test accuracy per round of every run in the grid, long form (runs, dataset, alpha,
method, round, accuracy, std, seeds), for `dvc plots` (template workflow/dvc/curves.json).
Diverged runs are left out (the tables and figures count them)."""

import sys

from incofl.atomic import atomic_path
from incofl.report.dvc import seed_mean_curves
from incofl.report.runs import read_curves

if __name__ == "__main__":
    # the job's log (rule plot_data): warnings and a traceback go there too
    sys.stderr = log = open(snakemake.log[0], "w")  # noqa: F821 (set by Snakemake's script:)
    inputs, output = snakemake.input, snakemake.output[0]  # noqa: F821
    table = seed_mean_curves(read_curves(list(inputs)), "runs")
    with atomic_path(output) as tmp:
        table.to_csv(tmp, index=False)
    print(f"{output}: {len(table)} rows from {len(inputs)} runs", file=log)
