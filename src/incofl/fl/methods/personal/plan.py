"""Personalisation as plans: which state entries each client keeps for itself (`ClientPlan.keep`:
never uploaded, restored at its next round; the client side holds them, fl/stages/client.py).

`LocalPlanner` keeps everything (local training only), `FedPerPlanner` the classifier head
(FedPer, Arivazhagan et al. 2019), `LagPlanner` FedLAG's top-K conflicting entries
(docs/methods.md, FedLAG; arXiv 2410.02845): R_s + 1 warm-up rounds of FedAvg over every parameter
(R_s = min(T // 2, 30)) in which, for each parameter tensor (a weight and its bias apart) and
every unordered pair of the round's clients, the conflict count GC grows by one when
cos(g_i, g_j) < xi (a zero vector has cosine 0); g_i is the client's last mini-batch gradient
(the release) or its update. Then the K entries with the highest GC (ties: the earlier in the
model) stay personal: every client receives every other parameter each round and keeps its
own of those. `broadcast: false` is the released main branch, whose broadcast after warm-up
is a no-op: clients then train their own models only (local training after a FedAvg warm-up).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from incofl.fl.contracts import ClientPlan, ClientUpdate, Round, Setup, State
from incofl.fl.methods.personal.spec import LagParams
from incofl.fl.stages.component import Sent
from incofl.fl.stages.plan import FullPlanner
from incofl.models.family import check_nested


class KeepPlanner(FullPlanner):
    """Full rounds in which every client keeps the `personal` entries of its model (beside kept BN statistics)."""

    def __init__(self, hp: Any, setup: Setup):
        super().__init__(hp, setup)
        self.own = [frozenset(self.personal(m)) for m in setup.models]

    def personal(self, model: nn.Module) -> list[str]:
        raise NotImplementedError

    def plan(self, round_: Round, client: int) -> ClientPlan:
        full = super().plan(round_, client)
        return replace(full, keep=full.keep | self.own[full.group])


class LocalPlanner(KeepPlanner):
    """Local training only: every entry is kept, nothing is uploaded."""

    def personal(self, model: nn.Module) -> list[str]:
        return list(model.state_dict())


class FedPerPlanner(KeepPlanner):
    """FedPer: the classifier head (`fc`) is personal, the body is averaged."""

    def personal(self, model: nn.Module) -> list[str]:
        return [name for name, _ in model.named_parameters() if name.startswith("fc.")]


def conflict_counts(signals: list[dict[str, torch.Tensor]], entries: list[str], xi: float) -> np.ndarray:
    """Per entry, the number of unordered client pairs (among those holding it) whose signals
    have cosine similarity < xi; a zero vector has cosine 0 with everything."""
    counts = np.zeros(len(entries), dtype=np.int64)
    for i, name in enumerate(entries):
        holders = [s[name].flatten().double() for s in signals if name in s]
        if len(holders) < 2:
            continue
        vectors = torch.stack(holders)
        unit = vectors / vectors.norm(dim=1, keepdim=True).clamp_min(1e-300)  # a zero vector stays zero
        cosines = unit @ unit.T
        upper = torch.triu(torch.ones_like(cosines, dtype=torch.bool), diagonal=1)
        counts[i] = int((cosines[upper] < xi).sum())
    return counts


class LagPlanner(FullPlanner):
    """FedLAG (see the module docstring); its checkpoint holds the counts and the choice."""

    state = ("scores", "personal")
    scratch = ("signals",)  # within a warm-up round only
    sends = (Sent("last_grad", asked_by="last_grad"),)  # signal: last_grad (the trainer attaches them)

    def __init__(self, hp: Any, setup: Setup):
        super().__init__(hp, setup)
        models = setup.models
        self.hp: LagParams = hp
        self.warmup = hp.warmup or min(setup.settings.rounds // 2, 30) + 1
        self.entries = [name for name, _ in models[check_nested(models)].named_parameters()]
        self.names = [frozenset(m.state_dict()) for m in models]
        self.scores = np.zeros(len(self.entries), dtype=np.int64)
        self.personal: list[str] = []
        self.signals: list[State] = []  # the warm-up round's so far, in client order

    def plan(self, round_: Round, client: int) -> ClientPlan:
        full = super().plan(round_, client)
        if round_.number <= self.warmup:
            return replace(full, last_grad=self.hp.signal == "last_grad")
        names = self.names[full.group]
        own = names & frozenset(self.personal) if self.hp.broadcast else names
        return replace(full, keep=full.keep | own)

    def observe(self, round_: Round, update: ClientUpdate) -> None:
        """A warm-up round's update: its signal's parameters, copied (pairwise cosines need every
        client's; a pre transform may change the update's own tensors in place)."""
        if round_.number > self.warmup:
            return
        signal = update.extra["last_grad"] if self.hp.signal == "last_grad" else update.delta
        self.signals.append({name: signal[name].clone() for name in self.entries if name in signal})

    def round_end(self, round_: Round) -> None:
        if round_.number > self.warmup:
            return
        signals, self.signals = self.signals, []
        self.scores += conflict_counts(signals, self.entries, self.hp.xi)
        if round_.number == self.warmup:
            ranked = sorted(range(len(self.entries)), key=lambda i: (-self.scores[i], i))
            self.personal = [self.entries[i] for i in ranked[: self.hp.top_k]]

    def summary(self) -> dict[str, Any]:
        scores = {name: int(score) for name, score in zip(self.entries, self.scores, strict=True)}
        return {"personal_layers": self.personal, "conflict_scores": scores, "warmup_rounds": self.warmup}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "entries": self.entries}  # the entries: a resume's guard

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["entries"] != self.entries:
            raise ValueError("checkpoint made with other model parameters than this run's")
        super().load_state_dict(state)
