"""FedDyn (Acar et al., ICLR 2021, Algorithm 1).

Client k minimises  L_k(theta) - <g_k, theta> + (alpha/2) ||theta - theta_s||^2  from the
server's weights theta_s. The two regularisers enter as their exact gradient,
alpha (theta - theta_s) - g_k, added after backward (the loss reported stays the data loss).
After training, g_k <- g_k - alpha (theta_k - theta_s). g_k starts at zero and is the client's
own, in the run's client store (space "feddyn"): the server sends nothing but the weights.

The server is given the plain mean of the sampled clients' updates (FedDyn's aggregators are
never sample-weighted: spec.PlainMean) and, per trainable parameter, sets
h <- h - alpha (1/m) sum_{k in P} (theta_k - theta_s) = h - alpha (|P|/m) mean_P(delta)
first, then applies mean_P(delta) - h/alpha, i.e. theta <- mean_P(theta_k) - h/alpha. m is
the number of clients of the federation, and each federation (each model group under
group-wise aggregation) has its own h, zero at first. Buffers (BN statistics) are averaged as
usual. On a shared state of unlike models (InCoDyn), an entry only some models hold is averaged
over the clients that hold it, and |P|/m is the federation's share of clients sampled (the
holders' share in expectation).
"""

from __future__ import annotations

import torch

from incofl.fl.contracts import Average, ClientContext, ClientUpdate, RoundContext, Setup, State
from incofl.fl.methods.feddyn.spec import DynParams
from incofl.fl.stages.objective import ClientObjective, Objective, Session
from incofl.fl.stages.plan import FullPlanner
from incofl.fl.stages.transforms import AverageTransform

SPACE = "feddyn"  # the client store's space of the clients' g_k


class DynSession(Session):
    objective: DynClient

    def __init__(self, objective: DynClient, ctx: ClientContext):
        super().__init__(objective, ctx)
        g = objective.store.get(SPACE, ctx.client) or {}  # absent: zero (never trained)
        self.terms = [
            (name, p, ctx.global_state[name], g[name].to(p.device) if name in g else None)
            for name, p in ctx.model.named_parameters()
            if p.requires_grad
        ]

    @torch.no_grad()
    def after_backward(self) -> None:
        """grad += alpha (theta - theta_s) - g_k."""
        for _, p, start, g in self.terms:
            correction = (p - start).mul_(self.objective.hp.alpha)
            if g is not None:
                correction.sub_(g)
            if p.grad is None:  # unused in this forward pass: the regularisers' gradient alone
                p.grad = correction
            else:
                p.grad.add_(correction)

    def end(self, update: ClientUpdate) -> ClientUpdate:
        """g_k <- g_k - alpha (theta_k - theta_s), into the store."""
        if update.steps == 0:  # no local step: theta_k = theta_s, g_k stays
            return update
        alpha, new = self.objective.hp.alpha, {}
        for name, p, start, g in self.terms:
            moved = (p.detach() - start).mul_(-alpha)
            new[name] = moved if g is None else moved.add_(g)
        self.objective.store.put(SPACE, self.ctx.client, new)
        return update


class DynClient(ClientObjective):
    """The clients' half; its state is the clients' g_k, in the client store."""

    session_type = DynSession
    hp: DynParams


class DynObjective(Objective):
    """The objective's server half: FedAvg's (the server's h is DynCorrection's)."""

    client = DynClient


class DynCorrection(AverageTransform):
    """The server side: h per federation, and the average corrected by -h/alpha."""

    state = ("h",)

    hp: DynParams

    def __init__(self, hp: DynParams, setup: Setup):
        super().__init__(hp, setup)
        self.sizes = FullPlanner(hp, setup).sizes  # m: the clients of each federation (ClientPlan.federation_size)
        self.params = {name for model in setup.models for name, _ in model.named_parameters()}
        self.h: dict[int, State] = {}

    def __call__(self, average: Average, ctx: RoundContext) -> Average:
        alpha, h = self.hp.alpha, self.h.setdefault(ctx.federation, {})
        scale = alpha * ctx.clients / self.sizes[ctx.federation]  # alpha (1/m) sum = alpha (|P|/m) mean
        for name, mean in average.items():
            if name in self.params:
                h[name] = mean.mul(-scale) if name not in h else h[name].to(mean.device).sub(mean, alpha=scale)
                mean.sub_(h[name], alpha=1.0 / alpha)
        return average
