"""The server side of a round, one client update at a time (`RoundFold`).

Each update is folded in as it arrives: checked, seen by the planner, through the pre
transforms, added into the aggregator's running sums and the objective's (SCAFFOLD's sum of
increments), and then let go, so a round holds one model's worth of sums per server state and
the update in flight, however many clients it has. Updates are folded in the plans' order
whatever order they come in (one that comes early waits for those planned before it to come or
be dropped), so the sums are the same floats however a federation's replies arrive.

What needs every update of a round before it can act says so and keeps what it needs:
- a pre transform that is `whole_round` (FedNova's tau_eff) `see`s each update, which then
  waits for the round's last in `Held` (its deltas in a client store of `client_memory_mb`, on
  disk beyond it) before the transform and the rest of the round take it;
- the analyses' probes, in the rounds they probe, keep each client's trained model (pairwise
  comparisons);
- FedLAG's planner keeps its warm-up rounds' conflict signals (pairwise cosines).
`finish` then averages, applies the post transforms, updates the server states and returns the
round's report. Nothing of the server states changes before `finish`, but a fold left unfinished
(a stopped run: a divergence, a federation's missing clients) leaves its components' round
scratch (SCAFFOLD's sums of increments, FedNova's seen counts) behind: the run resumes from its
checkpoint in a new engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

import torch

from incofl.fl.contracts import ClientPlan, ClientUpdate, Round, RoundContext, RoundReport, Trained
from incofl.fl.engine.divergence import check_states, check_updates
from incofl.fl.engine.server import Server
from incofl.fl.stages.aggregate import apply_update
from incofl.fl.stages.clientstore import ClientStore

HELD = "held"  # the held updates' space in their store


class Held:
    """Updates waiting for the round's last: their deltas in a client store of the run's memory
    budget (beyond it in a temporary folder, read back one at a time), the rest of each in memory."""

    def __init__(self, budget_mb: float, device: torch.device):
        self.store, self.device = ClientStore(budget_mb), device
        self.updates: list[ClientUpdate] = []

    def put(self, update: ClientUpdate) -> None:
        self.store.put(HELD, len(self.updates), update.delta)
        self.updates.append(replace(update, delta={}))

    def __iter__(self) -> Iterator[ClientUpdate]:
        for i, update in enumerate(self.updates):
            delta = self.store.get(HELD, i) or {}
            yield replace(update, delta={k: v.to(self.device) for k, v in delta.items()})


class RoundFold:
    """Round `round_` of the server side in progress (module docstring): `add` each client's
    update (any order), `drop` a planned client that sends none, then `finish` once for the
    round's report; `tick` is called as each update is folded in (a progress bar)."""

    def __init__(
        self, server: Server, round_: Round, plans: list[ClientPlan], tick: Callable[[], object] | None = None
    ):
        self.server, self.round, self.plans, self.tick = server, round_, plans, tick
        self.position = {plan.client: i for i, plan in enumerate(plans)}
        self.next = 0  # the position of the next plan to fold in
        self.waiting: dict[int, ClientUpdate | None] = {}  # position -> an update that came early (None: dropped)
        self.receipts: list[ClientUpdate] = []  # the folded updates without their tensors (the report's)
        self.probes = [o for o in server.observers if o.wants(round_.number)]
        self.trained: list[Trained] = []  # the probes' (none unless they probe this round)
        self.sums = server.aggregator.fold()
        self.held = {
            i: Held(server.settings.client_memory_mb, server.device) for i, t in enumerate(server.pre) if t.whole_round
        }

    def add(self, update: ClientUpdate) -> None:
        """A planned client's update, folded in once every client planned before it is in."""
        self._arrive(update.client, update)

    def drop(self, client: int) -> None:
        """A planned client whose update will not come (a federation's missing reply)."""
        self._arrive(client, None)

    def finish(self) -> RoundReport:
        """The rest of the round once every update is in: clients neither added nor dropped are
        left out. Returns the round's report."""
        server, round_ = self.server, self.round
        while self.waiting:
            self.next = min(self.waiting)
            self._advance()
        for i, held in self.held.items():  # in the transforms' order: a later one may hold again
            server.pre[i].seen_all(round_)
            for update in held:
                self._through(server.pre[i](round_, update), i + 1)
        server.planner.round_end(round_)
        for probe in self.probes:
            probe.see_clients(round_.number, self.trained)
        for federation, average in self.sums.averages().items():
            aggregated = {k: v.clone() for k, v in average.items()} if self.probes else {}
            ctx = RoundContext.of(round_, federation, self.receipts, self.sums.covered.get(federation))
            for post in server.post:
                average = post(average, ctx)
            for probe in self.probes:
                probe.see_average(round_.number, federation, aggregated, average)
            apply_update(server.weights[federation], average)
        check_states(round_.number, server.weights)
        server.objective.server_round_end()
        diagnostics = {k: v for post in server.post for k, v in post.diagnostics().items()}
        return RoundReport.of(round_.number, self.receipts, server.settings.local_epochs, diagnostics)

    def _arrive(self, client: int, update: ClientUpdate | None) -> None:
        position = self.position.get(client)
        if position is None or position < self.next or position in self.waiting:
            raise ValueError(f"round {self.round.number}: client {client} is not planned or was already folded in")
        self.waiting[position] = update
        self._advance()

    def _advance(self) -> None:
        """Fold in the waiting updates that are next in the plans' order."""
        while self.next in self.waiting:
            update = self.waiting.pop(self.next)
            plan = self.plans[self.next]
            self.next += 1
            if update is not None:
                self._fold(plan, update)

    def _fold(self, plan: ClientPlan, update: ClientUpdate) -> None:
        server, round_ = self.server, self.round
        check_updates(round_.number, [update])
        if self.probes:  # its delta copied: a pre transform may change the update's in place
            trained = server.trained(plan, update)
            self.trained.append(replace(trained, delta={k: v.clone() for k, v in trained.delta.items()}))
        server.planner.observe(round_, update)
        self.receipts.append(update.receipt())
        self._through(update, 0)
        if self.tick is not None:
            self.tick()

    def _through(self, update: ClientUpdate, first: int) -> None:
        """Through the pre transforms from the `first` on into the sums; a whole-round
        transform sees it and holds it for `finish`."""
        server = self.server
        for i in range(first, len(server.pre)):
            if i in self.held:
                server.pre[i].see(self.round, update)
                self.held[i].put(update)
                return
            update = server.pre[i](self.round, update)
        self.sums.add(update)
        server.objective.server_add(update)
