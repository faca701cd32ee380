"""docs/add-a-method.md: the example code runs as written and its two methods are right."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from incofl.config import RunConfig
from incofl.data.dataset import ImageDataset
from incofl.data.partition import Partition, iid_partition
from incofl.data.sources import load_dataset
from incofl.fl.contracts import ClientUpdate, Round, Setup
from incofl.fl.engine.simulator import simulator
from incofl.params import describe
from incofl.registry import METHODS
from incofl.sides import ServerSettings

TINY = {
    "dataset": "synthetic",
    "clients": 4,
    "ratio": 0.5,
    "models": ["resnet10", "resnet14"],
    "rounds": 2,
    "batch_size": 32,
    "partition": "iid",
    "progress": False,
    "threads": 1,
    "device": "cpu",
}


DOC = Path(__file__).resolve().parents[1] / "docs" / "add-a-method.md"


@pytest.fixture(scope="module")
def example():
    """docs/add-a-method.md's first python block, executed; its methods removed after."""
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "docs/add-a-method.md", "exec"), namespace)
    yield namespace
    for name in ("FedAvgLS", "FedAvgClip"):
        METHODS.pop(name, None)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    full = load_dataset("synthetic", cache_dir=tmp_path_factory.mktemp("cache"))
    return ImageDataset("synthetic", full.x_train[:200], full.y_train[:200], full.x_test[:100], full.y_test[:100])


def _final_states(data, method, **args):
    cfg = RunConfig(**TINY, method=method, method_args=args)
    parts = iid_partition(len(data.y_train), cfg.clients, seed=0)
    engine = simulator(cfg, data, Partition(parts, np.zeros((cfg.clients, 0)), {}), torch.device("cpu"))
    for t in Round.upto(cfg.rounds):
        engine.run_round(t)
    return engine.server.weights


def _equal(a, b):
    return all(torch.equal(x[k], y[k]) for x, y in zip(a, b, strict=True) for k in x)


@pytest.mark.slow
def test_example_methods_reduce_to_fedavg(example, data):
    fedavg = _final_states(data, "FedAvg")
    assert _equal(fedavg, _final_states(data, "FedAvgLS", smoothing=0.0))
    assert not _equal(fedavg, _final_states(data, "FedAvgLS", smoothing=0.2))
    assert _equal(fedavg, _final_states(data, "FedAvgClip", max_norm=1e9))


def test_example_clip_bounds_every_update(example):
    g = torch.Generator().manual_seed(0)
    updates = [
        ClientUpdate(i, 0, {"a": torch.randn(5, generator=g) * 10, "b": torch.randn(3, generator=g)}, 10, 1)
        for i in range(3)
    ]
    clip = example["ClipUpdates"](
        METHODS["FedAvgClip"].parse_args({"max_norm": 0.5}), Setup(ServerSettings.of(RunConfig()), [])
    )
    for u in (clip(0, u) for u in updates):
        assert float(torch.sqrt(sum(d.pow(2).sum() for d in u.delta.values()))) == pytest.approx(0.5, rel=1e-5)


def test_example_parameters_are_validated(example):
    with pytest.raises(ValueError, match=r"method_args\.smoothing: Input should be less than 1"):
        METHODS["FedAvgLS"].parse_args({"smoothing": 1.0})
    assert "smoothing=0.1" in describe(METHODS["FedAvgLS"].params)


def test_example_spec_is_torch_free():
    """The doc's folder `spec.py` (its second python block) declares FedAvgLS and validates its
    parameters without importing torch, as the registry's import of a spec must."""
    spec = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)[1]
    check = (
        "import sys\nassert METHODS[0].parse_args({'smoothing': 0.2}).smoothing == 0.2\nprint('torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", spec + check], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


FEDDYN = Path(__file__).resolve().parents[1] / "src" / "incofl" / "fl" / "methods" / "feddyn"


def test_the_stateful_example_is_the_feddyn_folder():
    """The doc's stateful example is src/incofl/fl/methods/feddyn/ as it is (tests/test_feddyn.py
    runs it); its spec, run as written without torch, declares FedDyn and InCoDyn."""
    section = DOC.read_text().split("## A stateful method: FedDyn")[1].split("\n## ")[0]
    blocks = re.findall(r"```python\n# (\S+)\n(.*?)```", section, re.S)
    assert [name for name, _ in blocks] == ["spec.py", "dyn.py"]
    for name, code in blocks:
        assert code == (FEDDYN / name).read_text(), f"docs/add-a-method.md: {name} differs from the folder's"
    check = "import sys\nprint([m.name for m in METHODS], METHODS[0].parse_args({}).alpha, 'torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", blocks[0][1] + check], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['FedDyn', 'InCoDyn'] 0.01 False"
