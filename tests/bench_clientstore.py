"""Peak memory and seconds per round of SCAFFOLD with every client's state, as docs/performance.md reports.

    python tests/bench_clientstore.py --clients 1000 --out /tmp/scaffold-1000 [--stop-gb 20] [--set KEY=VALUE ...]

runs `incofl train` on real CIFAR-10 (the paper's five ResNets at full width, every client sampled,
`client_samples` images each, eval only after the last round) in a child process on one thread, samples
the resident memory of the child (and its children) and the disk use of its run folder twice a second,
stops it once the resident memory passes --stop-gb, and prints one JSON line: peak RSS, peak disk, the
seconds of each trained round (train.log), and whether the run finished. The script is no test
(pytest collects test_*.py only): it takes minutes to hours.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

SETTINGS = {
    "dataset": "cifar10",
    "method": "SCAFFOLD",
    "models": "[resnet10,resnet14,resnet18,resnet22,resnet26]",
    "model_scale": "1",
    "ratio": "1.0",
    "partition": "iid_draw",
    "client_samples": "4",
    "batch_size": "4",
    "rounds": "2",
    "eval_every": "1000",
    "eval_last": "0",
    "checkpoint_every": "1",
    "threads": "1",
    "progress": "false",
}


def tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and its descendants (from /proc)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def disk_bytes(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True, help="the run folder (must not hold a run)")
    parser.add_argument("--stop-gb", type=float, default=20.0, help="stop the run past this resident memory")
    parser.add_argument("--set", nargs="*", default=[], help="more KEY=VALUE settings for incofl train")
    args = parser.parse_args()
    settings = [f"{k}={v}" for k, v in SETTINGS.items()] + [f"clients={args.clients}", *args.set]
    cmd = [sys.executable, "-m", "incofl.cli", "train", "--out", str(args.out), "--set", *settings]
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    start, peak, peak_disk, stopped, trace = time.time(), 0, 0, False, []
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    while child.poll() is None:
        rss = tree_rss(child.pid)
        peak = max(peak, rss)
        if not trace or time.time() - start >= trace[-1][0] + 10:  # the memory's growth, every 10 s
            trace.append((round(time.time() - start, 1), round(rss / 2**30, 3)))
        peak_disk = max(peak_disk, disk_bytes(args.out) if args.out.exists() else 0)
        if peak > args.stop_gb * 2**30:
            child.kill()
            stopped = True
            break
        time.sleep(0.5)
    child.wait()
    log = (args.out / "train.log").read_text() if (args.out / "train.log").exists() else ""
    rounds = [float(s) for s in re.findall(r"round \d+/\d+ trained in ([\d.]+) s", log)]
    print(
        json.dumps(
            {
                "clients": args.clients,
                "settings": settings,
                "returncode": child.returncode,
                "stopped_at_gb": stopped,
                "peak_rss_gb": round(peak / 2**30, 2),
                "peak_disk_gb": round(peak_disk / 2**30, 2),
                "round_seconds": rounds,
                "wall_s": round(time.time() - start, 1),
                "finished": (args.out / "summary.json").exists(),
                "rss_gb_every_10s": trace,
            }
        )
    )


if __name__ == "__main__":
    main()
