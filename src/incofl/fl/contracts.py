"""The contracts between the round's stages: which round of the run (`Round`), what a planner
hands a client (`ClientPlan`), what local training sees (`ClientContext`) and returns
(`ClientUpdate`), which averaged update a post transform sees (`RoundContext`), a client's
trained model for the analyses (`Trained`), the round's report for the observers
(`RoundReport`), what a stage component is built from (`Setup`, with its side's record of the run's
settings: incofl.sides), and a width client's place in the global model (`View`).
Data only: the stages that produce and consume them live in their own modules."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeAlias

import torch
from torch import nn

if TYPE_CHECKING:
    from incofl.fl.stages.clientstore import ClientStore
    from incofl.fl.stages.layout import Layout
    from incofl.sides import ClientSettings, ServerSettings

# a side's record of the run's settings (incofl.sides): what a stage component is built with on its side
SideSettings: TypeAlias = "ServerSettings | ClientSettings"

State = dict[str, torch.Tensor]  # a model's state entries by name (weights, updates, averages)
Average = State  # one federation's averaged update
Index = tuple[torch.Tensor | None, ...]  # per dimension: the global indices a sub-tensor holds (None: all)
FULL_UNITS, PARTIAL_UNITS = 3, 2  # compute per sample pass: forward + backward (+ weight gradients when full)
BYTES_PER_PARAM = 4  # fp32 upload


@dataclass(frozen=True, eq=False)
class View:
    """One client's sub-model in one round: its group (a width level), each entry's index and the
    sub-model's share of the server model's per-sample FLOPs (compute cost)."""

    group: int
    index: dict[str, Index]
    cost: float = 1.0


@dataclass(frozen=True, order=True)
class Round:
    """A round of the run, one numbering end to end: `number` counts from 1 (what jobs carry and
    the run's files record), `index` is how many rounds come before it (the row of the seeded
    schedule, and the word every random stream is keyed by: the numbers of every run stay theirs).
    Round(0) is the state before any round (what an evaluation before training scores). Wherever a
    round travels (jobs, scores, evaluation, a federation's messages) it is a Round; a run's
    progress counts the rounds done (an int, `Run.done`)."""

    number: int

    @property
    def index(self) -> int:
        return self.number - 1

    @property
    def previous(self) -> Round:
        """The round before this one (Round(0) before the first)."""
        return Round(self.number - 1)

    @classmethod
    def upto(cls, rounds: int) -> list[Round]:
        """A run of `rounds` rounds, the first to the last."""
        return [cls(number) for number in range(1, rounds + 1)]


@dataclass(frozen=True)
class ClientPlan:
    client: int
    group: int
    federation: int  # the server state it trains from and updates
    federation_size: int  # clients in that federation (SCAFFOLD's K)
    trainable: frozenset[str] | None = None  # parameter names trained; None: all
    upload: frozenset[str] | None = None  # state entries uploaded; None: every floating-point entry
    keep: frozenset[str] = frozenset()  # state entries the client keeps for itself, never uploaded
    last_grad: bool = False  # attach the client's last mini-batch gradients to its update (extra["last_grad"])
    view: View | None = None  # width splitting: the block of the global model the client trains (slicing.py)

    @property
    def full(self) -> bool:
        return self.trainable is None

    def uploads(self, name: str) -> bool:
        return name not in self.keep and (self.upload is None or name in self.upload)

    def uploaded(self, state: State) -> list[str]:
        """The entries of `state` whose delta the client sends: every floating-point one it
        uploads (the trainer's rule for what it sends, and the server's for what it accepts)."""
        return [k for k, v in state.items() if v.is_floating_point() and self.uploads(k)]

    def upload_params(self, state: State, params: Iterable[str]) -> int:
        """The parameters (`params`: the model's parameter names; the rest is buffers) among the
        uploaded entries of `state`: what the cost accounting counts."""
        names = set(params)
        return sum(state[k].numel() for k in self.uploaded(state) if k in names)


@dataclass
class ClientContext:
    """What one client's local training sees."""

    client: int
    group: int
    round: Round
    model: nn.Module
    global_state: dict[str, torch.Tensor]  # the model's sub-state of the global weights (read-only)
    lr: float
    federation: int = 0  # the server state the client trains from: 0 if shared, else its group
    federation_size: int = 1  # clients in that federation: K if shared, the group's size for `groupwise`
    steps: int = 0
    rounds: int = 0  # rounds of the run (schedules inside a loss: ScaleFL's distillation start)
    classes: torch.Tensor | None = None  # the classes the client holds samples of (masked cross-entropy)


@dataclass
class ClientUpdate:
    """g_i = w_i - w for every uploaded floating-point state entry, with what aggregation needs."""

    client: int
    group: int
    delta: dict[str, torch.Tensor]
    num_samples: int
    steps: int
    federation: int = 0  # as in ClientContext
    extra: dict[str, Any] = field(default_factory=dict)  # what a session's `end` leaves for the server
    loss: float = float("nan")  # mean training loss over the local steps
    full: bool = True  # every parameter trained (compute: 3 units a sample; partial rounds 2)
    upload_params: int = 0  # parameters (not buffers) uploaded
    kept: dict[str, torch.Tensor] = field(default_factory=dict)  # entries the client keeps (bn_stats: local)
    view: View | None = None  # width splitting: where the (sub-shaped) deltas sit in the global model
    classes: torch.Tensor | None = None  # the classes the client holds (HeteroFL's classifier rows)

    def receipt(self) -> ClientUpdate:
        """This update without its tensors (deltas, extras, kept entries): what the round's
        report and contexts read of it once its tensors are folded into the round's sums."""
        return replace(self, delta={}, extra={}, kept={})


def own_federation(group: int) -> int:
    """Each model group its own server state (group-wise aggregation)."""
    return group


@dataclass(frozen=True)
class Setup:
    """What a stage component is built from, besides the method's typed parameters."""

    settings: SideSettings  # the run's settings on the component's side (incofl.sides)
    state_names: list[str]  # the server model's state entries
    layout: Layout | None = None  # the run's model layout (width splitting's components read its levels)
    models: list[nn.Module] = field(default_factory=list)  # one per model group (the layout's)
    federation: Callable[[int], int] = own_federation  # a model group -> the server state it trains (aggregator's)
    store: ClientStore | None = None  # the run's per-client state store (None: a component alone keeps its own)


@dataclass(frozen=True)
class RoundContext:
    """Which averaged update a post transform is given: the round, the server state
    (federation) it updates, how many clients and samples its updates came from and, with width
    splitting, per entry which elements some client covered (`covered`: the rest of the average
    is 0 and keeps the server's value). A post transform that keeps state (a server momentum
    buffer) keeps one per federation."""

    round: Round
    federation: int
    clients: int
    samples: int
    covered: State | None = None

    @classmethod
    def of(
        cls, round_: Round, federation: int, updates: list[ClientUpdate], covered: State | None = None
    ) -> RoundContext:
        """The context of `federation`'s average over the round's `updates` (every federation's;
        their receipts do)."""
        own = [u for u in updates if u.federation == federation]
        return cls(round_, federation, len(own), sum(u.num_samples for u in own), covered)


@dataclass
class Trained:
    """A client's model after local training this round."""

    client: int
    group: int
    state: State  # its weights: the round's start with the update added
    delta: State  # its update of every uploaded entry (the round's own tensors: read it in `see_clients`)
    view: View | None  # width splitting: where its (sub-shaped) entries sit in the global model


@dataclass
class RoundReport:
    round: int  # the number of the round just finished (Round.number)
    samples: int  # sample passes trained (epochs x samples, over the sampled clients)
    upload_bytes: int
    compute_units: int
    losses: dict[int, float]  # client -> mean local training loss
    diagnostics: dict[str, dict[str, float]] = field(default_factory=dict)  # e.g. InCo's per-layer theta/beta
    seconds: float = 0.0  # training time of the round
    missing: list[int] | None = None  # planned clients left out (a transport that can lose them; None: it cannot)

    @classmethod
    def of(cls, round_: int, updates: list[ClientUpdate], epochs: int, diagnostics: dict) -> RoundReport:
        passes = [epochs * u.num_samples for u in updates]
        units = round(
            sum(
                n * (FULL_UNITS if u.full else PARTIAL_UNITS) * (u.view.cost if u.view else 1.0)
                for n, u in zip(passes, updates, strict=True)
            )
        )
        return cls(
            round_,
            sum(passes),
            BYTES_PER_PARAM * sum(u.upload_params for u in updates),
            units,
            {u.client: u.loss for u in updates},
            diagnostics,
        )
