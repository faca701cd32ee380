"""Golden runs: six methods' final weights and metrics pinned bit for bit.

An equivalence test whose two sides both move with a refactor cannot catch a change in what
the engine computes; these constants can. They hold on this project's CPU with one thread
and the pinned torch (floating-point results differ across CPU types and thread counts). If
a change is *meant* to alter training, say so in the commit and regenerate them with
`python tests/test_golden.py`.
"""

from __future__ import annotations

import hashlib

import pandas as pd
import pytest

from incofl.config import RunConfig
from incofl.data.sources import load_dataset
from incofl.fl.simulation import train

SETTINGS = {
    "dataset": "synthetic",
    "clients": 6,
    "ratio": 0.5,
    "models": ["resnet10", "resnet14"],
    "rounds": 3,
    "batch_size": 32,
    "min_size": 20,
    "eval_every": 1,
    "threads": 1,
    "device": "cpu",
    "progress": False,
}
METRIC_COLUMNS = ["round", "mean_acc", "mean_loss", "acc_g0", "acc_g1"]  # not `seconds` (timing)
# method: (summary["state_sha256"], SHA-256 of metrics.csv's METRIC_COLUMNS)
GOLDEN = {
    "FedAvg": (
        "2b14d9331f110360a8d7276711be386045985cf32934301e34ee46416d6e2767",
        "5ad0e83eb456adf385a154f177e8055cd03221da10499c864122a1d7142516f9",
    ),
    "InCoAvg": (
        "c979cadc3c096a4ff89050bba3b30a52095ea0048d58fad767e7d2ad7bdaba9d",
        "e93453aee274a2d66c0d66dd4198c17b32e15a03ac150be22c50715a8d369e8c",
    ),
    "SCAFFOLD": (
        "06b5f1658cddca1ee7a81d827238ef60b8da730bcb132c99fdf1a933a90a1b89",
        "3a550176f104a1b6af404e81116a17916c8e8c1044ef2af9ad20dcb9b6396fae",
    ),
    "MOON": (
        "d480b1ab4c37819e06006f14989aafdbd8a1607e7e4343f163ccd1abe219666a",
        "5b7676295326b9db51cc997be568652f636440d360133b5fb00427d676fd47fc",
    ),
    "FedNova": (
        "659301fe41722077c0d5191f535724facbeb5480c224f6f68742bd471ec3290d",
        "a6f7368c365acac2f5d6544278ffa05523130f02c480e805b2262a790ea9da9d",
    ),
    "InCoProx": (
        "914ef6eabf812193a015384c3b72d305badcc9d56720966070605b8587bb6fa7",
        "12ad9f31c99a6ac961b31c221cfb727c785f1d7e14538395e2484ab52291d981",
    ),
}


def golden_run(method: str, out, cache) -> tuple[str, str]:
    cfg = RunConfig(method=method, cache_dir=str(cache), **SETTINGS)
    summary = train(cfg, out, data=load_dataset("synthetic", cache_dir=cache))
    metrics = pd.read_csv(out / "metrics.csv")[METRIC_COLUMNS].to_csv(index=False)
    return summary["state_sha256"], hashlib.sha256(metrics.encode()).hexdigest()


@pytest.mark.parametrize("method", list(GOLDEN))
def test_golden_run_is_bit_identical(method, tmp_path):
    assert golden_run(method, tmp_path / "run", tmp_path / "cache") == GOLDEN[method]


def test_golden_covers_the_pinned_methods():
    assert set(GOLDEN) == {"FedAvg", "InCoAvg", "SCAFFOLD", "MOON", "FedNova", "InCoProx"}


if __name__ == "__main__":  # print fresh constants (only when training is meant to change)
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        for name in ("FedAvg", "InCoAvg", "SCAFFOLD", "MOON", "FedNova", "InCoProx"):
            print(f"    {name!r}: {golden_run(name, Path(tmp) / name, Path(tmp) / 'cache')!r},")
