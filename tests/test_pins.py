"""Pins that hold on every CPU: the data sets' and partitions' bytes, the client sampling schedule,
and two float64 rounds of each method family, compared with stored values.

test_golden.py pins training bit for bit, but only on the machines it has constants for: CPU
kinds pick different float32 kernels, and Adam makes their last-bit differences visible. These
pins check numbers on any machine:

- data, partitions and schedules are integers drawn by seeded NumPy generators: hashes, exact;
- each family's arithmetic runs in float64 (torch's default dtype set for the test: models,
  data batches, optimizer states and server states are then all float64) on a tiny model, and
  each federation's change of the weights over two rounds is pinned by its L1 norm, its squared
  L2 norm and a signed sum, with a relative tolerance of 1e-9. Why 1e-9: two CPUs differ only in
  the order their kernels sum in, a few float64 roundings (2.2e-16 each) per operation; the
  float32 runs of test_golden show how much training amplifies such differences (round-3 losses
  9% apart from roundings of 6e-8: a factor of about 1e6 over three rounds), which takes
  float64's to about 1e-10 at worst. A change of the arithmetic (another weight, a lost term,
  a float32 step anywhere: 6e-8) moves the pins by far more than 1e-9.

Each test carries the `pin` mark: under CI, a run in which no pin passed fails (pins.py).
If a change is *meant* to alter these numbers, print fresh constants with
`python tests/test_pins.py` and say so in the commit.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch
from helpers import engine_on, small_synthetic

from incofl.data.partition import make_partition
from incofl.data.sources import content_hash, load_dataset
from incofl.fl.contracts import Round
from incofl.fl.stages.sampling import sample_schedule

pytestmark = pytest.mark.pin

DATA = {
    "digits": "3a532a371362496de2c3d592e260127afb5d158e379616dd1c05db705bd907cb",
    "synthetic": "538192f7b34f7b46ed6038055d187488b765413b6910e141eca1dcc3f04407d5",
}
# (data set, alpha, clients, seed) -> SHA-256 of the client index arrays
PARTITIONS = {
    ("digits", 0.5, 20, 0): "e7cf137aa1b54bc974e4620f201dd6644ebb3149e02ea82b5909b603f8e9c35b",
    ("synthetic", 0.1, 10, 3): "2416f741e17c48ed69e5f04dde7c5d1420b5f744f6ddf8af45cb0e89730e184b",
}
# (seed, clients, ratio, rounds) -> SHA-256 of the (rounds, m) client ids
SCHEDULES = {
    (0, 20, 0.25, 16): "095ea8629f05c837e84130f679a5cf1504f4e5beb322deac1e811dc4a13b956f",
    (7, 100, 0.1, 500): "0328820cf1b3bcc7618cbdc448e40af5f0f642aa9e8cc32a3bc5cb0ec8ebb4e7",
}
CIFAR10 = "ff8e6d8f0d6e73d77b2edf32d9f915a7e44183b1a9df5ddd4aabf25e20da789f"  # the decoded cifar10-jpeg.tar.xz

# four clients of unequal size (Dirichlet), two a round: SCAFFOLD's c and FedNova's normalisation
# differ from FedAvg's only where a federation has several clients (a client new to it, unequal steps)
TINY = {
    "clients": 4,
    "ratio": 0.5,
    "rounds": 2,
    "batch_size": 16,
    "alpha": 0.5,
    "eval_last": 0,
    "models": ["resnet10", "resnet14"],
    "model_scale": 0.125,
}
WIDTH = {"models": ["preresnet18"], "width_rates": [1.0, 0.5], "optimizer": "sgd", "lr": 0.05}
# one method per family: the settings its two rounds run with
FAMILIES: dict[str, dict[str, Any]] = {
    "FedAvg": {},
    "FedProx": {},
    "SCAFFOLD": {},
    "MOON": {},
    "FedNova": {"models": ["resnet10"]},  # one federation: two clients' unequal steps normalised
    "InCoAvg": {},
    "FedPart": {"method_args": {"warmup": 0, "rounds_per_group": 1}},
    "FedLAG": {"holdout": 0.25},
    "HeteroFL": WIDTH,
    "FedRolex": WIDTH,
    "ScaleFL": {**WIDTH, "models": ["resnet110"], "width_rates": [0.5, 1.0], "exits": [1, 4]},
}
# method -> per federation (L1, squared L2, signed sum) of its weights' change over two rounds
ROUNDS = {
    "FedAvg": [
        [201.76996813745438, 34.070485633718484, -3.108478179639797],
        [313.89633804579387, 54.917913521194464, -2.362980214848739],
    ],
    "FedProx": [
        [201.66288401072254, 34.06986452749412, -3.094985518931643],
        [313.77320832609985, 54.91295044942487, -2.424707519331611],
    ],
    "SCAFFOLD": [
        [185.55270093174644, 34.014581290831536, -2.985001743168592],
        [293.6900464665117, 54.83061650621626, -3.3893775464258713],
    ],
    "MOON": [
        [262.0304990532343, 40.24822534385842, -2.0371058078644104],
        [364.8018947962686, 56.38354922398405, -7.277672352591627],
    ],
    "FedNova": [[185.70390326514155, 34.43206560620317, 4.093952534118619]],
    "InCoAvg": [[300.1755216977107, 51.09420787416366, -4.008804500866555]],
    "FedPart": [
        [5.106599758603596, 0.6103264022210962, -1.1771207743149628],
        [5.108926109949613, 0.6137065630333456, -0.8467832123452091],
    ],
    "FedLAG": [
        [198.34392706385648, 34.16130295076708, -3.2010617107643196],
        [314.97009265943836, 55.053933352998754, -8.077482267112236],
    ],
    "HeteroFL": [[26.578739892510974, 0.017320549706012267, 0.169403873450603]],
    "FedRolex": [[25.39152761761595, 0.01587669222922029, 0.17310164488894822]],
    "ScaleFL": [[86.07084337535274, 4.260488872050297, -1.3641236509337473]],
}
TOLERANCE = 1e-9


def sha256(arrays: list[np.ndarray]) -> str:
    digest = hashlib.sha256()
    for a in arrays:
        digest.update(str(a.shape).encode() + np.ascontiguousarray(a, dtype=np.int64).tobytes())
    return digest.hexdigest()


@contextmanager
def float64() -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def change(start: dict[str, torch.Tensor], end: dict[str, torch.Tensor]) -> list[float]:
    """L1, squared L2 and a signed sum (weights -3..3 by position) of end - start."""
    delta = torch.cat([(end[k] - start[k]).flatten().double() for k in sorted(start)])
    signs = torch.arange(len(delta), dtype=torch.float64) % 7 - 3
    return [float(delta.abs().sum()), float(delta.square().sum()), float((delta * signs).sum())]


def two_rounds(method: str) -> list[list[float]]:
    """Two float64 rounds of `method` on 128 images; the change of each federation's weights."""
    with float64():
        engine = engine_on(small_synthetic(128), **{**TINY, "method": method, **FAMILIES[method]})
        start = [{k: v.clone() for k, v in state.items() if v.is_floating_point()} for state in engine.server.weights]
        for round_ in Round.upto(2):
            engine.observe(engine.run_round(round_))
        assert all(
            v.dtype == torch.float64 for state in engine.server.weights for v in state.values() if v.is_floating_point()
        )
        return [change(before, after) for before, after in zip(start, engine.server.weights, strict=True)]


@pytest.mark.parametrize("name", DATA)
def test_data_bytes(name, tmp_path):
    assert content_hash(vars(load_dataset(name, cache_dir=tmp_path))) == DATA[name]


@pytest.mark.parametrize("key", PARTITIONS)
def test_partition(key, tmp_path):
    name, alpha, clients, seed = key
    labels = load_dataset(name, cache_dir=tmp_path).y_train
    part = make_partition(labels, kind="dirichlet", num_clients=clients, alpha=alpha, seed=seed, dataset=name)
    assert sha256(part.parts) == PARTITIONS[key]


@pytest.mark.parametrize("key", SCHEDULES)
def test_client_sampling_schedule(key):
    assert sha256([sample_schedule(*key)]) == SCHEDULES[key]


@pytest.mark.slow
@pytest.mark.xdist_group("cifar10")  # the tests that read CIFAR-10 on one worker: its cache_dir decodes it once
def test_cifar10_bytes(data_dir, cache_dir):
    assert content_hash(vars(load_dataset("cifar10", data_dir, cache_dir))) == CIFAR10


@pytest.mark.parametrize("method", FAMILIES)
def test_two_float64_rounds(method):
    got = two_rounds(method)
    assert len(got) == len(ROUNDS[method])
    for ours, pinned in zip(got, ROUNDS[method], strict=True):
        assert ours == pytest.approx(pinned, rel=TOLERANCE, abs=TOLERANCE * pinned[0]), method


if __name__ == "__main__":  # print fresh constants (only when what they pin is meant to change)
    import tempfile

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        data = {name: load_dataset(name, cache_dir=tmp) for name in DATA}
        print({name: content_hash(vars(d)) for name, d in data.items()})
        for name, alpha, clients, seed in PARTITIONS:
            part = make_partition(
                data[name].y_train, kind="dirichlet", num_clients=clients, alpha=alpha, seed=seed, dataset=name
            )
            print((name, alpha, clients, seed), sha256(part.parts))
    print({key: sha256([sample_schedule(*key)]) for key in SCHEDULES})
    for method in sys.argv[1:] or FAMILIES:
        print(f"    {method!r}: {two_rounds(method)!r},", flush=True)
