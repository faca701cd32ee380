"""Local steps replayed as CUDA graphs (`cuda_graphs: true`, fl/stages/graphs.py).

On a CPU the graph trainers run their static-tensor code eagerly (`capture=False`), which is
everything but the recording: the optimizer state allocated once and zeroed per client, the
static batch, full batches through the replayed step and shorter ones eager, the masked rows
of the batched step. So here they must give exactly the updates of the trainers they replace
(the serial one bit for bit; the batched one in float64, to test_batched.py's 1e-6). The tests marked `cuda`
run where a GPU is (scripts/device/gpu-check.sh): recorded and replayed, against the eager
trainers on the same GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import QUIET, engine_on, small_synthetic
from test_batched import BASE, assert_same_updates, float64  # noqa: F401 (a fixture)

from incofl.config import ConfigError, RunConfig
from incofl.data.partition import make_partition
from incofl.fl.contracts import Round
from incofl.fl.engine.device import run_device
from incofl.fl.engine.simulator import simulator
from incofl.fl.stages.graphs import GraphBatchedTrainer, GraphTrainer

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

METHODS = [
    {"method": "FedAvg"},
    {"method": "FedAvg", "optimizer": "adam", "lr": 1e-3},
    {"method": "FedAvg", "drop_last": True, "bn_stats": "local"},
    {"method": "FedPart", "models": ["resnet10"], "method_args": {"warmup": 0}},
    {"method": "FedLAG", "holdout": 0.25},
    {"method": "InCoAvg", "optimizer": "adam", "lr": 1e-3},
]
IDS = ["sgd", "adam", "drop_last-local_bn", "part", "lag", "inco-adam"]


def cases(*names: str) -> list:
    return [pytest.param(METHODS[IDS.index(name)], id=name) for name in names]


# CI's minutes: Adam is InCoAvg's optimizer here; drop_last (no shorter batch) only the serial trainer's
SERIAL = cases("sgd", "drop_last-local_bn", "part", "lag", "inco-adam")
BATCHED = cases("sgd", "part", "lag", "inco-adam")


@pytest.fixture(scope="module")
def data():
    return small_synthetic(200)


def updates(engine, graphs: type | None = None, rounds: int = 1) -> list:
    """The last of `rounds` rounds' updates of `engine`'s clients, its trainer swapped for `graphs`'."""
    runner = engine.transport.clients.runner
    if graphs is not None:
        t = runner.trainer
        runner.trainer = graphs(t.settings, t.models, t.data, t.parts, t.autocast)
    for round_ in Round.upto(rounds):
        trained = runner.train_round(round_, engine.server.plan(round_), engine.server.start)
    return trained


@pytest.mark.slow
@pytest.mark.parametrize("settings", SERIAL)
def test_the_serial_graph_trainer_gives_the_serial_trainers_updates_bit_for_bit(data, settings):
    """Two rounds: the second reuses the first's optimizer state, zeroed, and static batch."""
    eager = updates(engine_on(data, **{**BASE, **settings}), rounds=2)
    graphs = updates(engine_on(data, **{**BASE, **settings}), GraphTrainer, rounds=2)
    for u, v in zip(eager, graphs, strict=True):
        assert (u.client, u.steps, u.loss) == (v.client, v.steps, v.loss)
        for mine, theirs in ((u.delta, v.delta), (u.kept, v.kept), *((u.extra[k], v.extra[k]) for k in u.extra)):
            assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


@pytest.mark.slow
@pytest.mark.parametrize("settings", BATCHED)
def test_the_batched_graph_trainer_gives_the_batched_trainers_updates(float64, data, settings):  # noqa: F811
    """Full batches through the masked step of every row, shorter ones eager; a second round
    refills the same stacked tensors."""
    batched = {"trainer": "batched", **BASE, **settings}
    eager = updates(engine_on(data, **batched), rounds=2)
    assert_same_updates(eager, updates(engine_on(data, **batched), GraphBatchedTrainer, rounds=2))


def test_cuda_graphs_on_a_cpu_run_is_refused_in_one_line():
    with pytest.raises(ValueError, match="cuda_graphs: CUDA graphs replay on a GPU; this run computes on the CPU"):
        RunConfig(device="cpu", cuda_graphs=True)
    cfg = RunConfig(device="auto", numerics="native", cuda_graphs=True)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="cuda_graphs: CUDA graphs replay on a GPU; this run computes on the cpu"):
            run_device(cfg)


@pytest.mark.parametrize("method", ["SCAFFOLD", "MOON", "FedProx", "FedDyn"])
def test_objectives_with_session_hooks_are_refused_with_cuda_graphs(method):
    with pytest.raises(ValueError, match=rf"cuda_graphs: {method}'s \w+ objective has session hooks"):
        RunConfig(method=method, cuda_graphs=True, device="cuda", models=["resnet10"])


def cuda_engine(data, **settings):
    cfg = RunConfig(**{**QUIET, **BASE, **settings, "device": "cuda"})
    part = make_partition(data.y_train, kind=cfg.partition, num_clients=cfg.clients, alpha=cfg.alpha, seed=0)
    return simulator(cfg, data, part, torch.device("cuda"))


def relative_error(u, v) -> float:
    """‖Δu - Δv‖ / ‖Δu‖ over a client's flattened floating-point deltas."""
    a = torch.cat([d.flatten().double() for _, d in sorted(u.delta.items()) if d.is_floating_point()])
    b = torch.cat([d.flatten().double() for _, d in sorted(v.delta.items()) if d.is_floating_point()])
    return float((a - b).norm() / a.norm())


@cuda
@pytest.mark.parametrize("trainer", ["serial", "batched"])
@pytest.mark.parametrize("settings", cases("sgd", "adam", "part"))
def test_recorded_graphs_give_the_eager_trainers_updates_on_a_gpu(float64, data, trainer, settings):  # noqa: F811
    """Recorded and replayed (a capture after WARMUP steps) against the eager trainer, on the
    same GPU, in float64 with cuDNN's deterministic kernels: equal to test_batched.py's 1e-6
    (the masked step computes every row, the eager one only the stepping rows: vmapped
    convolutions of another size may sum in another order)."""
    graphs = GraphTrainer if trainer == "serial" else GraphBatchedTrainer
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True):
        eager = updates(cuda_engine(data, trainer=trainer, **settings), rounds=2)
        captured = updates(cuda_engine(data, trainer=trainer, **settings), graphs, rounds=2)
    errors = [relative_error(u, v) for u, v in zip(eager, captured, strict=True)]
    print(f"relative errors ({trainer}, {settings}): {np.array(errors)}")
    assert max(errors) < 1e-6, errors
