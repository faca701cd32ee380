"""FedPart (docs/methods.md, FedPart): ResNet-8, layer groups, the schedule of every order and variant,
real freezing against the release's "gradients of everything, step the group", the poster's
cost ratios, the reductions to FedAvg, checkpoints and config validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

from incofl.config import ConfigError, RunConfig, load_run_config
from incofl.data.dataset import ImageDataset
from incofl.data.partition import Partition, iid_partition
from incofl.data.sources import load_dataset
from incofl.fl.contracts import Round, Setup
from incofl.fl.engine.simulator import simulator
from incofl.fl.methods.fedpart import plan as fedpart_module
from incofl.fl.methods.fedpart.plan import PartPlanner
from incofl.fl.methods.inco.step import InCoLog, InCoStep
from incofl.fl.methods.objectives.fedprox import FedProx
from incofl.fl.methods.objectives.moon import Moon
from incofl.fl.stages.aggregate import GroupWise, Shared
from incofl.fl.stages.local import client_batches, make_optimizer
from incofl.fl.stages.objective import Objective
from incofl.fl.stages.sampling import client_seed
from incofl.models.family import build_model, num_parameters
from incofl.models.groups import HEAD, STEM, LayerGroup, counterpart, layer_groups
from incofl.registry import METHODS
from incofl.sides import ServerSettings

COUNTS = {"resnet8": 10, "resnet10": 13, "resnet14": 17, "resnet18": 21, "resnet22": 25, "resnet26": 29}
TINY = {
    "dataset": "synthetic",
    "clients": 2,
    "ratio": 1.0,
    "models": ["resnet8"],
    "batch_size": 16,
    "partition": "iid",
    "progress": False,
    "threads": 1,
    "device": "cpu",
}


@pytest.fixture(scope="module")
def data():
    """64 training images (32 a client, 2 steps a round) and 32 test images of the synthetic set."""
    torch.set_num_threads(1)  # the machine's cores are shared
    full = load_dataset("synthetic", cache_dir=None)
    return ImageDataset("synthetic", full.x_train[:64], full.y_train[:64], full.x_test[:32], full.y_test[:32])


def _engine(data, method, **settings):
    cfg = RunConfig(**{**TINY, "method": method, **settings})
    parts = iid_partition(len(data.y_train), cfg.clients, seed=0)
    return simulator(cfg, data, Partition(parts, np.zeros((cfg.clients, 0)), {}), torch.device("cpu"))


def _planner(models=("resnet8",), seed=0, **args):
    """A FedPart planner over fresh models, two clients a model group."""
    cfg = RunConfig(**{**TINY, "models": list(models), "clients": 2 * len(models), "method": "FedPart", "seed": seed})
    built = [build_model(name, 10, 3) for name in models]
    return PartPlanner(METHODS["FedPart"].parse_args(args), Setup(ServerSettings.of(cfg), [], models=built)), built


def _schedule(planner, rounds):
    return [planner.layer(t) for t in Round.upto(rounds)]


def _run(engine, rounds):
    for t in Round.upto(rounds):
        engine.observe(engine.run_round(t))
    return engine


def _same_states(a, b):
    return all(torch.equal(x[k], y[k]) for x, y in zip(a.server.weights, b.server.weights, strict=True) for k in x)


# --- ResNet-8 and the layer groups ---------------------------------------------------------------


def test_resnet8_has_three_stages_and_a_256_wide_head():
    model = build_model("resnet8", 10, 3)
    assert num_parameters(model) == 1_235_274
    assert not any(k.startswith("layer4.") for k in model.state_dict())
    assert model.layer3[0].conv2.out_channels == 256 and model.fc.in_features == 256
    x = torch.randn(2, 3, 32, 32)
    assert model(x).shape == (2, 10) and model.features(x).shape == (2, 256)
    moon = build_model("resnet8", 10, 3, projection_dim=32)
    assert moon.state_dict()["proj.0.weight"].shape == (256, 256) and moon.fc.in_features == 32
    assert torch.equal(moon(x), moon.classify(moon.embed(x)))


def test_resnet8_replaced_stem_is_kaiming_initialised():
    torch.manual_seed(0)
    conv1 = build_model("resnet8", 10, 1, stem="cifar").conv1.weight
    assert conv1.shape == (64, 1, 3, 3)
    assert conv1.std().item() == pytest.approx((2 / (64 * 9)) ** 0.5, rel=0.15)


@pytest.mark.parametrize("name,count", COUNTS.items())
@pytest.mark.parametrize("projection_dim", [None, 16])
def test_layer_groups_partition_the_parameters(name, count, projection_dim):
    model = build_model(name, 10, 3, projection_dim=projection_dim)
    groups = layer_groups(model)
    assert len(groups) == count
    names = [n for g in groups for n in g.params]
    assert len(names) == len(set(names)) and set(names) == {n for n, _ in model.named_parameters()}
    floats = {k for k, v in model.state_dict().items() if v.is_floating_point()}
    assert set(names) | {s for g in groups for s in g.stats} == floats  # the BN statistics travel with their group
    assert groups[0].key == STEM and groups[-1].key == HEAD
    head = {n for n, _ in model.named_parameters() if n.startswith(("fc.", "proj."))}
    assert groups[-1].params == head and bool(projection_dim) == any(n.startswith("proj.") for n in head)


def test_resnet8_layer_groups_in_order():
    groups = layer_groups(build_model("resnet8", 10, 3))
    assert [g.key for g in groups] == [
        "stem",
        "layer1.0.conv1",
        "layer1.0.conv2",
        "layer2.0.conv1",
        "layer2.0.conv2",
        "layer2.0.downsample",
        "layer3.0.conv1",
        "layer3.0.conv2",
        "layer3.0.downsample",
        "head",
    ]
    assert groups[0].params == {"conv1.weight", "bn1.weight", "bn1.bias"}
    assert groups[0].stats == {"bn1.running_mean", "bn1.running_var"}  # not num_batches_tracked (an integer)
    assert groups[5].params == {f"layer2.0.downsample.{n}" for n in ("0.weight", "1.weight", "1.bias")}


def test_vits_have_no_layer_groups():
    with pytest.raises(ValueError, match="FedPart layer groups are defined for ResNets only"):
        layer_groups(build_model("vit_d8", 10, 3, image_size=224))


def test_a_shallower_model_stands_in_with_the_stages_deepest_earlier_block():
    r10, r14 = layer_groups(build_model("resnet10", 10, 3)), layer_groups(build_model("resnet14", 10, 3))
    assert counterpart("layer3.2.conv1", r10).key == "layer3.0.conv1"
    assert counterpart("layer3.2.conv2", r14).key == "layer3.1.conv2"
    assert counterpart("layer2.0.downsample", r10).key == "layer2.0.downsample"
    with pytest.raises(ValueError, match="no FedPart layer group stands for layer5.0.conv1"):
        counterpart("layer5.0.conv1", r10)


# --- the schedule --------------------------------------------------------------------------------

SEQUENTIAL = [None] * 5 + [g for g in range(10) for _ in range(2)]


def test_sequential_cycles_pinned():
    planner, _ = _planner()
    assert _schedule(planner, 50) == SEQUENTIAL * 2  # L = 5 + 2 * 10 = 25


def test_reverse_cycles_pinned():
    planner, _ = _planner(order="reverse")
    assert _schedule(planner, 50) == ([None] * 5 + [g for g in range(9, -1, -1) for _ in range(2)]) * 2


def test_random_order_is_a_fresh_permutation_per_cycle_from_the_seed():
    planner, _ = _planner(order="random", warmup=1, rounds_per_group=1)
    first, second = [7, 4, 2, 5, 1, 6, 0, 8, 9, 3], [0, 9, 7, 6, 4, 5, 2, 3, 1, 8]  # seed 0, as drawn
    assert _schedule(planner, 22) == [None, *first, None, *second]
    assert _schedule(_planner(order="random", warmup=1, rounds_per_group=1)[0], 22) == _schedule(planner, 22)
    other = _planner(order="random", warmup=1, rounds_per_group=1, seed=1)[0]
    assert _schedule(other, 22) != _schedule(planner, 22)


def test_once_warms_up_once_then_cycles_the_groups_for_ever():
    planner, _ = _planner(schedule="once", warmup=2, rounds_per_group=1)
    assert _schedule(planner, 32) == [None, None, *range(10), *range(10), *range(10)]
    reverse, _ = _planner(schedule="once", order="reverse", warmup=0, rounds_per_group=3)
    assert _schedule(reverse, 33) == [g for g in range(9, -1, -1) for _ in range(3)] + [9, 9, 9]
    shuffled, _ = _planner(schedule="once", order="random", warmup=1, rounds_per_group=1)
    passes = _schedule(shuffled, 21)
    assert passes == [None, 7, 4, 2, 5, 1, 6, 0, 8, 9, 3, 0, 9, 7, 6, 4, 5, 2, 3, 1, 8]  # as the cycles' permutations


def test_no_warmup_means_no_full_round():
    planner, _ = _planner(warmup=0, rounds_per_group=1)
    assert _schedule(planner, 20) == list(range(10)) * 2


def test_plans_train_and_upload_the_scheduled_group():
    planner, (model,) = _planner()
    groups = layer_groups(model)
    assert all(planner.plan(t, c).full and planner.plan(t, c).upload is None for t in Round.upto(5) for c in (0, 1))
    for t in Round.upto(25)[5:]:
        group = groups[SEQUENTIAL[t.index]]
        plan = planner.plan(t, 1)
        assert not plan.full and plan.trainable == group.params and plan.upload == group.params | group.stats
        assert (plan.client, plan.group, plan.federation, plan.federation_size) == (1, 0, 0, 2)


@pytest.mark.parametrize("warmup,per_group", [(5, 2), (0, 1), (3, 3)])
def test_planned_upload_and_compute_follow_the_posters_formulas(warmup, per_group):
    planner, (model,) = _planner(warmup=warmup, rounds_per_group=per_group)
    total, sizes = num_parameters(model), dict(model.named_parameters())
    plans = [planner.plan(t, 0) for t in Round.upto(warmup + per_group * 10)]  # one cycle
    uploaded = sum(total if p.full else sum(sizes[n].numel() for n in p.upload if n in sizes) for p in plans)
    assert uploaded == total * (warmup + per_group)  # (W + R) / (W + RG) of full updates
    full = sum(p.full for p in plans)
    assert (full, len(plans) - full) == (warmup, per_group * 10)  # compute (3W + 2RG) / (3(W + RG))


def test_shallower_models_train_a_counterpart_and_visit_all_their_groups():
    planner, (r10, r26) = _planner(models=("resnet10", "resnet26"), warmup=0, rounds_per_group=1)
    g10, g26 = layer_groups(r10), layer_groups(r26)
    assert planner.keys == [g.key for g in g26]
    round_ = Round.upto(len(planner.keys))[planner.keys.index("layer3.2.conv1")]  # the round that trains it
    assert planner.plan(round_, 0).trainable == next(g.params for g in g10 if g.key == "layer3.0.conv1")
    assert planner.plan(round_, 3).trainable == next(g.params for g in g26 if g.key == "layer3.2.conv1")
    names10 = {n for n, _ in r10.named_parameters()}
    trained = [planner.plan(t, 0).trainable for t in Round.upto(29)]
    assert all(t <= names10 for t in trained) and {frozenset(t) for t in trained} == {g.params for g in g10}


def test_planner_checkpoint_round_trip():
    planner, _ = _planner(order="random", warmup=2)
    state = planner.state_dict()
    resumed, _ = _planner(order="random", warmup=2)
    resumed.load_state_dict(state)
    assert [resumed.plan(t, 0) for t in Round.upto(60)] == [planner.plan(t, 0) for t in Round.upto(60)]
    deeper, _ = _planner(models=("resnet10",), order="random", warmup=2)
    with pytest.raises(ValueError, match="checkpoint made with layer groups"):
        deeper.load_state_dict(state)


# --- the registry and method_args ----------------------------------------------------------------


def test_registry_entries():
    expected = {
        "FedPart": (Objective, GroupWise, (), (), "FedAvg"),
        "FedPartProx": (FedProx, GroupWise, (), (), "FedProx"),
        "FedPartMOON": (Moon, GroupWise, (), (), "MOON"),
        "InCoPart": (Objective, Shared, (InCoStep,), (InCoLog,), "FedPart"),
    }
    for name, (objective, aggregator, post, observers, base) in expected.items():
        m = METHODS[name]
        stages = (m.objective, m.aggregator, *m.post, *m.observers, m.planner)
        assert tuple(c.cls for c in stages) + (m.base,) == (objective, aggregator, *post, *observers, PartPlanner, base)
        assert "NeurIPS 2024" in m.source
        hp = m.parse_args({})
        assert (hp.order, hp.warmup, hp.rounds_per_group, hp.schedule) == ("sequential", 5, 2, "cycles")
    assert METHODS["InCoPart"].parse_args({"schedule": "once"}).variant == "official"  # InCo's variant is kept


@pytest.mark.parametrize(
    "args,message",
    [
        ({"order": "zigzag"}, "method_args.order: Input should be 'sequential', 'reverse' or 'random'"),
        ({"warmup": -1}, "method_args.warmup: Input should be greater than or equal to 0"),
        ({"warmup": 1.5}, "method_args.warmup: Input should be a valid integer"),
        ({"rounds_per_group": 0}, "method_args.rounds_per_group: Input should be greater than or equal to 1"),
        ({"schedule": "forever"}, "method_args.schedule: Input should be 'cycles' or 'once'"),
    ],
)
def test_bad_method_args_are_one_line_naming_the_key(tmp_path, args, message):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"methods": ["FedPart"], "models": ["resnet8"], "method_args": args}))
    with pytest.raises(ConfigError) as err:
        load_run_config(path)
    assert message in str(err.value) and "\n" not in str(err.value)


# --- local training: real freezing ---------------------------------------------------------------


def test_frozen_parameters_stay_and_training_equals_stepping_only_the_group(data):
    """Round 4 of W = 0, R = 1 trains layer2.0.conv1 + bn1: the other parameters are bit for bit
    the global ones, and the result is the release's loop (every parameter requires grad, the
    optimizer holds the group only); BN statistics of frozen layers move in both (train mode)."""
    engine = _engine(data, "FedPart", method_args={"warmup": 0, "rounds_per_group": 1})
    cfg, round_, client = engine.server.settings, Round(4), 1
    plan = engine.server.planner.plan(round_, client)
    start = {k: v.clone() for k, v in engine.server.sub_state(0).items()}
    update = engine.transport.clients.runner.trainer.train_client(
        round_, plan, engine.server.sub_state(0), engine.transport.clients.objective
    )
    trained = engine.transport.clients.layout.models[0].state_dict()  # the client side's model
    assert plan.trainable == {"layer2.0.conv1.weight", "layer2.0.bn1.weight", "layer2.0.bn1.bias"}
    for name, _ in engine.transport.clients.layout.models[0].named_parameters():
        assert torch.equal(trained[name], start[name]) != (name in plan.trainable), name
    assert not torch.equal(trained["bn1.running_mean"], start["bn1.running_mean"])  # frozen BN, train mode
    assert set(update.delta) == plan.upload and not update.full
    assert update.upload_params == sum(start[n].numel() for n in plan.trainable)

    release = build_model("resnet8", 10, 3)
    release.load_state_dict(start)
    release.train()
    optimizer = make_optimizer(
        [p for n, p in release.named_parameters() if n in plan.trainable],
        cfg.optimizer,
        cfg.lr,
        cfg.momentum,
        cfg.weight_decay,
    )
    gen = torch.Generator().manual_seed(client_seed(cfg.seed, round_.index, client))
    batches = client_batches(
        engine.transport.clients.training.train,
        engine.transport.clients.training.parts[client],
        cfg.local_epochs,
        cfg.batch_size,
        gen,
    )
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(release(x), y).backward()
        optimizer.step()
    assert release.conv1.weight.grad is not None  # computed, not used
    assert all(torch.equal(v, trained[k]) for k, v in release.state_dict().items())


# --- whole rounds: costs, reductions, resume ------------------------------------------------------


@pytest.mark.slow
def test_one_cycle_costs_7_25_of_the_uploads_and_55_75_of_the_compute(data):
    """ResNet-8, W = 5, R = 2, G = 10: the poster's -72% upload and -27% compute, exactly."""
    part = _run(_engine(data, "FedPart", batch_size=32), 25).server.costs.totals()  # a step a client and round
    full = _run(_engine(data, "FedAvg", batch_size=32), 25).server.costs.totals()
    assert full["upload_bytes"] == 25 * 2 * 4 * 1_235_274  # rounds x clients x fp32 x parameters
    assert part["upload_bytes"] * 25 == full["upload_bytes"] * 7
    assert part["compute_units"] * 75 == full["compute_units"] * 55


@pytest.mark.slow
def test_warmup_over_every_round_is_fedavg_bit_for_bit(data):
    part = _run(_engine(data, "FedPart", method_args={"warmup": 3}), 3)
    assert _same_states(part, _run(_engine(data, "FedAvg"), 3))


@pytest.mark.slow
def test_a_single_layer_group_is_fedavg_bit_for_bit(data, monkeypatch):
    def one_group(model):
        groups = layer_groups(model)
        return [
            LayerGroup(
                "all", frozenset().union(*(g.params for g in groups)), frozenset().union(*(g.stats for g in groups))
            )
        ]

    monkeypatch.setattr(fedpart_module, "layer_groups", one_group)
    part = _run(_engine(data, "FedPart", method_args={"warmup": 0}), 3)
    full = _run(_engine(data, "FedAvg"), 3)
    assert not part.server.planner.plan(Round(1), 0).full and _same_states(part, full)
    assert part.server.costs.totals()["upload_bytes"] == full.server.costs.totals()["upload_bytes"]


@pytest.mark.parametrize("method", ["FedPart", "FedPartProx", "FedPartMOON", "InCoPart"])
def test_a_partial_round_changes_only_the_scheduled_group(data, method):
    engine = _engine(data, method, method_args={"warmup": 1, "rounds_per_group": 1, "order": "reverse"})
    engine.run_round(Round(1))  # full: MOON's clients now have previous models
    before = {k: v.clone() for k, v in engine.server.weights[0].items()}
    engine.run_round(Round(2))  # the head (with MOON's projection head)
    head = layer_groups(engine.server.models[0])[-1]
    changed = {k for k, v in engine.server.weights[0].items() if not torch.equal(v, before[k])}
    assert changed == head.params  # a head has no BN statistics
    assert any(k.startswith("proj.") for k in changed) == (method == "FedPartMOON")


def test_heterogeneous_groups_train_their_counterparts(data):
    engine = _engine(data, "FedPart", models=["resnet10", "resnet14"], method_args={"warmup": 0, "rounds_per_group": 1})
    round_ = Round.upto(len(engine.server.planner.keys))[engine.server.planner.keys.index("layer3.1.conv1")]
    before = [{k: v.clone() for k, v in s.items()} for s in engine.server.weights]
    engine.run_round(round_)
    changed = [
        {k for k, v in s.items() if not torch.equal(v, b[k])}
        for s, b in zip(engine.server.weights, before, strict=True)
    ]
    assert changed[0] == {
        f"layer3.0.{n}" for n in ("conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var")
    }
    assert changed[1] == {k.replace("layer3.0", "layer3.1") for k in changed[0]}


def test_resumed_engine_equals_uninterrupted(data):
    args = {"order": "random", "warmup": 1, "rounds_per_group": 1}
    straight = _run(_engine(data, "FedPart", method_args=args), 4)
    first = _run(_engine(data, "FedPart", method_args=args), 2)
    resumed = _engine(data, "FedPart", method_args=args)
    resumed.load_state_dict(first.state_dict())
    for t in Round.upto(4)[2:]:
        resumed.observe(resumed.run_round(t))
    assert _same_states(straight, resumed) and straight.server.costs.rows == resumed.server.costs.rows


def test_fedpart_on_vits_is_refused_when_the_config_is_validated():
    from incofl.config import ConfigError, validate_experiment

    with pytest.raises(ConfigError, match="models: FedPart's layer groups are defined for ResNets"):
        validate_experiment({"methods": ["FedPart"], "models": ["vit_d8", "vit_d9"]})
