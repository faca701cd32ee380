"""The one protocol of every stage component: what it carries from round to round.

Every component of a round's stages (the objective, the aggregator, the transforms before and
after aggregation, the planner, the observers, the layout) derives from `Stateful`. The engine
checkpoints each of them by its role (`Engine.components`), so a component that keeps state
(a server momentum buffer, FedRolex's counts, SCAFFOLD's control variates) only returns it
from `state_dict` and takes it back in `load_state_dict`: a resumed run then equals the run
never stopped. The default is no state. Components are built from the method's typed
parameters and the run's `Setup` (fl/contracts.py), `cls(hp, setup)`; the layout, which builds
the models the Setup names, from its `LayoutInputs`.
"""

from __future__ import annotations

from typing import Any


class Stateful:
    """A stage component; its state across rounds is empty unless it says otherwise."""

    def state_dict(self) -> dict[str, Any]:
        """What the component carries to the next round (tensors on the CPU or copies: the
        checkpoint must not move on with the run)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
