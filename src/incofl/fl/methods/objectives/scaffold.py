"""SCAFFOLD (Karimireddy et al., ICML 2020), Option II control variates.

Every local step is corrected by (c - c_i). After tau_i steps at learning rate lr,
c_i+ = c_i - c + (w_global - w_i) / (tau_i * lr), and once the round is over the server sets
c <- c + (1/K) * sum_{i in S} (c_i+ - c_i). Both are zero-initialised (NIID-Bench draws them
at random) and cover the trainable parameters only.

Where the correction goes (`correction`):
- "step" (default, NIID-Bench's code): after each optimizer step, w <- w - lr * (c - c_i).
- "gradient" (the SCAFFOLD paper's wording): g <- g + (c - c_i) before it.
For plain SGD the two are the same update. For Adam (the paper's ResNet optimizer) they are
not: Option II measures c_i in units of the step (displacement / (tau * lr), about 1 per
coordinate under Adam's normalised steps) while gradients are orders of magnitude smaller,
so the gradient form drowns the data gradient in the correction and training collapses
(measured on the synthetic set, 2 groups x 2 clients, Adam 1e-3, 4 rounds: gradient form 10%,
step form 85%, FedAvg-level as in the paper's Table 2). The step form keeps the correction
in the units it was measured in, whatever the optimizer.

One c per server state, i.e. per federation: with a shared global state (`heteroavg`,
`inco`) c lives on the server model's names, every client uses the subset its model holds
and K is the number of clients; under `groupwise` each group is its own federation (its own
weights, its own clients), so it gets its own c on its model's names and K is the group's
size. A shared c there would correct one group's model with gradients of the others'
unrelated models. As the formula reads, an entry only some clients hold (a deep block of
the larger models) still gets 1/K: non-holders count as c_i = 0.

Each client's c_i lives in the run's client store (fl/stages/clientstore.py, space
"scaffold"): in memory up to `client_memory_mb`, on disk beyond it. c is what the server
broadcasts to its clients besides the weights.
"""

from __future__ import annotations

import torch

from incofl.fl.contracts import ClientContext, ClientUpdate, Setup, State
from incofl.fl.methods.objectives.spec import ScaffoldParams
from incofl.fl.stages.component import Sent
from incofl.fl.stages.objective import ClientObjective, Objective, Session

Variates = dict[str, torch.Tensor]
SPACE = "scaffold"  # the client store's space of the clients' c_i


def _trainable(ctx: ClientContext) -> list[tuple[str, torch.Tensor]]:
    return [(name, p) for name, p in ctx.model.named_parameters() if p.requires_grad]


class ScaffoldSession(Session):
    objective: ScaffoldClient

    def __init__(self, objective: ScaffoldClient, ctx: ClientContext):
        super().__init__(objective, ctx)
        c = objective.c.setdefault(ctx.federation, {})
        self.c_i = c_i = objective.store.get(SPACE, ctx.client) or {}  # absent: zero (never trained)
        self.corrections: list[tuple[torch.Tensor, torch.Tensor]] = []  # (weight, c - c_i)
        for name, p in _trainable(ctx):  # c moves to the device after a resume
            c[name] = c[name].to(p.device) if name in c else torch.zeros_like(p.detach())
            self.corrections.append((p, c[name] - c_i[name].to(p.device) if name in c_i else c[name]))

    def after_backward(self) -> None:
        if self.objective.hp.correction == "gradient":
            for p, correction in self.corrections:
                if p.grad is not None:
                    p.grad.add_(correction)

    @torch.no_grad()
    def after_step(self) -> None:
        if self.objective.hp.correction == "step":
            for p, correction in self.corrections:
                p.sub_(correction, alpha=self.ctx.lr)

    def end(self, update: ClientUpdate) -> ClientUpdate:
        """c_i <- c_i+, and (c_i+ - c_i) / K left in the update for the server's c."""
        ctx = self.ctx
        if update.steps == 0:  # no local step (fewer than two samples): nothing learnt, c_i stays
            return update
        c, c_i = self.objective.c[ctx.federation], self.c_i
        new: Variates = {}
        increment: Variates = {}
        for name, _ in _trainable(ctx):
            # c_i+ - c_i = -c + (w_global - w_i) / (tau_i * lr), and w_global - w_i = -delta
            change = -(c[name] + update.delta[name] / (update.steps * ctx.lr))
            new[name] = c_i[name] + change.cpu() if name in c_i else change.cpu()
            increment[name] = change / ctx.federation_size
        self.objective.store.put(SPACE, ctx.client, new)
        update.extra["scaffold_increment"] = increment
        return update


class ScaffoldClient(ClientObjective):
    """The clients' half: c as received (the c_i are in the client store)."""

    session_type = ScaffoldSession
    scratch = ("c",)  # the server's, received anew every round

    def __init__(self, hp: ScaffoldParams, setup: Setup):
        super().__init__(hp, setup)
        self.c: dict[int, Variates] = {}  # server variate per federation, as received, on the training device

    def receive(self, federation: int, state: State) -> None:
        self.c[federation] = dict(state)


class Scaffold(Objective):
    """The server's half: c, updated from the clients' increments."""

    client = ScaffoldClient
    state = ("c",)
    scratch = ("totals",)  # within a round only
    sends = (Sent("scaffold_increment", stepped_only=True),)

    def __init__(self, hp: ScaffoldParams, setup: Setup):
        super().__init__(hp, setup)
        self.c: dict[int, Variates] = {}  # server variate per federation, on the training device
        self.totals: dict[int, Variates] = {}  # this round's sums of increments so far, per federation

    def broadcast(self, federation: int) -> State:
        """The federation's c (empty before its first client trains: zero)."""
        return dict(self.c.get(federation, {}))

    def server_add(self, update: ClientUpdate) -> None:
        """One update's increment into the round's sum (in the round's client order)."""
        total = self.totals.setdefault(update.federation, {})
        for name, increment in update.extra.get("scaffold_increment", {}).items():
            total[name] = total.get(name, 0) + increment

    def server_round_end(self) -> None:
        """c <- c + (1/K) sum (c_i+ - c_i), the round's sum of increments."""
        for state, total in self.totals.items():
            c = self.c.setdefault(state, {})  # a server whose clients train elsewhere: no session made it
            for name, change in total.items():
                c.setdefault(name, torch.zeros_like(change)).add_(change)
        self.totals = {}
