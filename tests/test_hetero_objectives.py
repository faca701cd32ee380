"""The local objectives of the width and depth splitting methods: HeteroFL's and FedRolex's masked
cross-entropy with gradient clipping, ScaleFL's early-exit loss with self-distillation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from incofl.config import RunConfig
from incofl.fl.contracts import ClientContext, Round, Setup
from incofl.fl.methods.width.exits import ExitClient, exit_loss
from incofl.fl.methods.width.masked import MaskedClient, masked_logits
from incofl.fl.methods.width.spec import ExitParams, MaskedParams
from incofl.fl.stages.local import train_step
from incofl.fl.stages.objective import Session
from incofl.sides import ClientSettings


def context(model: nn.Module, **kw: object) -> ClientContext:
    return ClientContext(client=0, group=0, round=kw.pop("round", Round(1)), model=model, global_state={}, lr=0.1, **kw)


def hand_ce(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean of log(sum_c exp z_c) - z_y, written out."""
    return (z.exp().sum(1).log() - z[torch.arange(len(y)), y]).mean()


# masked cross-entropy


def test_masked_ce_equals_ce_with_zeros_for_absent_classes() -> None:
    z = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    held = torch.tensor([0, 2])
    # classes 1 and 3 absent: logits (1, 0, 3, 0), target 2
    expected = math.log(math.exp(1) + 1 + math.exp(3) + 1) - 3
    assert F.cross_entropy(masked_logits(z, held), torch.tensor([2])).item() == pytest.approx(expected)


def test_masked_logits_mask_nothing_without_classes_or_with_all() -> None:
    z = torch.randn(3, 5)
    assert torch.equal(masked_logits(z, None), z)
    assert torch.equal(masked_logits(z, torch.arange(5)), z)


def masked_session(classes: torch.Tensor | None, **hp: object) -> tuple[nn.Linear, Session]:
    torch.manual_seed(0)
    model = nn.Linear(4, 5)
    return model, MaskedClient(MaskedParams(**hp), Setup(ClientSettings.of(RunConfig()), [])).session(
        context(model, classes=classes)
    )


def test_absent_class_logit_has_no_effect() -> None:
    """Changing the classifier row of a class the client does not hold changes neither loss nor gradient."""
    model, session = masked_session(torch.tensor([0, 2]))
    x, y = torch.randn(6, 4), torch.tensor([0, 2, 2, 0, 0, 2])
    loss = session.loss(x, y)
    loss.backward()
    assert model.weight.grad[[1, 3, 4]].abs().sum() == 0 and model.weight.grad[[0, 2]].abs().sum() > 0
    with torch.no_grad():
        model.weight[3] += 10.0
        model.bias[4] -= 5.0
    assert session.loss(x, y).item() == pytest.approx(loss.item())


def test_mask_off_is_plain_ce() -> None:
    model, session = masked_session(torch.tensor([0, 2]), mask_classes=False)
    x, y = torch.randn(6, 4), torch.tensor([0, 2, 2, 0, 0, 2])
    assert session.loss(x, y).item() == pytest.approx(F.cross_entropy(model(x), y).item())


def grad_norm(model: nn.Module) -> float:
    return torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])).item()


def test_clip_bounds_a_large_gradient_after_a_step() -> None:
    model, session = masked_session(None)
    with torch.no_grad():
        model.weight.mul_(100.0)  # confident and wrong: a large gradient
    x, y = torch.randn(16, 4), torch.randint(0, 5, (16,))
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    assert grad_norm(model) > 1.0
    model.zero_grad()
    train_step(session, torch.optim.SGD(model.parameters(), lr=0.1), x, y)
    assert grad_norm(model) == pytest.approx(1.0, rel=1e-5)


def test_clip_leaves_a_small_gradient_and_skips_missing_ones() -> None:
    model, session = masked_session(None, grad_clip=2.0)
    model.weight.grad = torch.full_like(model.weight, 0.1)  # norm sqrt(20) * 0.1 < 2
    model.bias.grad = None
    before = model.weight.grad.clone()
    session.after_backward()
    assert torch.equal(model.weight.grad, before) and model.bias.grad is None
    model.weight.grad = torch.full_like(model.weight, 1.0)  # norm sqrt(20) > 2
    session.after_backward()
    assert model.weight.grad.norm().item() == pytest.approx(2.0, rel=1e-5)


def test_masked_params_validate() -> None:
    assert MaskedParams().grad_clip == 1.0 and MaskedParams().mask_classes
    for bad in ({"grad_clip": 0.0}, {"grad_clip": float("inf")}, {"clip": 1.0}):
        with pytest.raises(ValueError):
            MaskedParams(**bad)


# early-exit loss

B, C = 4, 3


def exit_logits(k: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(B, C, generator=gen, requires_grad=True) for _ in range(k)]


Y = torch.tensor([0, 2, 1, 2])


def hand_kl(teacher: torch.Tensor, student: torch.Tensor, t: float) -> torch.Tensor:
    """sum over the batch and classes of p_t (log p_t - log p_s), divided by B."""
    p_t, p_s = (teacher / t).softmax(1), (student / t).softmax(1)
    return (p_t * (p_t.log() - p_s.log())).sum() / len(teacher)


@pytest.mark.parametrize("distill", ["intended", "released"])
def test_one_exit_is_cross_entropy(distill: str) -> None:
    (z,) = exit_logits(1)
    assert exit_loss([z], Y, 0.5, 3.0, distill, True).item() == pytest.approx(hand_ce(z, Y).item())


def test_two_exits_without_distillation_weigh_by_depth() -> None:
    z1, z2 = exit_logits(2)
    expected = (1 * hand_ce(z1, Y) + 2 * hand_ce(z2, Y)) / 3
    assert exit_loss([z1, z2], Y, 0.0, 3.0, "intended", True).item() == pytest.approx(expected.item())


@pytest.mark.parametrize(("distill", "scale"), [("intended", 1.0), ("released", 1.0 / C)])
def test_distillation_term(distill: str, scale: float) -> None:
    """intended: per-sample KL (batchmean); released: the same averaged over B x C, i.e. divided by C."""
    gamma, t = 0.5, 2.0
    z1, z2, z3 = exit_logits(3)
    kd = [gamma * t**2 * scale * hand_kl(z3, z, t) for z in (z1, z2)]
    expected = (1 * (hand_ce(z1, Y) + kd[0]) + 2 * (hand_ce(z2, Y) + kd[1]) + 3 * hand_ce(z3, Y)) / 6
    assert exit_loss([z1, z2, z3], Y, gamma, t, distill, True).item() == pytest.approx(expected.item(), rel=1e-5)


def deepest_grad(distill: str, gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of the deepest and the shallowest exit's logits."""
    z1, z2 = exit_logits(2)
    exit_loss([z1, z2], Y, gamma, 3.0, distill, True).backward()
    return z2.grad, z1.grad


def test_intended_teacher_is_detached() -> None:
    """The deepest exit learns from its own cross-entropy only; the shallow one from the teacher too."""
    teacher_kd, student_kd = deepest_grad("intended", 0.5)
    teacher_ce, student_ce = deepest_grad("intended", 0.0)
    assert torch.allclose(teacher_kd, teacher_ce)
    assert not torch.allclose(student_kd, student_ce)


def test_released_teacher_is_not_detached() -> None:
    teacher_kd, _ = deepest_grad("released", 0.5)
    teacher_ce, _ = deepest_grad("released", 0.0)
    assert not torch.allclose(teacher_kd, teacher_ce)


def test_no_distillation_while_not_distilling() -> None:
    z1, z2 = exit_logits(2)
    off = exit_loss([z1, z2], Y, 0.5, 3.0, "intended", False)
    assert off.item() == pytest.approx(exit_loss([z1, z2], Y, 0.0, 3.0, "intended", True).item())


class TwoExits(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shallow, self.deep = nn.Linear(4, C), nn.Linear(4, C)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [self.shallow(x), self.deep(x)]


@pytest.mark.parametrize(("distill_from", "rounds", "first"), [(0.25, 8, 2), (0.25, 10, 3), (0.0, 8, 0), (1.0, 8, 8)])
def test_session_distils_from_the_share_of_rounds(distill_from: float, rounds: int, first: int) -> None:
    """Rounds with fewer than distill_from * rounds rounds before them train without distillation, the rest with it."""
    torch.manual_seed(0)
    model, x = TwoExits(), torch.randn(B, 4)
    objective = ExitClient(ExitParams(gamma=0.5, distill_from=distill_from), Setup(ClientSettings.of(RunConfig()), []))
    plain = exit_loss(model(x), Y, 0.0, 3.0, "intended", True).item()
    for round_ in Round.upto(rounds):
        loss = objective.session(context(model, round=round_, rounds=rounds)).loss(x, Y).item()
        assert (loss != pytest.approx(plain)) == (round_.index >= first), round_


def test_exit_params_defaults_and_validation() -> None:
    hp = ExitParams()
    assert (hp.distill, hp.gamma, hp.temperature, hp.distill_from) == ("intended", 0.05, 3.0, 0.25)
    for bad in ({"distill": "paper"}, {"gamma": -0.1}, {"temperature": 0.0}, {"distill_from": 1.5}):
        with pytest.raises(ValueError):
            ExitParams(**bad)
