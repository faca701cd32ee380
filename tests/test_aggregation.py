"""Server rules: heteroavg = mean over holders, groupwise = per-group mean, w <- w + g."""

import torch

from incofl.config import RunConfig
from incofl.fl.contracts import ClientUpdate, Round, RoundContext, Setup
from incofl.fl.stages.aggregate import GroupWise, Shared, apply_update, mean_over_holders
from incofl.params import AggregationParams
from incofl.sides import ServerSettings

SETUP = Setup(ServerSettings.of(RunConfig()), [])


def _updates():
    g = torch.Generator().manual_seed(0)
    small = ["a", "b"]
    big = ["a", "b", "c"]  # "c" only in the larger model
    spec = [(0, 0, small, 10), (1, 0, small, 30), (2, 1, big, 20), (3, 1, big, 40)]
    return [
        ClientUpdate(cid, grp, {n: torch.randn(3, generator=g) for n in names}, n_i, 5) for cid, grp, names, n_i in spec
    ]


def test_heteroavg_is_mean_over_holders():
    ups = _updates()
    avg = mean_over_holders(ups)
    for name in ("a", "b"):
        assert torch.allclose(avg[name], torch.stack([u.delta[name] for u in ups]).mean(0))
    assert torch.allclose(avg["c"], (ups[2].delta["c"] + ups[3].delta["c"]) / 2)


def test_heteroavg_weighted_by_samples():
    ups = _updates()
    avg = mean_over_holders(ups, weighted=True)
    expected = sum(u.num_samples * u.delta["a"] for u in ups) / sum(u.num_samples for u in ups)
    assert torch.allclose(avg["a"], expected)
    assert torch.allclose(avg["c"], (20 * ups[2].delta["c"] + 40 * ups[3].delta["c"]) / 60)


def test_heteroavg_leaves_client_updates_untouched():
    ups = _updates()
    before = [{k: v.clone() for k, v in u.delta.items()} for u in ups]
    mean_over_holders(ups)
    mean_over_holders(ups, weighted=True)
    for u, b in zip(ups, before, strict=True):
        assert all(torch.equal(u.delta[k], b[k]) for k in b)


def test_groupwise_is_per_group_mean():
    ups = _updates()
    out = GroupWise(AggregationParams(), SETUP).aggregate(ups)
    assert set(out) == {0, 1}
    assert torch.allclose(out[0]["a"], (ups[0].delta["a"] + ups[1].delta["a"]) / 2)
    assert torch.allclose(out[1]["c"], (ups[2].delta["c"] + ups[3].delta["c"]) / 2)
    assert "c" not in out[0]
    assert Shared.federation(1) == 0 and GroupWise.federation(1) == 1


def test_apply_update_adds_and_clamps_running_var():
    state = {"w": torch.ones(3), "bn.running_var": torch.full((3,), 0.1)}
    apply_update(state, {"w": torch.tensor([1.0, -1.0, 0.5]), "bn.running_var": torch.tensor([-1.0, 0.1, 0.0])})
    assert torch.equal(state["w"], torch.tensor([2.0, 0.0, 1.5]))
    assert torch.equal(state["bn.running_var"], torch.tensor([0.0, 0.2, 0.1]))


def test_official_inco_divides_vit_updates_by_local_epochs():
    """The authors' ViT path: client deltas / E before averaging, then InCo; ResNets untouched."""
    from incofl.config import RunConfig
    from incofl.fl.methods.inco.step import InCoStep, cross_layer_update
    from incofl.registry import METHODS

    g = torch.Generator().manual_seed(1)
    vit = {"blocks.0.norm1.weight": torch.randn(8, generator=g), "blocks.0.norm2.weight": torch.randn(8, generator=g)}
    ups = [ClientUpdate(i, 0, {k: v * (i + 1) for k, v in vit.items()}, 10, 3) for i in range(2)]
    pairs = {"blocks.0.norm2.weight": "blocks.0.norm1.weight"}
    setup = Setup(ServerSettings.of(RunConfig(local_epochs=4)), list(vit))
    hp, paper = METHODS["InCoAvg"].parse_args({}), METHODS["InCoAvg-paper"].parse_args({})
    got = InCoStep(hp, setup)(mean_over_holders(ups), RoundContext(Round(1), 0, len(ups), 0))
    expected = cross_layer_update({k: v * 1.5 / 4 for k, v in vit.items()}, pairs)
    assert all(torch.allclose(got[k], expected[k]) for k in vit)
    assert InCoStep(paper, setup).scale == 1.0
    resnet = ["layer1.1.conv1.weight", "layer1.0.conv2.weight"]
    assert InCoStep(hp, Setup(ServerSettings.of(RunConfig(local_epochs=4)), resnet)).scale == 1.0
