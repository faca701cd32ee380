#!/usr/bin/env bash
# What the emulation scripts run in the emulated machine: `make run` (no CELL), or, sized for
# emulation, the jobs `make run` runs for one cell of the default experiment (CELL, e.g.
# digits/a0.5/FedAvg: its three seeds) and `incofl compare` of them against that committed cell,
# whose exit code 3 (inconclusive) passes as in `make run`.
#   scripts/emulation/make-run.sh VENV RUN_DIR [CELL]
set -euo pipefail

venv=$1 run_dir=$2 cell=${3:-}
cd "$(dirname "$0")/../.."
if [ -z "$cell" ]; then
	exec make run VENV="$venv" RUN_DIR="$run_dir" -o "$venv/bin/.installed"
fi
runs=()
for seed in 0 1 2; do runs+=("results/runs/$cell/s$seed/summary.json"); done
"$venv/bin/snakemake" --cores "${CORES:-2}" --directory "$run_dir" "${runs[@]}" \
	--config experiment="$PWD/config/config.yaml"
"$venv/bin/incofl" compare "$run_dir/results/runs" "results/runs/$cell" || [ $? -eq 3 ]
