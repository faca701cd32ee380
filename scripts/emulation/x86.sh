#!/usr/bin/env bash
# `make run` on an emulated x86-64 CPU (QEMU's CPU model CPU). Westmere (no AVX2): portable
# numerics cannot hold, so numerics: auto must run every job natively after one line saying why,
# and `incofl compare` must give its statistical verdict. Skylake-Client-v4 (Intel, AVX2, another
# vendor and cache layout than an AMD host): every job portable, and the verdict IDENTICAL.
#
# Run on an x86-64 Linux machine with qemu-user-static (docs/testing.md, "On other CPUs and Pythons"):
#   scripts/emulation/x86.sh CPU VENV RUN_DIR [CELL]
# VENV: a venv with the project installed (`make .venv/bin/.installed` makes .venv); the
# checkout's src/ is put first on PYTHONPATH, so its code runs whatever VENV was installed from.
# A shadow of VENV in a temporary folder runs its Python under `qemu-x86_64-static -cpu CPU`,
# and its `snakemake` and `incofl` too: Snakemake, the numerics decision and every training job
# compute on the emulated CPU. RUN_DIR and CELL: make-run.sh beside this file (CELL: one cell's
# three runs, e.g. digits/a0.5/FedAvg; none: all of `make run`).
set -euo pipefail

usage="usage: $0 CPU VENV RUN_DIR [CELL]"
cpu=${1:?$usage}
venv=$(cd "${2:?$usage}" && pwd)
run_dir=${3:?$usage}
cell=${4:-}
checkout=$(cd "$(dirname "$0")/../.." && pwd)
command -v qemu-x86_64-static > /dev/null || apt-get install -y qemu-user-static

shadow=$(mktemp -d)
trap 'rm -rf "$shadow"' EXIT
mkdir "$shadow/bin"
cp "$venv/pyvenv.cfg" "$shadow/"
ln -s "$venv/lib" "$shadow/lib"
# argv[0] the shadow's python: sys.executable, and so the venv Python finds (pyvenv.cfg beside
# its bin/) and every Python process started from it (Snakemake's jobs, the numerics probe).
printf '#!/bin/sh\nexec qemu-x86_64-static -cpu %s -0 "$0" %s "$@"\n' "$cpu" "$(readlink -f "$venv/bin/python")" \
	> "$shadow/bin/python"
printf '#!/bin/sh\nexec "$(dirname "$0")/python" -m %s "$@"\n' snakemake > "$shadow/bin/snakemake"
printf '#!/bin/sh\nexec "$(dirname "$0")/python" -m %s "$@"\n' incofl.cli > "$shadow/bin/incofl"
chmod +x "$shadow/bin/"*
touch "$shadow/bin/.installed"

echo "$cpu: $("$shadow/bin/python" -c 'from numpy._core._multiarray_umath import __cpu_features__ as f
print("AVX2" if f["AVX2"] else "no AVX2", "(numpy asked the CPU)")')"
start=$(date +%s)
status=0
PYTHONPATH="$checkout/src${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1 \
	"$checkout/scripts/emulation/make-run.sh" "$shadow" "$run_dir" "$cell" || status=$?
echo "exit code $status after $(($(date +%s) - start)) s"
exit "$status"
