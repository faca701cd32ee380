"""The plan stage: what each sampled client trains and uploads this round.

A planner hands every sampled client its instructions for the round (Flower's
`configure_fit`): its model group, the server state (federation) it trains from, and which
parameters it trains and which state entries it uploads. `FullPlanner` trains and uploads
the whole (sub-)model; `PartPlanner` (FedPart) plans one layer group in most rounds.

FedPart (Wang et al., "Why Go Full? Elevating Federated Learning Through Partial Network
Updates", NeurIPS 2024), METHODS.md 5.1: a cycle is W full rounds, then R rounds for each of
the G layer groups of the server model (models/groups.py), L = W + R*G rounds in all; in
round t, p = t mod L < W is a full round, else group (p - W) // R of the cycle's order
trains, and only it is uploaded: its parameters and its BN running statistics (the engine
averages BN statistics like weights; the running statistics of the frozen BN layers also
move in local training, in train mode, and are discarded with the rest of the local model).
Orders: `sequential` (the release), `reverse` (the first draft), `random`: a fresh
permutation of the groups per cycle drawn from the run seed (our definition; the poster's
random order was never released). `schedule: once` (the draft's "Base"): one warm-up of W
full rounds, then the groups in turn for ever (under `random`, a fresh permutation for each
pass over the groups).

`bn_stats: local` (the release, in its FedPart and full-update runs alike): each client keeps
its BatchNorm running statistics for itself (`keep`): they are never uploaded, and its next
round starts from them (simulation.py restores them, and evaluates each model group with the
statistics of its first client, as the release evaluates client 0's model).

A client whose model is shallower than the server model (stage splitting) trains, when the
scheduled group is not in its model, the same layer of the deepest earlier block of the same
stage (`counterpart`): every model group trains something each round and goes through all
its groups in a cycle. The poster's setting has one model (`models: [resnet8]`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from torch import nn

from incofl.fl.contracts import ClientPlan, ClientUpdate, Setup
from incofl.fl.sampling import group_of
from incofl.models.family import check_nested
from incofl.models.groups import counterpart, layer_groups
from incofl.streams import Stream, generator


def bn_statistics(model: nn.Module) -> frozenset[str]:
    """The state entries of every BatchNorm layer that are not parameters (running statistics)."""
    norms = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    return frozenset(f"{name}.{buffer}" for name, m in norms for buffer, _ in m.named_buffers(recurse=False))


class FullPlanner:
    """Every sampled client trains and uploads its whole (sub-)model. A planner is built from the
    method's parameters, the run's Setup (config, server entries, width levels), the model groups'
    models and the aggregator's map of a model group to its federation."""

    def __init__(self, hp: Any, setup: Setup, models: list[nn.Module], federation_of: Callable[[int], int]):
        cfg = setup.cfg
        self.clients, self.groups, self.federation_of = cfg.clients, cfg.groups, federation_of
        self.sizes = Counter(federation_of(group_of(c, cfg.clients, cfg.groups)) for c in range(cfg.clients))
        self.keep = [bn_statistics(m) if cfg.bn_stats == "local" else frozenset() for m in models]

    def plan(self, round_: int, client: int) -> ClientPlan:
        group = group_of(client, self.clients, self.groups)
        federation = self.federation_of(group)
        return ClientPlan(client, group, federation, self.sizes[federation], keep=self.keep[group])

    def observe(self, round_: int, updates: list[ClientUpdate]) -> None:
        """After the round's aggregation: what later plans may depend on (FedLAG's conflicts)."""

    def summary(self) -> dict[str, Any]:
        """What summary.json reports of the plans (FedLAG: the personal layers)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A full plan has no state."""


class PartPlanner(FullPlanner):
    """FedPart's schedule (see the module docstring). A pure function of the round and the run
    seed; its checkpoint holds the server's group names, so a resumed run with other groups fails."""

    def __init__(self, hp: Any, setup: Setup, models: list[nn.Module], federation_of: Callable[[int], int]):
        super().__init__(hp, setup, models, federation_of)
        cfg = setup.cfg
        self.hp, self.seed = hp, cfg.seed
        self.keys = [g.key for g in layer_groups(models[check_nested(models)])]
        # model group -> its layer group for each of the server's
        self.layers = [[counterpart(key, layer_groups(m)) for key in self.keys] for m in models]

    def order(self, pass_: int) -> list[int]:
        """The server's layer groups in the order of one pass over them (one cycle under `cycles`)."""
        groups = len(self.keys)
        if self.hp.order == "random":
            return generator(self.seed, Stream.PART_ORDER, pass_).permutation(groups).tolist()
        return list(range(groups))[:: -1 if self.hp.order == "reverse" else 1]

    def layer(self, round_: int) -> int | None:
        """The server's layer group trained in a round (0-based), None in a full round."""
        warmup, per_group, groups = self.hp.warmup, self.hp.rounds_per_group, len(self.keys)
        if self.hp.schedule == "cycles":
            cycle, position = divmod(round_, warmup + per_group * groups)
        else:
            cycle, position = 0, round_
        if position < warmup:
            return None
        pass_, slot = divmod((position - warmup) // per_group, groups)  # pass_ > 0 only under `once`
        return self.order(cycle + pass_)[slot]

    def plan(self, round_: int, client: int) -> ClientPlan:
        full = super().plan(round_, client)
        layer = self.layer(round_)
        if layer is None:
            return full
        group = self.layers[full.group][layer]
        return replace(full, trainable=group.params, upload=group.params | group.stats)

    def state_dict(self) -> dict[str, Any]:
        return {"layer_groups": self.keys}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["layer_groups"] != self.keys:
            raise ValueError(f"checkpoint made with layer groups {state['layer_groups']}, this run has {self.keys}")
