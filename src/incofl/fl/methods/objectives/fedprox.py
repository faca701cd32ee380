"""FedProx (Li et al., MLSys 2020): local loss + (mu/2) * ||w - w_global||^2.

`anchor: initial` pulls towards the initial model instead of this round's global model: a
proximal anchor that never moves, one hypothesis for the paper's FedProx collapse (docs/methods.md,
"Fidelity")."""

from __future__ import annotations

import torch

from incofl.fl.contracts import ClientContext
from incofl.fl.stages.objective import ClientObjective, Objective, Session


class ProxSession(Session):
    """The proximal term enters as its exact gradient mu * (w - w_global), added after
    backward (as FL-bench does): no autograd graph over every weight, and with mu = 0 the
    step is bit-identical to FedAvg's. Over the trainable parameters, like NIID-Bench."""

    def __init__(self, objective: ProxClient, ctx: ClientContext):
        super().__init__(objective, ctx)
        # (trainable weight, its global value) of this client
        anchor = objective.initial if objective.hp.anchor == "initial" else ctx.global_state
        self.anchors: list[tuple[torch.Tensor, torch.Tensor]] = [
            (p, anchor[name]) for name, p in ctx.model.named_parameters() if p.requires_grad
        ]

    def after_backward(self) -> None:
        mu = float(self.objective.hp.mu)
        for p, anchor in self.anchors:
            if p.grad is not None:
                p.grad.add_(p.detach() - anchor, alpha=mu)


class ProxClient(ClientObjective):
    session_type = ProxSession
    initial: dict[str, torch.Tensor]

    def batched_correction(self, weights: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> dict:
        """mu * (w - w_global) on stacked weights, as ProxSession.after_backward adds it."""
        anchor = self.initial if self.hp.anchor == "initial" else start
        return {k: float(self.hp.mu) * (w - anchor[k]) for k, w in weights.items()}

    def begin(self, initial: dict[str, torch.Tensor]) -> None:
        if self.hp.anchor == "initial":  # a copy: the server's state moves on
            self.initial = {k: v.detach().clone() for k, v in initial.items()}


class FedProx(Objective):
    """FedProx's server half: FedAvg's (the proximal term is the clients' alone)."""

    client = ProxClient
