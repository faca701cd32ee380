"""Seconds a round of many small clients against the same images as 10 clients, as docs/performance.md reports.

    PYTHONPATH=src python tests/bench_rounds.py FedAvg 1000 2

builds two engines on the synthetic set (one thread, `cnn20`, `partition: iid_draw`, batch 10, one
epoch): 10 x N clients of 10 images with N sampled a round, and 10 clients of N images all sampled
(the same number of images and steps a round), alternates their rounds REPEATS times and prints one
JSON line: each round's seconds and the ratio of the fastest of each. Alternating in one process
keeps a shared machine's load out of the ratio. The script is no test (pytest collects test_*.py
only): it takes minutes.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from helpers import engine_on

from incofl.data.sources import load_dataset
from incofl.fl.contracts import Round


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("method")
    parser.add_argument("per_round", type=int, help="clients a round of the many-client engine (N)")
    parser.add_argument("repeats", type=int)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = load_dataset("synthetic", cache_dir=None)
    common = {
        "method": args.method,
        "models": ["cnn20"],
        "partition": "iid_draw",
        "batch_size": 10,
        "rounds": args.repeats,
    }
    engines = {
        "many": engine_on(data, clients=10 * args.per_round, ratio=0.1, client_samples=10, **common),
        "few": engine_on(data, clients=10, ratio=1.0, client_samples=args.per_round, **common),
    }
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    for t in Round.upto(args.repeats):
        for name, engine in engines.items():
            start = time.perf_counter()
            assert engine.run_round(t).samples == 10 * args.per_round
            seconds[name].append(round(time.perf_counter() - start, 2))
    ratio = round(min(seconds["many"]) / min(seconds["few"]), 3)
    print(json.dumps({"method": args.method, "clients_a_round": args.per_round, "seconds": seconds, "ratio": ratio}))


if __name__ == "__main__":
    main()
