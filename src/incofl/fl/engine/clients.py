"""The client side of a run, and the simulator's transport to it.

`Clients` holds what lives on clients: the group models they train in (the layout's), their
training data, the run's trainer and the client half of the method's objective
(`ClientObjective`: what was delivered, sessions), the entries each client keeps for itself and
whatever else the objective keeps per client (its `ClientStore`), and the scoring of a client's
model on the client's data. It
holds no server state: the server sends each planned client its plan and start weights and its
objective's broadcast (exchange.py), and the client side trains from them to the update. The
simulator builds one for every client; a federation's node one for its own client, from its own
data alone (incofl.deploy.site.client). Both build it with `build_clients`, from the client's record of
the run's settings (incofl.sides) and the training data it holds (data/shares.py).

`InProcess` is the simulator's transport: the same exchange, called directly, and answered by
the function a federation's node answers with (`Clients.train`). The broadcast is copied on the
way, as a network would copy it; start weights are read-only to a client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from incofl.data.augment import resolve_augment, to_device
from incofl.data.shares import Holdings
from incofl.fl.contracts import ClientPlan, ClientUpdate, Round, State
from incofl.fl.engine.exchange import Reply
from incofl.fl.engine.fingerprint import state_sha256
from incofl.fl.engine.models import LaidOut, Shape, lay_out
from incofl.fl.stages.client import KEPT, ClientRunner
from incofl.fl.stages.clientstore import ClientStore
from incofl.fl.stages.evaluation import Scores
from incofl.fl.stages.layout import ClientEval, Training

if TYPE_CHECKING:
    from incofl.sides import ClientSettings


class Clients:
    """A run's client side (module docstring): `stream` a round's planned clients to their
    updates, `score` a client's model."""

    def __init__(self, laid: LaidOut, training: Training):
        settings, self.layout, self.training = laid.settings, laid.layout, training
        self.store = ClientStore(settings.client_memory_mb)  # what each client keeps across rounds
        self.objective = laid.method.objective.cls.client(laid.hp, laid.setup(self.store))  # its client half
        self.runner = ClientRunner(settings, self.objective, laid.models, training.train, training.parts, self.store)
        self.objective.begin(laid.layout.server_model.state_dict())  # read-only: the models' initial weights

    def receive(self, broadcasts: dict[int, State]) -> None:
        """What the server's objective sent each federation's clients, before they train."""
        for federation, sent in broadcasts.items():
            self.objective.receive(federation, sent)

    def train(
        self, round_: Round, plans: list[ClientPlan], start: Callable[[ClientPlan], State], broadcasts: dict[int, State]
    ) -> Iterator[ClientUpdate]:
        """Round `round_` of the planned clients: what each federation's clients were sent, then
        each client trained from the server's start weights, each update as soon as the run's
        trainer has it (ClientRunner.stream_round). How both transports answer a round's jobs:
        the simulator's for every planned client, a node's for its own."""
        self.receive(broadcasts)
        return self.runner.stream_round(round_, plans, start)

    def score(self, job: ClientEval, start: State) -> Scores:
        """A client's model scored on its split: the server's `start` with what the client keeps over it."""
        return self.layout.score(job, self.runner.overlay(job.client, start))

    def kept(self, client: int) -> State | None:
        """The entries `client` keeps for itself (None: none)."""
        return self.store.get(KEPT, client)


def build_clients(
    settings: ClientSettings, holdings: Holdings, device: torch.device, pretrained: str | None = None
) -> Clients:
    """A run's client side (module docstring) from its record and the training data it holds, on
    `device`: its splits in the models' input size, the training split with the augmentation it
    trains with; `pretrained`: its own file of the weights the run starts from."""
    data = holdings.data
    shape = Shape(data.num_classes, data.channels, data.image_size)
    first = settings.models[0]
    aug = resolve_augment(
        settings.augment, settings.dataset, model=first, cutout=settings.cutout, pad_fill=settings.pad_fill
    )
    train, test = to_device(data, device, shape.input_size(settings), aug, settings.normalize)
    training = Training(train, holdings.parts, holdings.held_out)
    return Clients(lay_out(settings, shape, device, test, pretrained, training=training), training)


class InProcess:
    """The simulator's transport (module docstring): no client is ever left without a reply."""

    lossy = False

    def __init__(self, clients: Clients):
        self.clients = clients

    def train(
        self, round_: Round, plans: list[ClientPlan], start: Callable[[ClientPlan], State], broadcasts: dict[int, State]
    ) -> Iterator[Reply]:
        copied = {f: {k: v.clone() for k, v in sent.items()} for f, sent in broadcasts.items()}
        for update in self.clients.train(round_, plans, start, copied):
            yield Reply(update.client, update)

    def score(self, round_: Round, jobs: list[ClientEval], start: Callable[[int], State]) -> list[Scores]:
        return [self.clients.score(job, start(job.group)) for job in jobs]

    def kept_sha256(self) -> dict[int, str]:
        store = self.clients.store
        return {c: state_sha256(store.get(KEPT, c)) for c in store.clients(KEPT)}

    def attach(self, folder: Path) -> None:
        self.clients.store.attach(folder)

    def state_dict(self) -> dict[str, Any]:
        return self.clients.store.state_dict()

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        self.clients.store.load_state_dict(payload)
