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
    "conv forward": "e023fbbd422af63e",
    "conv backward": "51587528bd9bc1d0",
    "batch norm forward": "e896f316bace3fbc",
    "batch norm backward": "3c44a855d0d6d551",
    "matmul (linear forward, backward)": "6f06073b7cfc7c81",
    "cross-entropy forward, backward": "2bf619b4b55d58bf",
    "SGD step": "86778134baaaf0ac",
    "Adam step": "e1c96970e3f9318d",
}
# method -> state_sha256, SHA-256 of metrics.csv's columns, mean_loss per round, (acc_g0, acc_g1) per round
GOLDEN = {
    "FedAvg": {
        "state": "fd529135ab9ab75ed618e2142bef1b2677e1d057cc5de142845e0667927a8b02",
        "metrics": "69e8ba1997eb680901d98f7433b2c4fe72b7d06b5e24c1c80f8bad5634b386eb",
        "loss": [1.664109, 0.7390452, 0.418606],
        "acc": [[55.6, 54.6], [82.2, 78.4], [99.4, 80.0]],
    },
    "InCoAvg": {
        "state": "771746c72cb0440a8b7b98902b4193cdc6086a045889b9291b67466d04e9e78b",
        "metrics": "7ce98e92ef2381a4a7b2eaf826cf930e0fdd1b530b1b7398d83750e1a62769d0",
        "loss": [1.8924547, 0.912537, 0.2950263],
        "acc": [[51.0, 75.6], [94.0, 90.4], [98.8, 96.2]],
    },
    "SCAFFOLD": {
        "state": "7683935c7bce11a40c041c19d6e8bc6d2ee31ca0276c996dc9f65c1e7e1ed406",
        "metrics": "8fade6373db6038dc9c3fc543b1f00980200989c534dac2a8808f3731c8a4bc0",
        "loss": [1.664109, 0.7312846, 0.3938403],
        "acc": [[55.6, 54.6], [81.4, 73.6], [99.2, 80.0]],
    },
    "MOON": {
        "state": "57d80eb63964902bf8ef5cf8a727dde2fefc44943cc33a088a31c7a8925c13c2",
        "metrics": "d8a365e3a69dab21cc3542ad3cd69ab05994b14e74e1d525dffe2d4aac7fe1b3",
        "loss": [2.089241, 1.5504524, 0.954696],
        "acc": [[29.6, 38.0], [49.0, 48.2], [81.4, 60.4]],
    },
    "FedNova": {
        "state": "bfb7a9a85a74b4e36f90cb5ed5d3cf7f7e425b45c1a3364ffdd97ba6e8a76b0f",
        "metrics": "d83eaee789eb1068842c0bce0c6791ce793d20853801c09fc6f6c08fbbc8ccbb",
        "loss": [1.636065, 0.7190042, 0.3922784],
        "acc": [[55.6, 55.4], [82.2, 79.2], [99.8, 80.2]],
    },
    "InCoProx": {
        "state": "6271c67afd2b30ad510c28ebf96a6aa9818b2fbdb70e7545b40129b0e18200f1",
        "metrics": "03409ff129c168b4c47441c71d6c2545fbab87e92d60df6c9d3f3a5649fe81d4",
        "loss": [1.8996818, 0.9270549, 0.3054742],
        "acc": [[49.6, 74.6], [93.4, 89.6], [98.8, 97.2]],
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
