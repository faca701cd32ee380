"""FedPart (Wang et al., "Why Go Full? Elevating Federated Learning Through Partial Network
Updates", NeurIPS 2024): a cycle is W full rounds, then R rounds for each of
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

A client whose model is shallower than the server model (stage splitting) trains, when the
scheduled group is not in its model, the same layer of the deepest earlier block of the same
stage (`counterpart`): every model group trains something each round and goes through all
its groups in a cycle. The poster's setting has one model (`models: [resnet8]`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from incofl.fl.contracts import ClientPlan, Round, Setup
from incofl.fl.stages.plan import FullPlanner
from incofl.models.family import check_nested
from incofl.models.groups import counterpart, layer_groups
from incofl.streams import Stream, generator


class PartPlanner(FullPlanner):
    """FedPart's schedule (see the module docstring). A pure function of the round and the run
    seed; its checkpoint holds the server's group names, so a resumed run with other groups fails."""

    def __init__(self, hp: Any, setup: Setup):
        super().__init__(hp, setup)
        models = setup.models
        self.hp, self.seed = hp, setup.settings.seed
        self.keys = [g.key for g in layer_groups(models[check_nested(models)])]
        # model group -> its layer group for each of the server's
        self.layers = [[counterpart(key, layer_groups(m)) for key in self.keys] for m in models]

    def order(self, pass_: int) -> list[int]:
        """The server's layer groups in the order of one pass over them (one cycle under `cycles`)."""
        groups = len(self.keys)
        if self.hp.order == "random":
            return generator(self.seed, Stream.PART_ORDER, pass_).permutation(groups).tolist()
        return list(range(groups))[:: -1 if self.hp.order == "reverse" else 1]

    def layer(self, round_: Round) -> int | None:
        """The server's layer group trained in a round, None in a full round."""
        warmup, per_group, groups = self.hp.warmup, self.hp.rounds_per_group, len(self.keys)
        if self.hp.schedule == "cycles":
            cycle, position = divmod(round_.index, warmup + per_group * groups)
        else:
            cycle, position = 0, round_.index
        if position < warmup:
            return None
        pass_, slot = divmod((position - warmup) // per_group, groups)  # pass_ > 0 only under `once`
        return self.order(cycle + pass_)[slot]

    def plan(self, round_: Round, client: int) -> ClientPlan:
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
