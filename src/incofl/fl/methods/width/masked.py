"""HeteroFL (Diao et al., ICLR 2021) and FedRolex (Alam et al., NeurIPS 2022): local training of
a width-cut sub-model (docs/methods.md, hetero splitting).

Both releases train with a masked cross-entropy: the model's output logits of the classes the
client holds no sample of are set to 0 (`masked_fill(mask == 0, 0)` after the final linear
layer, not -inf), so those classes still take part in the softmax with a fixed logit and
their classifier rows get no gradient from the loss. After backward both clip the gradient's
global L2 norm to 1 (`clip_grad_norm_(model.parameters(), 1)`) before the optimizer step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from incofl.fl.contracts import ClientContext
from incofl.fl.stages.objective import ClientObjective, Objective, Session


def masked_logits(logits: torch.Tensor, classes: torch.Tensor | None) -> torch.Tensor:
    """`logits` with the columns of the classes not in `classes` set to 0; None masks nothing."""
    if classes is None:
        return logits
    present = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
    present[classes] = True
    return logits.masked_fill(~present, 0.0)


class MaskedSession(Session):
    objective: MaskedClient

    def __init__(self, objective: MaskedClient, ctx: ClientContext):
        super().__init__(objective, ctx)
        self.classes = ctx.classes if objective.hp.mask_classes else None
        self.params = [p for p in ctx.model.parameters() if p.requires_grad]

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(masked_logits(self.ctx.model(x), self.classes), y)

    def after_backward(self) -> None:
        # the norm over the gradients there are (clip_grad_norm_ skips a parameter whose grad is None)
        torch.nn.utils.clip_grad_norm_(self.params, float(self.objective.hp.grad_clip))


class MaskedClient(ClientObjective):
    session_type = MaskedSession


class MaskedCE(Objective):
    """The masked cross-entropy's server half: FedAvg's."""

    client = MaskedClient
