#!/usr/bin/env bash
# The GPU checks of the captured and stacked local steps (docs/performance.md, "On a GPU"), in
# one call on a machine with a CUDA GPU and the image's own PyTorch (it may not be the pinned
# one: the paths are timed against each other there, never against CPU numbers). From the
# repository root:
#
#   OUT=/tmp/gpu-check bash scripts/device/gpu-check.sh
#
# Wheels the image lacks (pydantic and what it needs) are installed from .whl/ when it exists,
# CIFAR-10 is read from $INCOFL_DATA_DIR (default .devdata/). Writes under $OUT: env.txt (GPU,
# CPU, torch), equality.txt (tests/test_graphs.py: the CPU equivalences and the recorded graphs
# against the eager trainers on the GPU), bench-resnet18.json and bench-resnet26.json
# (`incofl bench --device cuda`: every path), paper.txt (two rounds of config/paper-resnet.yaml
# per path: serial and batched, eager and captured; then, time left, 10 rounds of the captured
# batched path) and log.txt (everything, as it ran). `gpu-check.sh pack N` runs N paper-scale runs
# side by side instead (3 rounds each, captured serial trainer; pack.txt).
set -uo pipefail
OUT=${OUT:?set OUT to a folder for the results}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
step() { echo "[$(date +%T) +${SECONDS}s] $*"; }
DEADLINE=${DEADLINE:-450}  # seconds for the whole script: each step gets at most its cap and what is left
cap() { local left=$((DEADLINE - SECONDS)); echo $((left < $1 ? (left > 1 ? left : 1) : $1)); }
bench() {
    step "bench $1"
    timeout "$(cap 100)" python3 -m incofl.cli bench --device cuda --json --model "$1" --repeats 2 >"$OUT/bench-$1.json" &&
        python3 -c "import json, sys; from incofl.bench import format_report; print(format_report(json.load(open(sys.argv[1]))))" "$OUT/bench-$1.json"
}

if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
# incofl itself, without its pinned dependencies (the image's torch stays): the CLI reads its version
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1 INCOFL_DATA_DIR=${INCOFL_DATA_DIR:-$PWD/.devdata}

if [ "${1:-}" = pack ]; then  # `gpu-check.sh pack [N]`: N paper-scale runs side by side on the GPU, captured
    step "paper-resnet, ${2:-4} runs side by side, 3 rounds each: trainer serial, cuda_graphs true"
    runs=()
    python3 -c "from incofl.data.sources import load_dataset; load_dataset('cifar10', None, '/tmp/cache')"
    for seed in $(seq 0 $((${2:-4} - 1))); do
        timeout "$(cap 150)" python3 -m incofl.cli train --config config/paper-resnet.yaml --out "/tmp/pack-$seed" \
            --set dataset=cifar10 alpha=0.5 method=InCoAvg seed="$seed" rounds=3 eval_every=3 threads=2 \
            cuda_graphs=true progress=false cache_dir=/tmp/cache >/dev/null 2>"/tmp/pack-$seed.err" &
        runs+=($!)
    done
    wait "${runs[@]}"  # the runs only: a bare `wait` also waits for the log's tee, which never ends
    for seed in $(seq 0 $((${2:-4} - 1))); do
        { echo "== seed $seed"; grep -E "work:|trained in|done:" "/tmp/pack-$seed/train.log"; } | tee -a "$OUT/pack.txt"
    done
    step done
    exit
fi

step environment
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    lscpu | grep -E '^(Model name|CPU\(s\)|Flags)' | cut -c1-200
    python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.backends.cudnn.version())"
} | tee "$OUT/env.txt"

step "equality: tests/test_graphs.py"
timeout "$(cap 150)" python3 -m pytest -q -p no:cacheprovider -n 4 -rA tests/test_graphs.py >"$OUT/equality.txt" 2>&1
grep -E "relative errors|^(PASSED|FAILED|ERROR)|^E |passed|failed" "$OUT/equality.txt"

bench resnet18

for trainer in serial batched; do
    for graphs in false true; do
        step "paper-resnet, 3 rounds: trainer $trainer, cuda_graphs $graphs"
        run=/tmp/paper-$trainer-$graphs
        timeout "$(cap 90)" python3 -m incofl.cli train --config config/paper-resnet.yaml --out "$run" --set dataset=cifar10 \
            alpha=0.5 method=InCoAvg seed=0 rounds=3 eval_every=3 trainer=$trainer cuda_graphs=$graphs progress=false \
            cache_dir=/tmp/cache >/dev/null 2>"$run.err" || tail -3 "$run.err"
        { echo "== trainer $trainer, cuda_graphs $graphs"; grep -E "work:|trained in|done:" "$run/train.log"; } | tee -a "$OUT/paper.txt"
    done
done
bench resnet26
if [ "$SECONDS" -lt $((DEADLINE - 60)) ]; then  # time left: a longer stretch of the captured batched path, two evaluations
    step "paper-resnet, 10 rounds: trainer batched, cuda_graphs true"
    timeout "$(cap 100)" python3 -m incofl.cli train --config config/paper-resnet.yaml --out /tmp/paper-long --set dataset=cifar10 \
        alpha=0.5 method=InCoAvg seed=0 rounds=10 eval_every=5 trainer=batched cuda_graphs=true progress=false \
        cache_dir=/tmp/cache >/dev/null 2>/tmp/paper-long.err || tail -3 /tmp/paper-long.err
    { echo "== 10 rounds, trainer batched, cuda_graphs true"; grep -E "work:|trained in|round .*: mean acc|done:" /tmp/paper-long/train.log; } | tee -a "$OUT/paper.txt"
fi
step done
