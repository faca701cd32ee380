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
    "Adam step": "e1c96970e3f9318d",
}
# method -> state_sha256, SHA-256 of metrics.csv's columns, mean_loss per round, (acc_g0, acc_g1) per round
GOLDEN = {
    "FedAvg": {
        "state": "04969260f8abc18b25958af654023ea69034983476b1bd8129800a8378371e4b",
        "metrics": "5a8bc1e82e2d6fe5add4d3239dc063de455a7029cb62832f8cad8f79303f7d5a",
        "loss": [1.664076, 0.7358831, 0.4220163],
        "acc": [[55.6, 54.6], [82.2, 78.4], [99.6, 79.6]],
    },
    "InCoAvg": {
        "state": "02bee9aaaa57110a74aad262c8aa9fcf3fac44ac31c91eda8a6f8c99cf4c13f8",
        "metrics": "381cc450d9adea428b9a839228c98cc92d35de8e9fd047c3dbe71e14aafa2f3e",
        "loss": [1.8924562, 0.9203828, 0.3024473],
        "acc": [[51.0, 75.4], [94.0, 89.8], [99.2, 96.0]],
    },
    "SCAFFOLD": {
        "state": "e38d35c6ded35f2717e9ccc8173460b3b1c0458fb566af9fc8ac78ea86a3f649",
        "metrics": "fc8230b8eb97277f5136555efc55cdbedda748d3171171169405a8126e4134c3",
        "loss": [1.664076, 0.7304667, 0.375245],
        "acc": [[55.6, 54.6], [81.4, 74.6], [99.2, 80.0]],
    },
    "MOON": {
        "state": "d1f627ab355633cfce2b34cdce7f0c97c52d8745a928373086fe09f33eaab71f",
        "metrics": "d0a39344d78af9d7890cd85b4d8d53750f8451dd7e17ea0fe01ae2888dd8e1f8",
        "loss": [2.089342, 1.5528682, 0.9897065],
        "acc": [[29.6, 38.0], [49.0, 49.8], [80.6, 60.0]],
    },
    "FedNova": {
        "state": "a042e0a2c83b359a3d8c7cd5b61c70c00c0b66e65fa026812c15a45539a4032e",
        "metrics": "8ffcb961e256769e8f6bbdd14295f7f67b3a1ce05186a27a8878a35787a2f35c",
        "loss": [1.6360299, 0.7132076, 0.4101146],
        "acc": [[55.6, 55.2], [82.2, 79.4], [99.8, 80.0]],
    },
    "InCoProx": {
        "state": "fe06c5720b1339e120719ccdff9960160e9b3cc3eaa6c5736459d5b9d9f7a941",
        "metrics": "e33ee742aa849f069aced0b5d6b8bdd4c9afab375cfc3da6d1ae2aaec504bce0",
        "loss": [1.8994193, 0.928028, 0.31175],
        "acc": [[49.8, 74.6], [93.4, 89.2], [98.8, 97.0]],
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
