"""The plan stage: what each sampled client trains and uploads this round.

A planner hands every sampled client its instructions for the round (Flower's
`configure_fit`): its model group, the server state (federation) it trains from, and which
parameters it trains and which state entries it uploads. `FullPlanner`, every method's
today, trains and uploads the whole (sub-)model; a partial method (FedPart) plans a subset.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from incofl.fl.sampling import group_of


@dataclass(frozen=True)
class ClientPlan:
    client: int
    group: int
    federation: int  # the server state it trains from and updates
    federation_size: int  # clients in that federation (SCAFFOLD's K)
    trainable: frozenset[str] | None = None  # parameter names trained; None: all
    upload: frozenset[str] | None = None  # state entries uploaded; None: every floating-point entry

    @property
    def full(self) -> bool:
        return self.trainable is None

    def uploads(self, name: str) -> bool:
        return self.upload is None or name in self.upload


class FullPlanner:
    """Every sampled client trains and uploads its whole (sub-)model."""

    def __init__(self, clients: int, groups: int, federation_of: Callable[[int], int]):
        self.clients, self.groups, self.federation_of = clients, groups, federation_of
        self.sizes = Counter(federation_of(group_of(c, clients, groups)) for c in range(clients))

    def plan(self, round_: int, client: int) -> ClientPlan:
        group = group_of(client, self.clients, self.groups)
        federation = self.federation_of(group)
        return ClientPlan(client, group, federation, self.sizes[federation])

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A full plan has no state."""
