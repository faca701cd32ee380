"""What portable numerics cost: one run of the default experiment trained under `native` and
`portable` numerics, alternated in fresh processes (each pins its kernels before torch is
imported), and the ratio of their median CPU seconds (user + system of the training process:
robust to other work on the machine, which wall time is not). docs/performance.md reports it.

    python tests/bench_numerics.py                      # 3 pairs, the default config's InCoAvg run
    python tests/bench_numerics.py --pairs 5 --set model_scale=0.5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN = ["alpha=0.5", "method=InCoAvg", "seed=0", "progress=false"]


def timed_run(numerics: str, sets: list[str], out: Path) -> dict[str, float]:
    """One `incofl train` in a fresh process: its wall and CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "incofl.cli", "train", "--config", str(REPO / "config/config.yaml"), "--out", str(out)]
        + ["--set", *RUN, f"numerics={numerics}", *sets],
        check=True,
        capture_output=True,
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "4294967296"},
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    summary = json.loads((out / "summary.json").read_text())
    return {"wall_s": time.perf_counter() - start, "cpu_s": cpu, "final_acc": summary["final_acc"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--set", nargs="*", default=[], help="more settings, e.g. model_scale=0.5")
    args = parser.parse_args()
    times: dict[str, list[dict[str, float]]] = {"native": [], "portable": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            for numerics in ("native", "portable") if i % 2 == 0 else ("portable", "native"):
                times[numerics].append(timed_run(numerics, args.set, Path(tmp) / f"{numerics}{i}"))
                print(numerics, times[numerics][-1], flush=True)
    median = {k: statistics.median(t["cpu_s"] for t in v) for k, v in times.items()}
    print(
        f"median CPU s: native {median['native']:.1f}, portable {median['portable']:.1f}; "
        f"portable / native = {median['portable'] / median['native']:.2f} ({args.pairs} pairs, settings {args.set})"
    )


if __name__ == "__main__":
    main()
