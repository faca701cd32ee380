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

from incofl.fl.contracts import ClientUpdate, Round, Setup
from incofl.fl.stages.transforms import UpdateTransform


def normalizer(steps: int, rho: float) -> float:
    """a_i: the number of gradients a client's update accumulates (FedNova, SGD with momentum rho)."""
    return (steps - rho * (1 - rho**steps) / (1 - rho)) / (1 - rho)


class NovaNormalize(UpdateTransform):
    """FedNova: each client's update rescaled by tau_eff / a_i before averaging (module
    docstring). tau_eff needs every client of the federation: it `see`s each update's a_i and
    n_i first (`whole_round`: only those two numbers are kept of an update it saw)."""

    whole_round = True
    scratch = ("seen", "tau_eff")  # this round's

    def __init__(self, hp: Any, setup: Setup):
        super().__init__(hp, setup)
        momentum = setup.settings.momentum if setup.settings.optimizer == "sgd" else 0.0
        self.rho = momentum if hp.rho is None else float(hp.rho)
        self.seen: dict[int, list[tuple[int, float]]] = {}  # federation -> (n_i, a_i) in client order
        self.tau_eff: dict[int, float] = {}

    def see(self, round_: Round, update: ClientUpdate) -> None:
        self.seen.setdefault(update.federation, []).append((update.num_samples, normalizer(update.steps, self.rho)))

    def seen_all(self, round_: Round) -> None:
        # sum(n_i * a_i) / sum(n_i) rather than sum(p_i * a_i): exact when all a_i are equal
        self.tau_eff = {f: sum(n * a for n, a in seen) / sum(n for n, _ in seen) for f, seen in self.seen.items()}
        self.seen = {}

    def __call__(self, round_: Round, update: ClientUpdate) -> ClientUpdate:
        a = normalizer(update.steps, self.rho)
        scale = self.tau_eff[update.federation] / a if a > 0 else 0.0  # a_i = 0: no step, zero update
        for delta in update.delta.values():
            delta.mul_(scale)  # the deltas are this round's own tensors
        return update
