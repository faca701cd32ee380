"""FedNova (Wang et al., NeurIPS 2020), normalised averaging of local updates:
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

from incofl.fl.contracts import ClientUpdate, Setup
from incofl.fl.stages.transforms import UpdateTransform


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
        for index in {u.federation for u in updates}:
            federation = [u for u in updates if u.federation == index]
            # sum(n_i * a_i) / sum(n_i) rather than sum(p_i * a_i): exact when all a_i are equal
            tau_eff = sum(u.num_samples * a[u.client] for u in federation) / sum(u.num_samples for u in federation)
            for u in federation:
                scale = tau_eff / a[u.client] if a[u.client] > 0 else 0.0  # a_i = 0: no step, zero update
                for delta in u.delta.values():
                    delta.mul_(scale)  # the deltas are this round's own tensors
        return updates
