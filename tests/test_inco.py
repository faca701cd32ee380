"""InCo against its closed forms (docs/methods.md) and Theorem 3.1's convex problem."""

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from incofl.fl.methods.inco.step import cross_layer_update, find_pairs
from incofl.models.family import build_model

EPS = 1e-7


def official_reference(T: np.ndarray, R: np.ndarray, normalize=True, optimize=True, clamp_max=5.0, clip=0.1):
    """The authors' per-kernel-slice rule, written out slice by slice in float64."""
    out = np.empty_like(T)
    for o in range(T.shape[0]):
        for i in range(T.shape[1]):
            t, r = T[o, i].ravel(), R[o, i].ravel()
            alpha, beta = r @ r, r @ t
            c = min(max(abs(beta) / (alpha + EPS), 0.0), clamp_max) if optimize else 1.0
            if normalize:
                tn, rn = np.linalg.norm(t), np.linalg.norm(r)
                v = (t / (tn + EPS) + c * r / (rn + EPS)) * (tn + rn) / 2
            else:
                v = t + c * r
            out[o, i] = np.clip(v, -clip, clip).reshape(T.shape[2:])
    return out


def paper_reference(T: np.ndarray, R: np.ndarray, mode="always", normalize=True, optimize=True):
    t, r = T.ravel(), R.ravel()
    if normalize:
        tn, rn = np.linalg.norm(t), np.linalg.norm(r)
        t, r, s = t / (tn + EPS), r / (rn + EPS), (tn + rn) / 2
    else:
        s = 1.0
    c = -(r @ t) / (r @ r + EPS) if optimize else 1.0
    if mode == "projection" and optimize:
        c = max(0.0, c)
    return ((t + c * r) * s).reshape(T.shape)


def _pair(seed: int, shape=(4, 3, 3, 3), scale=0.05):
    g = np.random.default_rng(seed)
    return g.normal(0, scale, shape), g.normal(0, scale, shape)


def _run(T, R, **kw):
    update = {"T": torch.tensor(T, dtype=torch.float64), "R": torch.tensor(R, dtype=torch.float64)}
    out = cross_layer_update(update, {"T": "R"}, **kw)
    assert torch.equal(out["R"], update["R"]), "the reference must not change"
    return out["T"].numpy()


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("normalize,optimize", [(True, True), (False, True), (True, False), (False, False)])
def test_official_equals_per_slice_closed_form(seed, normalize, optimize):
    T, R = _pair(seed)
    got = _run(T, R, normalize=normalize, optimize=optimize)
    np.testing.assert_allclose(got, official_reference(T, R, normalize, optimize), rtol=1e-10, atol=1e-12)


def test_official_clips_and_bounds_coefficient():
    T, R = _pair(0, scale=1.0)
    R[0, 0] *= 1e-3  # tiny reference slice: |beta|/alpha is huge and must be clamped to 5
    stats = {}
    out = cross_layer_update({"T": torch.tensor(T), "R": torch.tensor(R)}, {"T": "R"}, stats=stats)
    assert out["T"].abs().max() <= 0.1 + 1e-12
    np.testing.assert_allclose(out["T"].numpy(), official_reference(T, R), atol=1e-12)
    assert 0 <= stats["T"]["theta"] <= 5 and 0 <= stats["T"]["beta_pos"] <= 1


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("mode", ["always", "projection"])
@pytest.mark.parametrize("normalize,optimize", [(True, True), (False, True), (True, False), (False, False)])
def test_paper_equals_whole_tensor_closed_form(seed, mode, normalize, optimize):
    T, R = _pair(seed)
    got = _run(T, R, variant="paper", mode=mode, normalize=normalize, optimize=optimize)
    np.testing.assert_allclose(got, paper_reference(T, R, mode, normalize, optimize), rtol=1e-10, atol=1e-12)


def test_paper_always_removes_the_component_along_the_reference():
    T, R = _pair(3)
    got = _run(T, R, variant="paper")
    r = R.ravel() / np.linalg.norm(R)
    assert abs(got.ravel() @ r) < 1e-9


def test_without_both_switches_is_T_plus_R():
    T, R = _pair(4)
    np.testing.assert_allclose(_run(T, R, variant="paper", normalize=False, optimize=False), T + R, atol=1e-15)


@pytest.mark.parametrize("seed", range(6))
def test_projection_solves_theorem_3_1(seed):
    """min |t - g|^2 s.t. <g, r> >= 0 on the normalised vectors, solved numerically."""
    T, R = _pair(seed, shape=(2, 1, 3, 3))
    if seed % 2:  # make sure both the active and the inactive constraint are covered
        T = -T - 2 * R
    t, r = T.ravel(), R.ravel()
    tn, rn = np.linalg.norm(t), np.linalg.norm(r)
    tu, ru = t / (tn + EPS), r / (rn + EPS)
    res = minimize(
        lambda g: np.sum((tu - g) ** 2),
        x0=np.zeros_like(tu),
        jac=lambda g: -2 * (tu - g),
        constraints=[{"type": "ineq", "fun": lambda g: g @ ru, "jac": lambda g: ru}],
        method="SLSQP",
        options={"ftol": 1e-14, "maxiter": 500},
    )
    expected = res.x * (tn + rn) / 2
    got = _run(T, R, variant="paper", mode="projection").ravel()
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_targets_read_the_unmodified_update():
    """No chaining: a target that is also a later target's reference would still read the original."""
    g = torch.Generator().manual_seed(0)
    up = {n: torch.randn(4, 4, 3, 3, generator=g) for n in ("R", "A", "B")}
    both = cross_layer_update(up, {"A": "R", "B": "A"})
    only_b = cross_layer_update(up, {"B": "A"})
    assert torch.equal(both["B"], only_b["B"])
    assert set(both) == set(up) and torch.equal(both["R"], up["R"])


def test_missing_target_is_skipped():
    up = {"R": torch.ones(2, 2, 3, 3)}
    assert cross_layer_update(up, {"T": "R"}).keys() == {"R"}


def test_find_pairs_resnet26_has_exactly_the_16_targets():
    names = build_model("resnet26", 10, 3).state_dict().keys()
    pairs = find_pairs(names)
    expected = {
        f"layer{s}.{b}.conv{c}.weight": f"layer{s}.0.conv2.weight" for s in range(1, 5) for b in (1, 2) for c in (1, 2)
    }
    assert pairs == expected


def test_find_pairs_resnet10_has_none_and_vit_pairs_the_norms():
    assert find_pairs(build_model("resnet10", 10, 3).state_dict()) == {}
    names = [f"blocks.{i}.norm{j}.{p}" for i in range(3) for j in (1, 2) for p in ("weight", "bias")]
    assert find_pairs(names) == {f"blocks.{i}.norm2.weight": f"blocks.{i}.norm1.weight" for i in range(3)}
