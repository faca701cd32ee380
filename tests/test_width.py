"""Width and depth splitting (docs/methods.md, hetero splitting): index maps, per-element aggregation, the
slice-aware InCo step, and the six methods end to end on tiny data."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers import engine_on, learned, seen, small_synthetic

from incofl.config import RunConfig
from incofl.fl.contracts import Round, View
from incofl.fl.methods.inco.step import cross_layer_update, find_pairs
from incofl.fl.methods.width.aggregate import RolexMean, SlicedMean
from incofl.fl.methods.width.levels import Widths
from incofl.fl.methods.width.slicing import extract, index_map, scatter_add, sliced_mean, take, window
from incofl.fl.methods.width.spec import RolexParams
from incofl.models.family import build_model

WIDTH = {
    "models": ["preresnet18"],
    "model_scale": 0.25,  # a quarter of the channels: the slicing, rolling and averaging are the same at any scale
    "clients": 4,
    "ratio": 1.0,
    "rounds": 1,
    "batch_size": 16,
    "optimizer": "sgd",
    "lr": 0.05,
    "partition": "iid",
    "eval_last": 0,
}


def test_window_is_leading_channels_at_offset_zero_and_rolls_by_one_a_round():
    assert window(8, 8, 5) is None  # an uncut dimension: every channel, in order
    assert window(8, 3, 0).tolist() == [0, 1, 2]  # HeteroFL; FedRolex's first round
    assert window(8, 3, 1).tolist() == [7, 0, 1]  # {(j - t) mod C : j < c}
    assert window(8, 3, 6).tolist() == [2, 3, 4]
    assert window(8, 3, 8).tolist() == window(8, 3, 0).tolist()


def test_index_maps_cut_channels_and_never_image_channels_or_classes():
    full, half = build_model("preresnet18", 10, 3), build_model("preresnet18", 10, 3, rate=0.5)
    shapes = lambda m: {k: v.shape for k, v in m.state_dict().items()}  # noqa: E731
    index = index_map(shapes(full), shapes(half), offset=3)
    assert index["conv1.weight"][1] is None and index["conv1.weight"][0].tolist() == window(64, 32, 3).tolist()
    assert index["fc.weight"][0] is None and index["fc.weight"][1].tolist() == window(512, 256, 3).tolist()
    # a layer's output channels and the next layer's input channels are the same global channels
    assert torch.equal(index["layer1.0.conv1.weight"][0], index["layer1.0.conv2.weight"][1])
    with pytest.raises(ValueError, match="cannot be cut"):
        index_map(shapes(half), shapes(full))
    with pytest.raises(ValueError, match="not a block"):
        index_map(shapes(half), {"conv1.weight": torch.Size([32, 3, 3])})


def test_extract_then_write_back_is_the_identity_and_rate_one_is_the_full_model():
    full = build_model("preresnet18", 10, 3).state_dict()
    shapes = {k: v.shape for k, v in full.items()}
    whole = index_map(shapes, shapes, offset=7)
    assert all(ix is None for index in whole.values() for ix in index)
    assert all(torch.equal(a, full[k]) for k, a in extract(full, whole).items())
    quarter = {k: v.shape for k, v in build_model("preresnet18", 10, 3, rate=0.25).state_dict().items()}
    index = index_map(shapes, quarter, offset=5)
    block = extract(full, index)
    back = {k: torch.zeros_like(v) for k, v in full.items()}
    for name, b in block.items():
        scatter_add(back[name], index[name], b)
    mask = {k: torch.zeros_like(v) for k, v in full.items()}
    for name, b in block.items():
        scatter_add(mask[name], index[name], torch.ones_like(b))
    for name in full:
        assert torch.equal(back[name], full[name] * mask[name])  # every covered element back in its place
        assert mask[name].sum() == block[name].numel()  # each exactly once


def test_per_element_mean_over_overlapping_slices_by_hand():
    shapes = {"w": torch.Size([4, 2]), "fc.weight": torch.Size([3, 4])}
    a = {"w": (window(4, 2, 0), None), "fc.weight": (None, window(4, 2, 0))}  # rows 0-1 of w
    b = {"w": (window(4, 2, 1), None), "fc.weight": (None, window(4, 2, 1))}  # rows 3, 0
    da = {"w": torch.full((2, 2), 1.0), "fc.weight": torch.full((3, 2), 1.0)}
    db = {"w": torch.full((2, 2), 3.0), "fc.weight": torch.full((3, 2), 3.0)}
    mean, covered = sliced_mean(shapes, [(da, a), (db, b)])
    assert mean["w"][:, 0].tolist() == [2.0, 1.0, 0.0, 3.0]  # row 0 both, 1 only a, 2 nobody, 3 only b
    assert covered["w"][:, 1].tolist() == [True, True, False, True]
    # classifier rows only from clients that hold the class: a holds classes {0, 2}, b {2}
    rows = [({"fc.weight"}, torch.tensor([0, 2])), ({"fc.weight"}, torch.tensor([2]))]
    mean, covered = sliced_mean(shapes, [(da, a), (db, b)], rows)
    assert mean["fc.weight"][:, 0].tolist() == [1.0, 0.0, 2.0]  # column 0: both clients' window
    assert mean["fc.weight"][:, 3].tolist() == [0.0, 0.0, 3.0]  # column 3: b's only
    assert not covered["fc.weight"][1].any()  # class 1: nobody's
    assert mean["w"][:, 0].tolist() == [2.0, 1.0, 0.0, 3.0]  # other entries as before


def _update(shapes: dict[str, torch.Size], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=gen) * 1e-2 for k, s in shapes.items()}


def test_inco_on_slices_held_everywhere_is_the_depth_step_and_leaves_uncovered_slices():
    shapes = {k: v.shape for k, v in build_model("preresnet18", 10, 3).state_dict().items()}
    update, pairs = _update(shapes, 0), find_pairs(shapes)
    assert "layer2.1.conv1.weight" in pairs and pairs["layer2.1.conv1.weight"] == "layer2.0.conv2.weight"
    everywhere = {k: torch.ones(s, dtype=torch.bool) for k, s in shapes.items()}
    for variant in ("official", "paper"):
        plain = cross_layer_update(update, pairs, variant=variant)
        covered = cross_layer_update(update, pairs, variant=variant, covered=everywhere)
        assert all(torch.equal(plain[k], covered[k]) for k in plain)
    # the reference covered on half of its output channels: the target changes only there
    half = dict(everywhere)
    half["layer2.0.conv2.weight"] = everywhere["layer2.0.conv2.weight"].clone()
    half["layer2.0.conv2.weight"][64:] = False
    stats: dict = {}
    out = cross_layer_update(update, pairs, covered=half, stats=stats)
    target = "layer2.1.conv1.weight"
    assert torch.equal(out[target][64:], update[target][64:])
    masked = {k: v.clone() for k, v in update.items()}
    masked[target][64:], masked["layer2.0.conv2.weight"][64:] = 0, 0
    assert torch.equal(out[target][:64], cross_layer_update(masked, pairs)[target][:64])
    assert 0 < stats[target]["beta_pos"] < 1


def test_level_costs_follow_the_width():
    full = build_model("preresnet18", 10, 3)
    levels = [build_model("preresnet18", 10, 3, rate=r) for r in (1.0, 0.5, 0.25)]
    costs = Widths(full, levels, 32).costs
    assert costs[0] == pytest.approx(1.0) and 0.2 < costs[1] < 0.3 and 0.05 < costs[2] < 0.08  # ~ rate^2


@pytest.fixture(scope="module")
def data():
    return small_synthetic(64, 32)


def _run(data, method: str, **settings):
    engine = engine_on(data, method=method, **{**WIDTH, **settings})
    engine.run_round(Round(1))
    return engine


@pytest.mark.slow
def test_fedrolex_first_round_is_heterofl_and_rolls_after_it(data):
    rates = {"width_rates": [1.0, 0.5]}
    hetero, rolex = _run(data, "HeteroFL", **rates), _run(data, "FedRolex", **rates)
    assert hetero.fingerprint() == rolex.fingerprint()  # offset 0: leading channels
    # conv1's 64 channels at a quarter scale: 16, 8 at rate 0.5
    assert rolex.server.planner.plan(Round(2), 3).view.index["conv1.weight"][0].tolist() == window(16, 8, 1).tolist()
    assert hetero.server.planner.plan(Round(2), 3).view.index["conv1.weight"][0].tolist() == window(16, 8, 0).tolist()
    assert rolex.server.planner.plan(Round(2), 0).view.index["conv1.weight"][0] is None  # rate 1: the full model


@pytest.mark.slow
@pytest.mark.parametrize("method", ["HeteroFL", "FedRolex", "InCoHeteroFL", "InCoRolex"])
def test_width_methods_train_and_report_every_level(data, method):
    settings = {"width_rates": [1.0, 0.5], "rate_assignment": "dynamic", "static_bn_samples": 32}
    row = learned(engine_on(seen(data, n_test=32), method=method, **{**WIDTH, **settings}))
    assert {"mean_acc", "acc_g0", "acc_g1"} <= set(row) and 0 <= row["mean_acc"] <= 100


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ScaleFL", "InCoScaleFL"])
def test_scalefl_reports_every_exit(data, method):
    settings = {"models": ["resnet110"], "width_rates": [0.5, 1.0], "exits": [1, 4]}
    row = learned(engine_on(seen(data, n_test=32), method=method, **{**WIDTH, **settings}))
    assert {f"acc_exit{j}" for j in range(1, 5)} <= set(row) and "acc_exits_mean" in row
    assert row["mean_acc"] == row["acc_exit4"]  # the headline: the global model's last exit
    assert row["acc_exits_mean"] == pytest.approx(sum(row[f"acc_exit{j}"] for j in range(1, 5)) / 4)


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"width_rates": [0.0, 1.0]}, "width_rates"),
        ({"width_rates": [1.5]}, "width_rates"),
        ({"width_rates": [1.0] * 5}, "width_rates"),
        ({"rate_assignment": "random"}, "rate_assignment"),
        ({"models": ["resnet18"]}, "models"),
        ({"models": ["resnet110"]}, "models"),  # HeteroFL has no early exits
        ({"exits": [1, 2]}, "exits"),
    ],
)
def test_bad_width_settings_are_refused_naming_the_key(settings, key):
    with pytest.raises(ValueError, match=key):
        RunConfig(**{**WIDTH, "method": "HeteroFL", **settings})


def test_whole_model_methods_refuse_cut_levels():
    with pytest.raises(ValueError, match="width_rates"):
        RunConfig(**{**WIDTH, "method": "FedAvg", "width_rates": [1.0, 0.5]})
    RunConfig(**{**WIDTH, "method": "FedAvg", "width_rates": [1.0]})  # uncut: a plain model


@pytest.mark.slow
def test_a_resumed_dynamic_rolling_run_equals_an_uninterrupted_one(data):
    settings = {**WIDTH, "method": "InCoRolex", "width_rates": [1.0, 0.5], "rate_assignment": "dynamic", "rounds": 2}
    straight = engine_on(data, **settings)
    straight.run_round(Round(1))
    straight.run_round(Round(2))
    first = engine_on(data, **settings)
    first.run_round(Round(1))
    resumed = engine_on(data, **settings)
    resumed.load_state_dict(first.state_dict())
    resumed.run_round(Round(2))
    assert resumed.fingerprint() == straight.fingerprint()
    assert straight.server.planner.plan(Round(2), 0).group in (0, 1)


@pytest.mark.slow
def test_full_width_inco_heterofl_without_mask_and_clip_is_inco_avg_bit_for_bit(data):
    """Every client at rate 1: the width machinery (views, per-element mean, covered masks) must
    reduce to the depth path (HeteroAvg's mean over holders, the plain InCo step)."""
    plain = {"mask_classes": False, "class_rows": False, "grad_clip": 1e9}
    settings = {**WIDTH, "width_rates": [1.0], "rounds": 2}
    width = engine_on(data, method="InCoHeteroFL", method_args=plain, **settings)
    depth = engine_on(data, method="InCoAvg", **settings)
    for engine in (width, depth):
        engine.run_round(Round(1))
        engine.run_round(Round(2))
    assert width.fingerprint() == depth.fingerprint()


# --- FedRolex's aggregation as released (docs/fedrolex-weighting.md) ----------------------------

_ENTRIES = {"conv1.weight": (4, 2), "bn.weight": (4,), "fc.weight": (3, 4), "fc.bias": (3,)}  # conv first, as both
_CHANNELS = {"A": None, "B": torch.tensor([0, 1]), "C": torch.tensor([1, 2])}  # full; a half; that half rolled
_CLASSES = {"A": [0, 1, 2], "B": [0, 2], "C": [0]}


def _index(name: str, ch: torch.Tensor | None) -> tuple:
    """A client's block of an entry: its channels, on the rows or columns they cut."""
    return {"conv1.weight": (ch, None), "bn.weight": (ch,), "fc.weight": (None, ch), "fc.bias": (None,)}[name]


def _positions(name: str, client: str) -> tuple[torch.Tensor, ...]:
    """The global positions a client updates in an entry (classifier: only its classes' rows)."""
    index = list(_index(name, _CHANNELS[client]))
    if name.startswith("fc"):
        index[0] = torch.tensor(_CLASSES[client])
    full = [torch.arange(n) if ix is None else ix for ix, n in zip(index, _ENTRIES[name], strict=True)]
    return torch.meshgrid(*full, indexing="ij")


def _release_round(params: dict, counts: dict, trained: dict) -> None:
    """The release's server step (FedRolex's `combine`) restated by hand, on parameters, in
    place: per entry, per client in order, a convolution weight adds its values with weight 1,
    any other entry with the counts it reads, and each element it holds counts once more; the
    first entry reads the round's starting counts, the later ones the counts being raised."""
    raised = {k: c.clone() for k, c in counts.items()}
    reading = counts
    for name, v in params.items():
        total, weights = torch.zeros_like(v), torch.zeros_like(v)
        for client, local in trained.items():
            pos = _positions(name, client)
            value = local[name][_CLASSES[client]] if name.startswith("fc") else local[name]
            w = 1.0 if name == "conv1.weight" else reading[name][pos]
            total[pos] += w * value
            weights[pos] += w
            raised[name][pos] += 1
        covered = weights > 0
        v[covered] = total[covered] / weights[covered]
        reading = raised
    counts.update(raised)


def _train(params: dict, gen: torch.Generator) -> dict:
    """Each client's trained block of every entry (rows never cut): its start plus a random step."""
    starts = {c: {k: take(v, _index(k, ch)) for k, v in params.items()} for c, ch in _CHANNELS.items()}
    return {c: {k: b + torch.randn(b.shape, generator=gen) for k, b in blocks.items()} for c, blocks in starts.items()}


def _updates(params: dict, trained: dict) -> list:
    return [
        SimpleNamespace(
            delta={k: t - take(params[k], _index(k, _CHANNELS[c])) for k, t in trained[c].items()},
            view=View(0, {k: _index(k, _CHANNELS[c]) for k in _ENTRIES}),
            classes=torch.tensor(_CLASSES[c]),
        )
        for c in _CHANNELS
    ]


def _rolex(weighting: str) -> tuple[RolexMean, SlicedMean]:
    shapes = {k: torch.Size(s) for k, s in _ENTRIES.items()}
    setup = SimpleNamespace(layout=SimpleNamespace(widths=SimpleNamespace(shapes=shapes)))
    return RolexMean(RolexParams(weighting=weighting), setup), SlicedMean(RolexParams(), setup)


def test_released_weighting_is_the_release_arithmetic_over_two_rounds():
    gen = torch.Generator().manual_seed(0)
    ours = {k: torch.randn(s, generator=gen) for k, s in _ENTRIES.items()}
    theirs, counts = {k: v.clone() for k, v in ours.items()}, {k: torch.ones(s) for k, s in _ENTRIES.items()}
    rolex, _ = _rolex("released")
    for round_ in range(2):
        trained = _train(ours, gen)
        mean = rolex.aggregate(_updates(ours, trained))[0]
        ours = {k: v + mean[k] for k, v in ours.items()}
        _release_round(theirs, counts, trained)
        assert all(torch.allclose(ours[k], theirs[k], atol=1e-6) for k in _ENTRIES)
        if round_ == 0:  # by hand: BN channel 0 covered by A (weight 1), then by B (1 + A's hold)
            a, b = (trained[c]["bn.weight"][0].item() for c in "AB")
            assert ours["bn.weight"][0].item() == pytest.approx((a + 2 * b) / 3)
    assert rolex.times["bn.weight"].tolist() == [5.0, 7.0, 5.0, 3.0]  # 1 + its holders in each of two rounds
    assert rolex.times["fc.bias"].tolist() == [7.0, 3.0, 5.0]  # class 0: A, B and C; 1: A; 2: A and B
    assert "conv1.weight" not in rolex.times  # convolution weights: unweighted, no counts kept


def test_mean_weighting_is_the_unweighted_sliced_mean_bit_for_bit():
    gen = torch.Generator().manual_seed(1)
    params = {k: torch.randn(s, generator=gen) for k, s in _ENTRIES.items()}
    updates = _updates(params, _train(params, gen))
    rolex, plain = _rolex("mean")
    folds = rolex.fold(), plain.fold()
    for fold in folds:
        for update in updates:
            fold.add(update)
    ours, theirs = (fold.averages()[0] for fold in folds)
    covered, also = (fold.covered[0] for fold in folds)
    assert all(torch.equal(ours[k], theirs[k]) and torch.equal(covered[k], also[k]) for k in _ENTRIES)
    assert rolex.state_dict() == {"times": {}}


def test_fedrolex_weighting_is_checked_when_the_config_is():
    with pytest.raises(
        ValueError, match=r"method_args.weighting: Input should be 'mean' or 'released' \(got 'count'\)"
    ):
        RunConfig(**{**WIDTH, "method": "FedRolex", "width_rates": [1.0, 0.5], "method_args": {"weighting": "count"}})
    with pytest.raises(ValueError, match="method_args.weighting: not a parameter of HeteroFL"):
        RunConfig(**{**WIDTH, "method": "HeteroFL", "width_rates": [1.0, 0.5], "method_args": {"weighting": "mean"}})


@pytest.mark.slow
def test_a_resumed_released_fedrolex_run_equals_an_uninterrupted_one(data):
    settings = {
        **WIDTH,
        "method": "FedRolex",
        "width_rates": [1.0, 0.5],
        "rounds": 2,
        "method_args": {"weighting": "released"},
    }
    straight = engine_on(data, **settings)
    straight.run_round(Round(1))
    straight.run_round(Round(2))
    first = engine_on(data, **settings)
    first.run_round(Round(1))
    resumed = engine_on(data, **settings)
    resumed.load_state_dict(first.state_dict())
    resumed.run_round(Round(2))
    assert resumed.fingerprint() == straight.fingerprint()
    assert resumed.server.aggregator.times["fc.bias"].min() > 1  # the counts came back with the checkpoint
    mean = engine_on(data, **{**settings, "method_args": {}})
    mean.run_round(Round(1))
    mean.run_round(Round(2))
    assert mean.fingerprint() != straight.fingerprint()
