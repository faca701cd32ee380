"""Transforms of the round's updates around aggregation (the transform stages).

Before aggregation a transform sees every client update of the round (`UpdateTransform`:
FedNova's normalisation); after it, one federation's averaged update (`AverageTransform`: the
InCo step). A method lists them
in its registry entry; each takes the method's typed parameters and a `Setup` (the run's
config and the server state's names).

FedNova (Wang et al., NeurIPS 2020), normalised averaging of local updates:
Client i ran tau_i local steps with heavy-ball momentum rho, so its update g_i accumulated
a_i = (tau_i - rho * (1 - rho^tau_i) / (1 - rho)) / (1 - rho) gradients (= tau_i for rho = 0).
The server applies tau_eff * sum_i p_i * g_i / a_i with p_i = n_i / sum_S n and
tau_eff = sum_i p_i * a_i. Here each update is sent as g_i * tau_eff / a_i and the server
rule averages sample-weighted (the registry sets `weighted` for FedNova), which is the same
thing and lets `groupwise`, `heteroavg` and `inco` all see the normalised update. With equal
tau_i the factor is exactly 1 and FedNova is sample-weighted FedAvg.

tau_eff is computed per federation (one for a shared global state, one per group under
`groupwise`); `heteroavg` re-normalises p_i over the clients that hold each entry. Every
floating-point state entry is normalised, BN statistics included (NIID-Bench does the same).

rho: FedNova's a_i is derived for SGD whose momentum buffer sums gradients undamped
(v <- rho * v + g, PyTorch's SGD), so a gradient ends up weighted by up to 1/(1 - rho). By
default rho is the local optimizer's `momentum` (SGD), and 0 for Adam: Adam's first moment
is a damped average ((1 - beta1) * sum beta1^k = 1), so each gradient's total weight is
about 1, not 1/(1 - beta1). `rho` in method_args overrides it.
"""

from __future__ import annotations

from typing import Any

import torch

from incofl.fl.contracts import Average, ClientUpdate, Setup
from incofl.fl.inco import cross_layer_update, find_pairs, vit_pairs
from incofl.fl.sampling import noise_seed
from incofl.params import InCoParams


class UpdateTransform:
    """Before aggregation: all of the round's client updates in, the same updates out."""

    def __init__(self, hp: Any, setup: Setup):
        self.hp = hp

    def __call__(self, round_: int, updates: list[ClientUpdate]) -> list[ClientUpdate]:
        return updates


class UpdateNoise(UpdateTransform):
    """Robustness (paper Fig. 7): every floating-point tensor of a client's update gets Gaussian
    noise of std `update_noise` x that tensor's std, before aggregation (so before any other
    transform). Drawn from (seed, round, client): a resumed run is bit-identical. The engine
    adds it for every method when `update_noise` > 0."""

    def __init__(self, hp: Any, setup: Setup):
        super().__init__(hp, setup)
        self.scale, self.seed = setup.cfg.update_noise, setup.cfg.seed

    def __call__(self, round_: int, updates: list[ClientUpdate]) -> list[ClientUpdate]:
        for u in updates:
            gen = torch.Generator().manual_seed(noise_seed(self.seed, round_, u.client))
            for delta in u.delta.values():
                if delta.numel() > 1:
                    noise = torch.randn(delta.shape, generator=gen, dtype=delta.dtype)
                    delta.add_(noise.to(delta.device), alpha=self.scale * float(delta.std()))
        return updates


class AverageTransform:
    """After aggregation: one federation's averaged update in, the update to apply out."""

    def __init__(self, hp: Any, setup: Setup):
        self.hp = hp

    def __call__(self, average: Average) -> Average:
        return average

    def diagnostics(self) -> dict[str, dict[str, float]]:
        """Per-round statistics for the observers (returned once, then cleared)."""
        return {}


def normalizer(steps: int, rho: float) -> float:
    """a_i: the number of gradients a client's update accumulates (FedNova, SGD with momentum rho)."""
    return (steps - rho * (1 - rho**steps) / (1 - rho)) / (1 - rho)


class NovaNormalize(UpdateTransform):
    """FedNova: each client's update rescaled by tau_eff / a_i before averaging (module docstring)."""

    def __init__(self, hp: Any, setup: Setup):
        super().__init__(hp, setup)
        momentum = setup.cfg.momentum if setup.cfg.optimizer == "sgd" else 0.0
        self.rho = momentum if hp.rho is None else float(hp.rho)

    def __call__(self, round_: int, updates: list[ClientUpdate]) -> list[ClientUpdate]:
        a = {u.client: normalizer(u.steps, self.rho) for u in updates}
        for state in {u.state for u in updates}:
            federation = [u for u in updates if u.state == state]
            # sum(n_i * a_i) / sum(n_i) rather than sum(p_i * a_i): exact when all a_i are equal
            tau_eff = sum(u.num_samples * a[u.client] for u in federation) / sum(u.num_samples for u in federation)
            for u in federation:
                scale = tau_eff / a[u.client] if a[u.client] > 0 else 0.0  # a_i = 0: no step, zero update
                for delta in u.delta.values():
                    delta.mul_(scale)  # the deltas are this round's own tensors
        return updates


class EpochScale(AverageTransform):
    """Every averaged update divided by the number of local epochs (as every client update
    before averaging: the mean is linear). The release does it for every method on ViTs; the
    engine adds it first after aggregation when a config asks for that (`vit_epoch_scale: all`,
    RunConfig.scales_epochs)."""

    def __init__(self, hp: Any, setup: Setup):
        super().__init__(hp, setup)
        self.scale = 1.0 / setup.cfg.local_epochs

    def __call__(self, average: Average) -> Average:
        for v in average.values():
            v.mul_(self.scale)
        return average


class InCoStep(AverageTransform):
    """Internal cross-layer gradients on the averaged update (inco.py). Pairs whose target or
    reference is not in the update (not uploaded this round) are skipped. The official variant's
    ViT form first divides the update by the number of local epochs (the authors' ViT path),
    unless the engine's EpochScale did for every method (`vit_epoch_scale: all`)."""

    def __init__(self, hp: Any, setup: Setup):
        super().__init__(hp, setup)
        self.pairs = find_pairs(setup.state_names)
        self.options = {k: getattr(hp, k) for k in InCoParams.model_fields}
        self.stats: dict[str, dict[str, float]] = {}
        vit = vit_pairs(self.pairs) and hp.variant == "official" and not setup.cfg.scales_epochs
        self.scale = 1.0 / setup.cfg.local_epochs if vit else 1.0

    def __call__(self, average: Average) -> Average:
        held = getattr(average, "held", None)  # width splitting: the elements clients held (fl/width.py)
        if self.scale != 1.0:
            for v in average.values():
                v.mul_(self.scale)
        return cross_layer_update(average, self.pairs, stats=self.stats, held=held, **self.options)

    def diagnostics(self) -> dict[str, dict[str, float]]:
        stats, self.stats = self.stats, {}
        return stats
