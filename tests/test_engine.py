"""The round loop end to end on small real problems: learning, determinism, reductions,
checkpoints of other settings refused (resume after SIGKILL: test_reliability.py)."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from helpers import assert_trained, seen

from incofl.config import load_run_config
from incofl.data.sources import load_dataset
from incofl.fl.contracts import Round
from incofl.fl.engine.simulator import train
from incofl.fl.stages.sampling import client_seed, group_of, sample_schedule

SMALL = {
    "datasets": ["synthetic"],
    "clients": 6,
    "ratio": 0.5,
    "models": ["resnet10", "resnet14"],
    "model_scale": 0.25,  # a quarter of the channels: the properties do not depend on width
    "rounds": 3,
    "batch_size": 32,
    "min_size": 20,
    "progress": False,
    "threads": 1,
}
TIMING_KEYS = {"wall_s", "samples_per_s"}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return load_dataset("synthetic", cache_dir=tmp_path_factory.mktemp("cache"))


def _cfg(tmp_path, **extra):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({**SMALL, "cache_dir": str(tmp_path / "cache"), **extra}))
    return path


def _result(out):
    summary = json.loads((out / "summary.json").read_text())
    metrics = pd.read_csv(out / "metrics.csv").drop(columns="seconds")
    return {k: v for k, v in summary.items() if k not in TIMING_KEYS}, metrics


def test_sampling_is_a_function_of_the_seed_only():
    a, b = sample_schedule(3, 100, 0.1, 20), sample_schedule(3, 100, 0.1, 50)
    assert a.shape == (20, 10) and np.array_equal(a, b[:20])  # a longer run starts the same
    assert all(len(set(r)) == 10 for r in a)
    assert not np.array_equal(a, sample_schedule(4, 100, 0.1, 20))
    assert [group_of(i, 100, 5) for i in (0, 19, 20, 99)] == [0, 0, 1, 4]
    assert client_seed(0, 1, 2) != client_seed(0, 2, 1)


@pytest.mark.slow
def test_evaluation_schedule_does_not_change_training(tmp_path, synthetic):
    """Evaluating draws no randomness and changes no state, so the final accuracy of a run
    does not depend on eval_every (the CIFAR-10 evidence mixes eval_every 5 and 10)."""
    every_round, at_end = (
        train(
            load_run_config(_cfg(tmp_path), {"method": "InCoAvg", "eval_every": every}),
            tmp_path / f"every{every}",
            data=synthetic,
        )
        for every in (1, SMALL["rounds"])
    )
    for key in ("final_acc", "final_loss", "group_final_acc"):
        assert every_round[key] == at_end[key]
    log = (tmp_path / "every1" / "train.log").read_text()
    assert f"round 1/{SMALL['rounds']} trained in" in log  # visible progress without tqdm


@pytest.mark.slow
def test_inco_learns_and_same_seed_is_identical(tmp_path, synthetic):
    cfg = load_run_config(_cfg(tmp_path), {"method": "InCoAvg"})
    first = train(cfg, tmp_path / "a", data=synthetic)
    train(cfg, tmp_path / "b", data=synthetic)
    assert first["final_acc"] > 50.0  # 10 classes: chance is 10%
    assert _result(tmp_path / "a")[0] == _result(tmp_path / "b")[0]
    pd.testing.assert_frame_equal(_result(tmp_path / "a")[1], _result(tmp_path / "b")[1])
    inco = pd.read_csv(tmp_path / "a" / "inco.csv")
    assert set(inco["layer"]) == {
        "layer3.1.conv1.weight",
        "layer3.1.conv2.weight",
        "layer4.1.conv1.weight",
        "layer4.1.conv2.weight",
    }
    assert inco["theta"].between(0, 5).all()


@pytest.mark.slow
def test_one_group_heteroavg_equals_fedavg(tmp_path, synthetic):
    """With a single model group every client holds every entry: the shared global state and
    the group's own federation are the same thing, bit for bit."""
    runs = {}
    for method in ("FedAvg", "HeteroAvg"):
        cfg = load_run_config(_cfg(tmp_path, models=["resnet10"], rounds=2), {"method": method})
        train(cfg, tmp_path / method, data=synthetic)
        runs[method] = _result(tmp_path / method)[1]
    pd.testing.assert_frame_equal(runs["FedAvg"], runs["HeteroAvg"])


@pytest.mark.parametrize("other", [{"lr": 0.01}, {"rounds": 2}, {"rounds": 5}, {"eval_last": 0}])
def test_checkpoint_from_other_settings_is_refused(tmp_path, synthetic, other):
    """Other rounds too: a resumed run never mixes two schedules (summary says 2 rounds, metrics
    from round 3)."""
    from incofl.fl.engine import checkpoint

    cfg = load_run_config(_cfg(tmp_path), {"method": "InCoAvg"})
    out = tmp_path / "run"
    out.mkdir()
    made = load_run_config(_cfg(tmp_path), {"method": "InCoAvg", **other})
    checkpoint.save(out / "ckpt.pt", {"config": checkpoint.semantic_config(made.model_dump())})
    key, value = next(iter(other.items()))
    with pytest.raises(checkpoint.CheckpointMismatch, match=f"ckpt.pt: made with {key}={value}.*delete the checkpoint"):
        train(cfg, out, data=synthetic)


@pytest.mark.slow
def test_client_update_is_a_real_difference(synthetic, tmp_path):
    """The released code's CPU bug (state_dict sharing storage) makes every delta zero."""
    from incofl.data.partition import make_partition
    from incofl.fl.engine.simulator import simulator

    cfg = load_run_config(_cfg(tmp_path), {"method": "HeteroAvg"})
    part = make_partition(synthetic.y_train, kind="iid", num_clients=6, alpha=1.0, seed=0)
    engine = simulator(cfg, synthetic, part, torch.device("cpu"))
    before = {k: v.clone() for k, v in engine.server.weights[0].items()}
    update = engine.transport.clients.runner.trainer.train_client(
        Round(1),
        engine.server.planner.plan(Round(1), 5),
        engine.server.sub_state(1),
        engine.transport.clients.objective,
    )
    assert update.group == 1 and update.steps == int(np.ceil(len(part.parts[5]) / 32))
    assert max(d.abs().max().item() for d in update.delta.values()) > 0
    assert all(torch.equal(before[k], engine.server.weights[0][k]) for k in before)  # global untouched by training


@pytest.mark.slow
def test_vit_family_runs_inco_on_the_norm_pairs(tmp_path, synthetic):
    """ViT-S depth 8 and 9 at 224x224 (upsampled on the fly) on a few images: one InCo round."""
    tiny = seen(synthetic, 24, 8)  # 8 of the 24 training images are the test split: a training loss
    cfg = load_run_config(
        _cfg(
            tmp_path,
            models=["vit_d8", "vit_d9"],
            model_scale=1.0,
            clients=2,
            ratio=1.0,
            rounds=1,
            partition="iid",
            batch_size=4,
            local_epochs=2,
            optimizer="sgd",
            lr=0.01,
            momentum=0.9,
        ),
        {"method": "InCoAvg"},
    )
    summary = train(cfg, tmp_path / "vit", data=tiny)
    assert len(summary["group_final_acc"]) == 2
    assert_trained(summary, cfg, tiny)
    inco = pd.read_csv(tmp_path / "vit" / "inco.csv")
    assert set(inco["layer"]) == {f"blocks.{i}.norm2.weight" for i in range(9)}
