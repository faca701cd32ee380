"""Golden runs: six methods' final weights and metrics pinned, bit for bit, once for every CPU.

An equivalence test whose two sides both move with a refactor cannot catch a change in what
the engine computes; these constants can. The runs compute under portable numerics
(incofl.numerics: ATen's AVX2 kernels, MKL's compatible branch, im2col convolutions), which give
the same bits on every x86-64 CPU with AVX2, so one set of constants holds on each machine the
suite meets: the SHA-256 of the final weights and of the metrics, with every round's loss and
per-group accuracy for a readable failure. They run in a subprocess (tests/golden_runs.py) that
pins the kernels before torch is imported, as `incofl train` does. When a run differs, the test
names the first operation of a training step whose bits split (conv forward and backward, batch
norm, matmul, cross-entropy, the SGD and Adam steps, each pinned on fixed inputs): a pin that
does not hold on this CPU, or, when every operation agrees, a change in what the engine computes.
Nothing skips: a CPU without AVX2 or an environment that overrides a pin fails in one line.
If a change is *meant* to alter training, say so in the commit and regenerate the constants with
`python tests/test_golden.py` (it prints them).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from incofl.numerics import environment

SCRIPT = Path(__file__).with_name("golden_runs.py")
TORCH = "2.14.1+cu130"  # pyproject's pin; another build has other kernels
# SHA-256 prefixes of each operation of a training step on fixed inputs, in the order a step runs them
OPS = {
    "conv forward": "208c72abe590e5f8",
    "conv backward": "88ef99b481f3d1fb",
    "batch norm forward": "c06b8f41392bfd54",
    "batch norm backward": "b05f259bc4cb6ea9",
    "matmul (linear forward, backward)": "bc9b3fdc010fa324",
    "cross-entropy forward, backward": "67acee592290ae0b",
    "SGD step": "86778134baaaf0ac",
    "Adam step": "35fa0314df16e6a8",
}
# method -> state_sha256, SHA-256 of metrics.csv's columns, mean_loss per round, (acc_g0, acc_g1) per round
GOLDEN = {
    "FedAvg": {
        "state": "5569226188812bc8454f67bed2a66eb79b11447d94b9ca7bd2fcde05f0460117",
        "metrics": "6dfbfea22f5f0bc7b512cdbcbd2d23d6c0832e8ba3ac18ed2c13b3fce4adb98f",
        "loss": [1.6640505, 0.736411, 0.4208886],
        "acc": [[55.6, 54.6], [82.2, 78.6], [99.4, 80.0]],
    },
    "InCoAvg": {
        "state": "869507b26e3c3c50ee7b81df6b6a40226bf993a4fbb404063355d1a6e607ce0b",
        "metrics": "95aa024a452bec33988f10a66427e8427b69a67a86c80f87ae7888102927b09f",
        "loss": [1.8924318, 0.9223254, 0.3114025],
        "acc": [[51.0, 75.4], [93.2, 90.0], [98.8, 95.6]],
    },
    "SCAFFOLD": {
        "state": "7ddab18e73f0d6c05e745780b849adbfd0abe068458458e0195cc63860e27b75",
        "metrics": "e8aa8a6da70815f684e53733779cc9f00fc6e970960edbff79a59f4a549b6173",
        "loss": [1.6640505, 0.7272532, 0.3761755],
        "acc": [[55.6, 54.6], [81.4, 74.6], [99.2, 80.0]],
    },
    "MOON": {
        "state": "0f4d49d8270e9e04ee3cd430b010a7412e8238c9316526ee9ee9e6094a0b3303",
        "metrics": "4377db0c7817d59bf6470cab0930fc02080a9e2c9458d913ec8c1dc6bb4c9e4f",
        "loss": [2.0893421, 1.5528651, 0.9868604],
        "acc": [[29.6, 38.0], [49.0, 49.8], [80.8, 60.0]],
    },
    "FedNova": {
        "state": "bb452f98c08ec8f6034f73e3b09c533b1534c9a02934b475968820fa65abcd11",
        "metrics": "b8118688963e755801bca853e662b0ca746340fad0046b1ae6d6bedf0da7e7b5",
        "loss": [1.6360013, 0.71875, 0.4085863],
        "acc": [[55.6, 55.2], [82.2, 79.2], [99.8, 79.8]],
    },
    "InCoProx": {
        "state": "55b79248efaee3a2beb8d87da661981ae66e04f61ab29c9c91ad3071deae020c",
        "metrics": "cf2f8afdbdf2296b5135a06aa7b5e22beebe8e428f48eaf2356152e1141b9149",
        "loss": [1.899467, 0.9343005, 0.3101321],
        "acc": [[50.0, 74.6], [93.2, 89.4], [98.8, 96.6]],
    },
}


def computed(methods: list[str], env: dict[str, str] | None = None) -> dict:
    """The golden runs and operations as tests/golden_runs.py computes them in a fresh process."""
    env = {**os.environ, **(env or {})}
    done = subprocess.run([sys.executable, str(SCRIPT), *methods], env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        pytest.fail(f"{SCRIPT.name} failed: {done.stderr.strip().splitlines()[-1]}", pytrace=False)
    return json.loads(done.stdout)


def first_split(ops: dict[str, str]) -> str:
    """Where this CPU's bits first leave the pinned ones, in a step's order."""
    split = next((op for op in OPS if ops.get(op) != OPS[op]), None)
    if split is None:
        return "every operation matches its pin: what the engine computes has changed"
    return f"the first operation whose bits split: {split} ({ops.get(split)}, pinned {OPS[split]})"


@pytest.fixture(scope="module")
def golden() -> dict:
    return computed(list(GOLDEN))


@pytest.mark.slow
@pytest.mark.pin
@pytest.mark.xdist_group("golden")
@pytest.mark.parametrize("method", list(GOLDEN))
def test_golden_run(method, golden):
    assert golden["torch"] == TORCH, f"torch {golden['torch']}: the pins are for {TORCH} (pyproject.toml)"
    assert golden["runs"][method] == GOLDEN[method], first_split(golden["ops"])


@pytest.mark.slow
@pytest.mark.xdist_group("golden")
def test_operations_match_their_pins(golden):
    assert golden["ops"] == OPS, first_split(golden["ops"])


def test_a_split_names_the_first_operation():
    ops = {**OPS, "batch norm backward": "0" * 16, "Adam step": "1" * 16}
    assert first_split(ops).startswith("the first operation whose bits split: batch norm backward")
    assert first_split(OPS) == "every operation matches its pin: what the engine computes has changed"


def test_a_pin_the_environment_overrides_fails_in_one_line(tmp_path):
    """Refused before a run starts, never skipped: the constants could not hold."""
    with pytest.raises(pytest.fail.Exception, match="the environment sets MKL_CBWR=AVX2"):
        computed(["FedAvg"], env={"MKL_CBWR": "AVX2"})


def test_every_pin_has_what_a_run_gives():
    """Each method's pin in golden_run's shape: two SHA-256s, a loss per round and an accuracy
    per model group and round (a pin of another shape could never match)."""
    from golden_runs import METHODS, SETTINGS

    assert list(GOLDEN) == METHODS
    assert SETTINGS["numerics"] == "portable" and environment("portable")
    rounds, groups = SETTINGS["rounds"], len(SETTINGS["models"])
    for method, pin in GOLDEN.items():
        assert set(pin) == {"state", "metrics", "loss", "acc"}, method
        assert all(re.fullmatch(r"[0-9a-f]{64}", pin[key]) for key in ("state", "metrics"))
        assert len(pin["loss"]) == rounds and all(0 < loss < 10 for loss in pin["loss"])
        assert len(pin["acc"]) == rounds and all(len(acc) == groups for acc in pin["acc"])
        assert all(0 <= a <= 100 for acc in pin["acc"] for a in acc)
    assert all(re.fullmatch(r"[0-9a-f]{16}", digest) for digest in OPS.values())


if __name__ == "__main__":  # print fresh constants (only when training is meant to change)
    fresh = computed(list(GOLDEN))
    print(f"TORCH = {fresh['torch']!r}\nOPS = {json.dumps(fresh['ops'], indent=4)}")
    print("GOLDEN = {\n" + "".join(f"    {m!r}: {json.dumps(p)},\n" for m, p in fresh["runs"].items()) + "}")
