"""Golden runs: six methods' final weights and metrics pinned, bit for bit, per machine.

An equivalence test whose two sides both move with a refactor cannot catch a change in what
the engine computes; these constants can. Floating-point results differ across CPU types
(oneDNN and MKL pick kernels by instruction set), and Adam turns those last-bit differences
into visibly different runs: the same code gave round-3 losses 9% apart on an AVX-512 Xeon
and an AVX2 EPYC. So the constants are pinned per machine fingerprint (CPU model, ATen's CPU
capability, torch version): the SHA-256 of the final weights and of the metrics, with every
round's loss and per-group accuracy for a readable failure. The machines CI runs on are
pinned; elsewhere the test is skipped, naming the fingerprint, and fails under CI (CI=true): no
tolerance holds across CPUs, and a CI run must never pass without them.
If a change is *meant* to alter training, say so in the commit and regenerate the constants
on each pinned machine with `python tests/test_golden.py` (it prints them, with the machine's
fingerprint).
"""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import unavailable

from incofl.config import RunConfig
from incofl.data.sources import load_dataset
from incofl.fl.engine.hardware import hardware_kind
from incofl.fl.engine.run import train

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
# fingerprint -> method -> state_sha256, SHA-256 of metrics.csv's METRIC_COLUMNS, mean_loss per
# round, (acc_g0, acc_g1) per round
GOLDEN = {
    "Intel(R) Xeon(R) Processor | AVX512 | 2.14.1+cu130": {
        "FedAvg": {
            "state": "b49f2e8fbda22e434cb17ea1e31199ae9690aab0d289aca8853cbcd929ed1fe8",
            "metrics": "d2feee2293d3122824de7b5c0a2a7e7d2f876d65872455815a50ae3d0fbfc4b2",
            "loss": [1.1244858, 0.652279, 0.6783673],
            "acc": [[70.0, 61.6], [79.8, 79.4], [80.0, 66.6]],
        },
        "InCoAvg": {
            "state": "bfd03488ab7b49cbb03927ce25fedb55a31b83a837eb604f0c22c6a5bec4394a",
            "metrics": "5612f2803fdc41fac2746254d8901333ddaae14edde5f3e7ba2bd6b3f3263a58",
            "loss": [1.4655037, 0.4296469, 0.0964111],
            "acc": [[71.8, 80.8], [98.4, 97.0], [100.0, 94.2]],
        },
        "SCAFFOLD": {
            "state": "a1c2c8b93886ee492699bf0e30149a9c0357356ee448d480cb2355ec686eb745",
            "metrics": "6e9c11c64289d7d64866e39feb7bf1f52d97c3221cafd05e1b3c054fd6ab7996",
            "loss": [1.1244858, 0.559417, 1.8439172],
            "acc": [[70.0, 61.6], [84.8, 75.6], [100.0, 48.0]],
        },
        "MOON": {
            "state": "c9e7ff69cf4d2870cbbb1c08c949556452f78fe0111dcc5566be360af9897aeb",
            "metrics": "d56557fe012b0bf2df28c0289186fbce9cdcd4dc6dbcfe78de1c6d8d650f0671",
            "loss": [1.5659819, 2.6893059, 0.954737],
            "acc": [[40.0, 57.2], [50.0, 40.8], [70.0, 70.0]],
        },
        "FedNova": {
            "state": "ba2b28b7996b89e1a285638b540ce280952fce7b82b5d4816ad73b68e259177f",
            "metrics": "e6a5532f5e9cfa4031169603e6aae3711ef43d6a5bb137c94b09809fd627155c",
            "loss": [1.0858762, 0.6138804, 0.5296616],
            "acc": [[70.0, 61.2], [79.8, 84.2], [80.6, 76.0]],
        },
        "InCoProx": {
            "state": "5eebad71a01fa4e910416caaa26251cf2d4021c6db6d7d265e321042692722f6",
            "metrics": "67d8eaf4e7e52db7330acf17b63513479dc6cb8040c4b8792dea1ad4f1a63b0a",
            "loss": [1.5584973, 0.4997718, 0.082747],
            "acc": [[71.8, 80.6], [98.4, 97.4], [100.0, 100.0]],
        },
    },
    "AMD EPYC | AVX2 | 2.14.1+cu130": {
        "FedAvg": {
            "state": "2b14d9331f110360a8d7276711be386045985cf32934301e34ee46416d6e2767",
            "metrics": "5ad0e83eb456adf385a154f177e8055cd03221da10499c864122a1d7142516f9",
            "loss": [1.128031, 0.6645563, 0.6193634],
            "acc": [[70.0, 62.0], [80.0, 77.8], [79.0, 71.8]],
        },
        "InCoAvg": {
            "state": "c979cadc3c096a4ff89050bba3b30a52095ea0048d58fad767e7d2ad7bdaba9d",
            "metrics": "e93453aee274a2d66c0d66dd4198c17b32e15a03ac150be22c50715a8d369e8c",
            "loss": [1.4690342, 0.413356, 0.1487357],
            "acc": [[71.4, 80.6], [99.4, 98.2], [100.0, 90.0]],
        },
        "SCAFFOLD": {
            "state": "06b5f1658cddca1ee7a81d827238ef60b8da730bcb132c99fdf1a933a90a1b89",
            "metrics": "3a550176f104a1b6af404e81116a17916c8e8c1044ef2af9ad20dcb9b6396fae",
            "loss": [1.128031, 0.5474043, 1.9745637],
            "acc": [[70.0, 62.0], [81.6, 81.6], [100.0, 43.8]],
        },
        "MOON": {
            "state": "d480b1ab4c37819e06006f14989aafdbd8a1607e7e4343f163ccd1abe219666a",
            "metrics": "5b7676295326b9db51cc997be568652f636440d360133b5fb00427d676fd47fc",
            "loss": [1.5678461, 2.6574124, 0.93099],
            "acc": [[40.0, 56.6], [50.0, 40.4], [70.0, 69.6]],
        },
        "FedNova": {
            "state": "659301fe41722077c0d5191f535724facbeb5480c224f6f68742bd471ec3290d",
            "metrics": "a6f7368c365acac2f5d6544278ffa05523130f02c480e805b2262a790ea9da9d",
            "loss": [1.0895654, 0.6232794, 0.5624481],
            "acc": [[70.0, 61.2], [80.0, 79.8], [79.6, 77.6]],
        },
        "InCoProx": {
            "state": "914ef6eabf812193a015384c3b72d305badcc9d56720966070605b8587bb6fa7",
            "metrics": "12ad9f31c99a6ac961b31c221cfb727c785f1d7e14538395e2484ab52291d981",
            "loss": [1.5622708, 0.5472257, 0.079],
            "acc": [[72.2, 80.2], [97.2, 95.0], [100.0, 99.8]],
        },
    },
    "AMD EPYC | AVX512 | 2.14.1+cu130": {
        "FedAvg": {
            "state": "579686fd2b950446a58fcb65260edde55752b4d6b65e680119e633d7708badfd",
            "metrics": "bb00d7295c9a1a7bca3a770145477579d9c25b6c4679f1477fb4c7ddca398579",
            "loss": [1.1228817, 0.6446758, 0.4479756],
            "acc": [[70.0, 61.8], [79.8, 84.6], [80.8, 81.4]],
        },
        "InCoAvg": {
            "state": "3f78d840ddde56feaacda547446f154af84808c8641f07db3a5442052d08079e",
            "metrics": "b2a22a48e5fe8348474a31cd513e375763444c95847481ec13b4bba17c12ac99",
            "loss": [1.4636213, 0.4128563, 0.0503124],
            "acc": [[71.6, 80.8], [99.0, 96.6], [100.0, 100.0]],
        },
        "SCAFFOLD": {
            "state": "cefed0e16d77732759913db7ed9e354ff67d612e077003dedea145c6cc1336e1",
            "metrics": "dc05a42abeee1f4cfd1d9475c37746012c8ffe1c6203e1e106f64e7f296446f0",
            "loss": [1.1228817, 0.555065, 3.3209702],
            "acc": [[70.0, 61.8], [84.6, 82.0], [100.0, 31.2]],
        },
        "MOON": {
            "state": "8994b0236a7de1dcca9809ba68832cfb09dee6f9fa27a9c5738ed0bb79b57901",
            "metrics": "b88379e07182ae6ac65f0d9d365d83580ea88fbbc17380d87a17cb8ce64dc73c",
            "loss": [1.5708937, 2.6147363, 0.9158964],
            "acc": [[40.0, 56.8], [50.0, 41.6], [72.6, 68.4]],
        },
        "FedNova": {
            "state": "a0a40fd0f3a4a5db5b549ab39ae2d2169e73c4ef4e8be952ec76757d3eea21b5",
            "metrics": "1ae19660c63873c5ebe0fbd050a574e3e3828271f3c383f2266c6611ab1ec379",
            "loss": [1.0841214, 0.5928314, 1.2976268],
            "acc": [[70.0, 61.4], [79.8, 84.4], [80.0, 69.6]],
        },
        "InCoProx": {
            "state": "ab5ffaf1f2d6855524765df391f0eae2ad6d474b59f70997f33473795aac1009",
            "metrics": "9a4e9ebdee271cbc6c8c65eda1a8bf7949ec33c21ebcb6db980b4e6dba733742",
            "loss": [1.5608301, 0.5135421, 0.076828],
            "acc": [[71.4, 80.6], [98.8, 97.0], [100.0, 100.0]],
        },
    },
}


def machine() -> str:
    """What decides the floating-point results of a CPU run besides the code (summary.json's
    `hardware` of a CPU run)."""
    return hardware_kind(torch.device("cpu"))


def golden_run(method: str, out, cache) -> dict:
    cfg = RunConfig(method=method, cache_dir=str(cache), **SETTINGS)
    summary = train(cfg, out, data=load_dataset("synthetic", cache_dir=cache))
    metrics = pd.read_csv(out / "metrics.csv")[METRIC_COLUMNS]
    return {
        "state": summary["state_sha256"],
        "metrics": hashlib.sha256(metrics.to_csv(index=False).encode()).hexdigest(),
        "loss": [round(v, 7) for v in metrics["mean_loss"]],
        "acc": [[float(a), float(b)] for a, b in zip(metrics["acc_g0"], metrics["acc_g1"], strict=True)],
    }


METHODS = ["FedAvg", "InCoAvg", "SCAFFOLD", "MOON", "FedNova", "InCoProx"]


@pytest.mark.slow
@pytest.mark.pin
@pytest.mark.parametrize("method", METHODS)
def test_golden_run(method, tmp_path):
    pins = GOLDEN.get(machine())
    if pins is None:
        unavailable(f"no golden constants for this machine ({machine()}): print them with python tests/test_golden.py")
    got = golden_run(method, tmp_path / "run", tmp_path / "cache")
    assert got == pins[method]


def test_every_pin_has_what_a_run_gives():
    """Each machine pins every method, each pin in golden_run's shape for SETTINGS' run: two
    SHA-256s, a loss per round and an accuracy per model group and round (a pin of another shape
    could never match, and would fail only on its own machine)."""
    rounds, groups = SETTINGS["rounds"], len(SETTINGS["models"])
    for fingerprint, pins in GOLDEN.items():
        assert list(pins) == METHODS, fingerprint
        for method, pin in pins.items():
            assert set(pin) == {"state", "metrics", "loss", "acc"}, (fingerprint, method)
            assert all(re.fullmatch(r"[0-9a-f]{64}", pin[key]) for key in ("state", "metrics"))
            assert len(pin["loss"]) == rounds and all(0 < loss < 10 for loss in pin["loss"])
            assert len(pin["acc"]) == rounds and all(len(acc) == groups for acc in pin["acc"])
            assert all(0 <= a <= 100 for acc in pin["acc"] for a in acc)


def test_an_unpinned_cpu_fails_under_ci(tmp_path, monkeypatch):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr(sys.modules[__name__], "machine", lambda: "Another CPU | AVX2 | 2.14.1+cu130")
    with pytest.raises(pytest.fail.Exception, match="no golden constants for this machine"):
        test_golden_run("FedAvg", tmp_path)


if __name__ == "__main__":  # print fresh constants (only when training is meant to change)
    import tempfile

    print(f"{machine()!r}: {{")
    with tempfile.TemporaryDirectory() as tmp:
        for name in METHODS:
            print(f"    {name!r}: {golden_run(name, Path(tmp) / name, Path(tmp) / 'cache')!r},")
    print("},")
