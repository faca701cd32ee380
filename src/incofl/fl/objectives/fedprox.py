"""FedProx (Li et al., MLSys 2020): local loss + (mu/2) * ||w - w_global||^2."""

from __future__ import annotations

import torch

from incofl.fl.client import ClientContext, Objective


class FedProx(Objective):
    """The proximal term enters as its exact gradient mu * (w - w_global), added after
    backward (as FL-bench does): no autograd graph over every weight, and with mu = 0 the
    step is bit-identical to FedAvg's. Over the trainable parameters, like NIID-Bench."""

    params = {"mu": 0.1}  # the paper's mu/2 = 0.05
    _anchors: list[tuple[torch.Tensor, torch.Tensor]]  # (trainable weight, its global value) of this client

    def begin(self, ctx: ClientContext) -> None:
        self._anchors = [(p, ctx.global_state[name]) for name, p in ctx.model.named_parameters() if p.requires_grad]

    def after_backward(self, ctx: ClientContext) -> None:
        mu = float(self.hp["mu"])
        for p, anchor in self._anchors:
            if p.grad is not None:
                p.grad.add_(p.detach() - anchor, alpha=mu)
