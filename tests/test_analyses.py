"""The analyses as observers (fl/stages/probes.py, fl/stages/similarity.py, UpdateNoise): CKA's
defining properties, the trained models the probes see, histograms that account for every
weight, t-SNE rows, noise statistics, that analyses never change training, and resume."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from helpers import QUIET, engine_on, small_synthetic

from incofl.config import ConfigError, RunConfig
from incofl.fl.contracts import ClientUpdate, Round, Setup
from incofl.fl.engine.run import Run
from incofl.fl.stages.similarity import cka, cosine, gram
from incofl.fl.stages.transforms import UpdateNoise
from incofl.sides import ServerSettings

SMALL = {
    "clients": 4,
    "ratio": 1.0,
    "models": ["resnet10", "resnet14"],
    "model_scale": 0.25,  # a quarter of the channels: no analysis here depends on width
    "rounds": 2,
    "batch_size": 16,
    "eval_every": 2,
    "eval_last": 0,
}
ALL = {
    "cka_rounds": [1, 2],
    "gradient_rounds": [2],
    "tsne_rounds": [2],
    "probe_samples": 16,
    "tsne_groups": [0, 1],
    "tsne_classes": [0, 1],
    "tsne_per_class": 4,
}


@pytest.fixture(scope="module")
def data():
    return small_synthetic(64, n_test=64)


def _features(n: int, p: int, seed: int) -> torch.Tensor:
    return torch.randn(n, p, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# --- CKA ----------------------------------------------------------------------------------
def test_cka_of_a_representation_with_itself_is_one():
    x = _features(50, 20, 0)
    assert cka(gram(x), gram(x)) == pytest.approx(1.0)
    assert cka(gram(x), gram(x), debiased=True) == pytest.approx(1.0)


@pytest.mark.parametrize("debiased", [False, True])
def test_cka_is_invariant_to_orthogonal_maps_and_isotropic_scaling(debiased):
    x, y = _features(40, 12, 1), _features(40, 8, 2)
    y = y + 0.5 * x[:, :8]  # related, so CKA is well inside (0, 1)
    q, _ = torch.linalg.qr(_features(12, 12, 3))
    base = cka(gram(x), gram(y), debiased)
    assert 0.05 < abs(base) < 0.95
    assert cka(gram(3.7 * x @ q), gram(y), debiased) == pytest.approx(base, rel=1e-9)


def test_linear_cka_equals_its_feature_space_form():
    """||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F) (Kornblith et al., eq. 5), on centred features."""
    x, y = _features(30, 10, 4), _features(30, 6, 5) + _features(30, 10, 4)[:, :6]
    xc, yc = x - x.mean(0), y - y.mean(0)
    expected = (yc.T @ xc).norm() ** 2 / ((xc.T @ xc).norm() * (yc.T @ yc).norm())
    assert cka(gram(x), gram(y)) == pytest.approx(float(expected), rel=1e-9)


def test_debiased_cka_removes_the_bias_of_wide_independent_features():
    """Independent random features, far wider than the batch: biased CKA is large, debiased ~0."""
    x, y = _features(32, 2000, 6), _features(32, 2000, 7)
    assert cka(gram(x), gram(y)) > 0.8
    assert abs(cka(gram(x), gram(y), debiased=True)) < 0.05


def test_cosine():
    assert cosine(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0])) == pytest.approx(1 / math.sqrt(2))
    assert math.isnan(cosine(torch.zeros(3), torch.ones(3)))


# --- the engine's probes --------------------------------------------------------------------
@pytest.mark.slow
def test_probes_see_each_client_as_it_trained(data):
    """FedAvg with one client per model group: each group's new global model is its one
    client's trained model, so the state a probe sees must equal it exactly."""
    engine = engine_on(data, method="FedAvg", **{**SMALL, "clients": 2, "analyses": {"cka_rounds": [1]}})
    seen = []
    engine.server.observers[-1].see_clients = lambda round_, trained: seen.extend(trained)
    engine.run_round(Round(1))
    assert [t.client for t in seen] == [0, 1]
    for t in seen:
        for name, value in engine.server.sub_state(t.group).items():
            assert torch.equal(t.state[name], value), name


def test_cka_rows_cover_every_pair_and_shared_probe_point(data):
    engine = engine_on(data, method="HeteroAvg", **{**SMALL, "analyses": {"cka_rounds": [1], "probe_samples": 16}})
    report = engine.run_round(Round(1))
    engine.observe(report)
    rows = pd.DataFrame(engine.server.observers[-1].rows)
    probe = engine.server.observers[-1]
    assert len(rows.groupby(["client_a", "client_b"])) == 6  # 4 clients, all pairs, none with itself
    for _, pair in rows.groupby(["client_a", "client_b"]):
        shared = [p for p in probe.points[pair.group_a.iloc[0]] if p in probe.points[pair.group_b.iloc[0]]]
        assert list(pair.layer) == shared
    assert rows.cka.between(0, 1 + 1e-9).all()
    resnet10 = rows[(rows.group_a == 0) & (rows.group_b == 0)]
    assert set(resnet10.layer) == {
        "layer1",
        "layer1.0",
        "layer2",
        "layer2.0",
        "layer3",
        "layer3.0",
        "layer4",
        "layer4.0",
    }


@pytest.mark.slow
def test_update_histograms_count_every_weight_and_show_the_inco_step(data):
    counts = {}
    for method in ("HeteroAvg", "InCoAvg"):
        engine = engine_on(data, method=method, **{**SMALL, "analyses": {"gradient_rounds": [1]}})
        engine.run_round(Round(1))
        rows = pd.DataFrame(engine.server.observers[-1].rows)
        server = engine.server.server_model.state_dict()
        sums = rows.groupby(["layer", "which"])["count"].sum()
        for (layer, _), total in sums.items():
            assert total == server[layer].numel()
        assert {k for k, v in server.items() if v.dim() > 1} == set(rows.layer)
        counts[method] = rows.pivot_table(index=["layer", "bin_left"], columns="which", values="count")
    plain = counts["HeteroAvg"]
    assert (plain.aggregated == plain.applied).all()  # no server transform
    inco = counts["InCoAvg"]
    changed = {layer for layer, _ in inco.index[inco.aggregated != inco.applied]}
    assert changed and all(".conv" in layer and not layer.endswith(".0.conv1.weight") for layer in changed)


def test_tsne_rows_one_client_per_listed_group(data):
    engine = engine_on(data, method="HeteroAvg", **{**SMALL, "analyses": {**ALL, "cka_rounds": [], "tsne_rounds": [1]}})
    report = engine.run_round(Round(1))
    rows = pd.DataFrame(engine.server.observers[-1].rows)
    labels = data.y_test
    per_class = [min(4, int((labels == c).sum())) for c in (0, 1)]
    assert list(rows.groupby("client").size()) == [sum(per_class)] * 2
    assert list(rows.drop_duplicates("client").group) == [0, 1]
    assert set(rows.label) == {0, 1}
    assert rows[["x", "y"]].notna().all().all() and report.round == 1


@pytest.mark.slow
def test_analyses_do_not_change_training(data):
    plain = engine_on(data, method="InCoAvg", **SMALL)
    probed = engine_on(data, method="InCoAvg", **{**SMALL, "analyses": ALL})
    for engine in (plain, probed):
        for t in Round.upto(2):
            engine.observe(engine.run_round(t))
    assert plain.fingerprint() == probed.fingerprint()
    assert len(probed.server.observers) == len(plain.server.observers) + 3


@pytest.mark.slow
def test_resumed_analyses_equal_uninterrupted(data, tmp_path):
    cfg = RunConfig(**{**QUIET, **SMALL, "method": "InCoAvg", "rounds": 3, "checkpoint_every": 1, "analyses": ALL})
    for name in ("full", "resumed"):
        (tmp_path / name).mkdir()
    full = Run(cfg, engine_on(data, **cfg.model_dump()), tmp_path / "full")
    full.execute()
    interrupted = engine_on(data, **cfg.model_dump())
    real = interrupted.run_round
    interrupted.run_round = lambda t: (_ for _ in ()).throw(KeyboardInterrupt) if t == Round(3) else real(t)
    with pytest.raises(KeyboardInterrupt):
        Run(cfg, interrupted, tmp_path / "resumed").execute()
    Run(cfg, engine_on(data, **cfg.model_dump()), tmp_path / "resumed").execute()
    for name in ("cka.csv", "update_similarity.csv", "gradients.csv", "tsne.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "full" / name), pd.read_csv(tmp_path / "resumed" / name))


# --- update noise ---------------------------------------------------------------------------
def _noise(scale: float, seed: int = 0) -> UpdateNoise:
    cfg = RunConfig(**{**QUIET, "update_noise": scale, "seed": seed})
    return UpdateNoise(None, Setup(ServerSettings.of(cfg), ["w"]))


def _update(client: int) -> ClientUpdate:
    return ClientUpdate(client, 0, {"w": 2.0 * _features(200, 50, 9).float(), "b": torch.ones(1)}, 10, 1)


def test_update_noise_has_the_std_asked_for_and_is_reproducible():
    first, again, other = _update(0), _update(0), _update(1)
    clean = first.delta["w"].clone()
    _noise(0.5)(Round(4), first)
    _noise(0.5)(Round(4), again)
    _noise(0.5)(Round(4), other)
    added = first.delta["w"] - clean
    assert float(added.std()) == pytest.approx(0.5 * float(clean.std()), rel=0.02)
    assert abs(float(added.mean())) < 0.02
    assert torch.equal(first.delta["w"], again.delta["w"])  # seed, round and client fix it
    assert not torch.equal(first.delta["w"], other.delta["w"])
    assert torch.equal(first.delta["b"], torch.ones(1))  # a one-element tensor has no std


def test_noise_is_off_by_default_and_first_when_on(data):
    assert not any(isinstance(t, UpdateNoise) for t in engine_on(data, method="FedNova", **SMALL).server.pre)
    pre = engine_on(data, method="FedNova", **{**SMALL, "update_noise": 0.1}).server.pre
    assert isinstance(pre[0], UpdateNoise) and len(pre) == 2


# --- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"rounds": 3, "analyses": {"cka_rounds": [4]}}, "analyses.cka_rounds: round 4 is past"),
        ({"analyses": {"tsne_rounds": [1], "tsne_groups": [7]}}, "analyses.tsne_groups: group 7 does not exist"),
        ({"analyses": {"gradient_bins": 1}}, "gradient_bins"),
        ({"update_noise": -1}, "update_noise"),
    ],
)
def test_bad_analysis_settings_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        RunConfig(**{**QUIET, **settings})


def test_cka_on_a_model_without_stages_is_refused(data):
    with pytest.raises(ConfigError, match="analyses.cka_rounds"):
        cnn = {**SMALL, "models": ["cnn20"], "model_scale": 1.0}  # model_scale thins ResNets only
        engine_on(data, method="FedAvg", **cnn, analyses={"cka_rounds": [1]})


# --- studies beside the grid ------------------------------------------------------------------
def test_study_points_and_their_runs():
    from incofl.config import ExperimentConfig
    from incofl.studies import study_points, study_run

    exp = ExperimentConfig(
        datasets=["cifar10"],
        alphas=[0.5],
        methods=["FedAvg", "InCoAvg"],
        batch_size=64,
        robustness={"methods": ["InCoAvg"], "batch_sizes": [16, 64], "noise": [0.0, 0.5]},
        case_study={"families": {"resnet": {"clients": 10}}, "alpha": 1.0},
    )
    points = study_points(exp)
    # (64, no noise) is on both axes but one run
    assert points["robustness"] == [f"cifar10/a0.5/InCoAvg/{p}" for p in ("b16-n0.0", "b64-n0.0", "b64-n0.5")]
    noisy = study_run(exp, "robustness", points["robustness"][-1], 2)
    assert (noisy.method, noisy.batch_size, noisy.update_noise, noisy.seed) == ("InCoAvg", 64, 0.5, 2)
    runs = {p.split("/")[1]: study_run(exp, "case_study", p, 0) for p in points["case_study"]}
    assert list(runs) == ["resnet-iid-homo", "resnet-iid-hetero", "resnet-noniid-homo", "resnet-noniid-hetero"]
    assert runs["resnet-iid-homo"].models == ["resnet26"] and runs["resnet-iid-homo"].partition == "iid"
    assert runs["resnet-noniid-hetero"].models == ["resnet10", "resnet14", "resnet18", "resnet22", "resnet26"]
    assert runs["resnet-noniid-hetero"].partition == "dirichlet" and runs["resnet-noniid-hetero"].alpha == 1.0
    assert {r.clients for r in runs.values()} == {10} and {r.method for r in runs.values()} == {"HeteroAvg"}


@pytest.mark.parametrize(
    ("study", "message"),
    [
        ({"robustness": {"methods": ["Nope"]}}, "robustness.methods: unknown method 'Nope'"),
        ({"robustness": {"batch_sizes": [1]}}, "robustness.batch_sizes.0"),
        ({"case_study": {"families": {"resnet": {"clients": 3}}}}, r"case_study \(digits/resnet-iid-hetero\): clients"),
    ],
)
def test_bad_studies_are_refused(study, message):
    from incofl.config import ExperimentConfig

    with pytest.raises(ValueError, match=message):
        ExperimentConfig(**study)
