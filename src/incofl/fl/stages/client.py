"""The client side of a round: one client's (or, in the simulator, every client's) local
training from the server's start weights to its `ClientUpdate`.

A `ClientRunner` holds what lives on clients: the group models it trains in, its clients'
training data, the run's trainer and the method's objective, and the entries each client keeps
for itself (`ClientPlan.keep`: personal layers, local BN statistics). It needs no server
state: the simulator builds one for every client, a federation's node one for its own client
(its own data only). The server hands it a plan and the server's start weights
(`Server.start`); the runner overlays what the client keeps (`own_start`), trains, and keeps
the new kept entries in its `ClientStore` (fl/stages/clientstore.py), with whatever else the
objective keeps per client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from torch import nn

from incofl.data.tensors import TensorSplit
from incofl.fl.contracts import ClientPlan, ClientUpdate, Round, State
from incofl.fl.stages.batched import BatchedTrainer
from incofl.fl.stages.clientstore import ClientStore
from incofl.fl.stages.graphs import GraphBatchedTrainer, GraphTrainer
from incofl.fl.stages.objective import ClientObjective
from incofl.fl.stages.trainer import Parts, SerialTrainer

if TYPE_CHECKING:
    from incofl.sides import ClientSettings

KEPT = "kept"  # the client store's space of the entries a client keeps for itself (ClientPlan.keep)


class ClientRunner:
    """Trains planned clients (module docstring): `train` one, `train_round` a round's (the
    batched trainer's clients side by side)."""

    def __init__(
        self,
        settings: ClientSettings,
        objective: ClientObjective,
        models: list[nn.Module],
        data: TensorSplit,
        parts: Parts,
        store: ClientStore,
    ):
        autocast = settings.bf16 and data.x.device.type == "cuda"
        trainers = {("serial", False): SerialTrainer, ("batched", False): BatchedTrainer}
        trainers |= {("serial", True): GraphTrainer, ("batched", True): GraphBatchedTrainer}
        trainer = trainers[settings.trainer, settings.cuda_graphs]
        self.trainer, self.objective = trainer(settings, models, data, parts, autocast), objective
        self.store, self.device = store, data.x.device  # the store: what its clients keep across rounds

    def own_start(self, plan: ClientPlan, start: State) -> State:
        """The weights the client trains from: the server's, with what the client keeps over them."""
        return self.overlay(plan.client, start)

    def overlay(self, client: int, state: State) -> State:
        """`state` with what `client` keeps for itself over it, on the training device."""
        kept = self.store.get(KEPT, client) or {}
        return {**state, **{k: v.to(self.device) for k, v in kept.items()}}

    def train(self, round_: Round, plan: ClientPlan, start: State) -> ClientUpdate:
        """One planned client from the server's start weights."""
        return self.train_round(round_, [plan], lambda _: start)[0]

    def stream_round(
        self, round_: Round, plans: list[ClientPlan], start_of: Callable[[ClientPlan], State]
    ) -> Iterator[ClientUpdate]:
        """A round's planned clients' updates, in the plans' order, each as soon as the run's
        trainer has it (the serial one: client by client; the batched one: after the round)."""

        def own(plan: ClientPlan) -> State:
            return self.own_start(plan, start_of(plan))

        for update in self.trainer.train(round_, plans, own, self.objective):
            if update.kept:
                self.store.put(KEPT, update.client, update.kept)
            yield update

    def train_round(
        self, round_: Round, plans: list[ClientPlan], start_of: Callable[[ClientPlan], State]
    ) -> list[ClientUpdate]:
        """A round's planned clients' updates, all of them (`stream_round`'s)."""
        return list(self.stream_round(round_, plans, start_of))
