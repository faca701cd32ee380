"""ScaleFL (Ilhan et al., CVPR 2023): local loss of a sub-model with early exits (docs/methods.md, hetero splitting).

The model returns a list of logits, shallowest exit first; the last is the deepest exit the
client's sub-model has and teaches the others. With K exits the loss is
sum_j j * l_j / (K(K+1)/2), l_K = CE(z_K, y) and, for j < K, l_j = CE(z_j, y) plus, once
distillation is on, gamma * T^2 * KL(softmax(z_K/T) || softmax(z_j/T)).

`distill: released` is the release's form (models/model_utils.py KDLoss): `nn.KLDivLoss()` with
its default reduction 'mean' averages the KL over B x C, so it is C times smaller than the
per-sample KL, and the teacher is not detached, so the distillation term also trains the
deepest exit towards the shallow ones. `intended` detaches the teacher and takes the KL per
sample ('batchmean'). The release distils from round index floor(R/4) + 1 on (`round >
num_rounds * 0.25`, rounds counted from 0); here from ceil(distill_from * R), i.e. exactly
`distill_from` of the rounds go without (one round earlier than the release when 4 divides R).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from incofl.fl.contracts import ClientContext
from incofl.fl.stages.objective import ClientObjective, Objective, Session


def exit_loss(
    logits: list[torch.Tensor], y: torch.Tensor, gamma: float, temperature: float, distill: str, distilling: bool
) -> torch.Tensor:
    """ScaleFL's depth-weighted loss over exits; the KL terms enter only when `distilling` and gamma > 0."""
    k = len(logits)
    terms = [F.cross_entropy(z, y) for z in logits]
    if distilling and gamma > 0:
        released = distill == "released"
        teacher = F.softmax((logits[-1] if released else logits[-1].detach()) / temperature, dim=1)
        # the summed KL over B x C (released: nn.KLDivLoss's default 'mean') or over B (per sample)
        weight = gamma * temperature**2 / (teacher.numel() if released else len(teacher))
        for j, z in enumerate(logits[:-1]):
            terms[j] = terms[j] + weight * F.kl_div(F.log_softmax(z / temperature, dim=1), teacher, reduction="sum")
    depth = torch.arange(1.0, k + 1, device=y.device)  # a product, not a matmul: autocast keeps it in float32
    return (torch.stack(terms) * depth).sum() / (k * (k + 1) / 2)


class ExitSession(Session):
    objective: ExitClient

    def __init__(self, objective: ExitClient, ctx: ClientContext):
        super().__init__(objective, ctx)
        self.distilling = ctx.round.index >= objective.hp.distill_from * ctx.rounds

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        hp = self.objective.hp
        return exit_loss(self.ctx.model(x), y, float(hp.gamma), float(hp.temperature), hp.distill, self.distilling)


class ExitClient(ClientObjective):
    session_type = ExitSession


class ExitLoss(Objective):
    """The exits' loss's server half: FedAvg's."""

    client = ExitClient
