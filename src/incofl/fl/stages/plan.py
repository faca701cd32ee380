"""The plan stage: what each sampled client trains and uploads this round.

A planner hands every sampled client its instructions for the round (Flower's
`configure_fit`): its model group, the server state (federation) it trains from, and which
parameters it trains and which state entries it uploads and keeps. `FullPlanner` trains and
uploads the whole (sub-)model; a method's planner extends it (FedPart's layer groups,
the personal methods' kept entries, width splitting's levels).

`bn_stats: local` (the release, in its FedPart and full-update runs alike): each client keeps
its BatchNorm running statistics for itself (`keep`): they are never uploaded, and its next
round starts from them (the client side restores them, fl/stages/client.py; the layout
evaluates each model group with the statistics of its first client, as the release evaluates
client 0's model).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from torch import nn

from incofl.fl.contracts import ClientPlan, ClientUpdate, Round, Setup, SideSettings
from incofl.fl.stages.component import Stateful
from incofl.fl.stages.sampling import group_of


def bn_statistics(model: nn.Module) -> frozenset[str]:
    """The state entries of every BatchNorm layer that are not parameters (running statistics)."""
    norms = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    return frozenset(f"{name}.{buffer}" for name, m in norms for buffer, _ in m.named_buffers(recurse=False))


def local_statistics(settings: SideSettings) -> bool:
    """Whether each client keeps its BatchNorm running statistics (`bn_stats: local`, module docstring)."""
    return settings.bn_stats == "local"


class FullPlanner(Stateful):
    """Every sampled client trains and uploads its whole (sub-)model. A planner is built from the
    method's parameters and the run's Setup (the run settings it reads, server entries, width
    levels, the model groups' models and the aggregator's map of a model group to its federation)."""

    def __init__(self, hp: Any, setup: Setup):
        run, self.federation_of = setup.settings, setup.federation
        self.num_clients, self.groups = run.clients, run.groups
        self.sizes = Counter(self.federation_of(group_of(c, run.clients, run.groups)) for c in range(run.clients))
        self.keep = [bn_statistics(m) if local_statistics(run) else frozenset() for m in setup.models]

    def plan(self, round_: Round, client: int) -> ClientPlan:
        group = group_of(client, self.num_clients, self.groups)
        federation = self.federation_of(group)
        return ClientPlan(client, group, federation, self.sizes[federation], keep=self.keep[group])

    def observe(self, round_: Round, update: ClientUpdate) -> None:
        """Each of the round's updates as it arrives (in client order, before the pre transforms):
        what later plans may depend on (FedLAG's conflict signals)."""

    def round_end(self, round_: Round) -> None:
        """After the round's last update was observed (FedLAG's conflict scores)."""

    def summary(self) -> dict[str, Any]:
        """What summary.json reports of the plans (FedLAG: the personal layers)."""
        return {}
