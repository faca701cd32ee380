"""Transforms of the round's updates around aggregation (the transform stages).

Before aggregation a transform sees each client update of the round (`UpdateTransform`, e.g.
FedNova's normalisation), called `pre(round_, update)` as the update arrives, in client order:
each names its own client, federation and samples. A transform that needs something of every
update of the round first (FedNova's tau_eff) says so (`whole_round`): it `see`s each update
as it arrives, is told when the round's last was (`seen_all`), and is then called on each (the
engine holds the updates meanwhile: fl/engine/fold.py). After aggregation, a transform sees one federation's
averaged update with its `RoundContext` (round, federation, clients, samples), called
`post(average, ctx)`, e.g. the InCo step; state it keeps across rounds (a momentum buffer) is
kept per `ctx.federation` and declared in `state`, which the engine checkpoints
(fl/stages/component.py). A method lists its transforms in its registry entry; each takes the
method's typed parameters and a `Setup` (the run settings components read, the server
state's names, the layout). Two are the engine's, for every method, when a config asks: update
noise (robustness) and the release's epoch scale.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from incofl.fl.contracts import Average, ClientUpdate, Round, RoundContext, Setup
from incofl.fl.stages.component import Stateful
from incofl.fl.stages.sampling import noise_seed


class UpdateTransform(Stateful):
    """Before aggregation: one client update in, the update to aggregate out (its tensors are the
    round's own: a transform may change them in place). `whole_round`: it is called only once
    every update of the round was `see`n (module docstring)."""

    whole_round: ClassVar[bool] = False

    def __init__(self, hp: Any, setup: Setup):
        self.hp = hp

    def see(self, round_: Round, update: ClientUpdate) -> None:
        """A `whole_round` transform's first look at each update of the round, in client order."""

    def seen_all(self, round_: Round) -> None:
        """A `whole_round` transform: every update of the round was seen; the calls follow."""

    def __call__(self, round_: Round, update: ClientUpdate) -> ClientUpdate:
        return update


class UpdateNoise(UpdateTransform):
    """Robustness (paper Fig. 7): every floating-point tensor of a client's update gets Gaussian
    noise of std `update_noise` x that tensor's std, before aggregation (so before any other
    transform). Drawn from (seed, round, client): a resumed run is bit-identical. The engine
    adds it for every method when `update_noise` > 0."""

    def __init__(self, hp: Any, setup: Setup):
        super().__init__(hp, setup)
        self.scale, self.seed = setup.settings.update_noise, setup.settings.seed

    def __call__(self, round_: Round, update: ClientUpdate) -> ClientUpdate:
        gen = torch.Generator().manual_seed(noise_seed(self.seed, round_.index, update.client))
        for delta in update.delta.values():
            if delta.numel() > 1:
                noise = torch.randn(delta.shape, generator=gen, dtype=delta.dtype)
                delta.add_(noise.to(delta.device), alpha=self.scale * float(delta.std()))
        return update


class AverageTransform(Stateful):
    """After aggregation: one federation's averaged update in, the update to apply out."""

    def __init__(self, hp: Any, setup: Setup):
        self.hp = hp

    def __call__(self, average: Average, ctx: RoundContext) -> Average:
        return average

    def diagnostics(self) -> dict[str, dict[str, float]]:
        """Per-round statistics for the observers (returned once, then cleared)."""
        return {}


class EpochScale(AverageTransform):
    """Every averaged update divided by the number of local epochs (as every client update
    before averaging: the mean is linear). The release does it for every method on ViTs; the
    engine adds it first after aggregation when a config asks for that (`vit_epoch_scale: all`,
    ServerSettings.scales_epochs)."""

    def __init__(self, hp: Any, setup: Setup):
        super().__init__(hp, setup)
        self.scale = 1.0 / setup.settings.local_epochs

    def __call__(self, average: Average, ctx: RoundContext) -> Average:
        for v in average.values():
            v.mul_(self.scale)
        return average
