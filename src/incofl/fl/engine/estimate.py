"""What a run costs, said before it starts: training sample-passes (exact: the sampling schedule
is drawn up front), training FLOPs (PyTorch's FlopCounterMode on each model group, forward and
backward), and, once the first round is trained, the time the remaining rounds take at its speed.
Full rounds are counted: FedPart's partial rounds cost less. Width levels drawn anew every round
(`rate_assignment: dynamic`) are counted as if fixed."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from incofl.fl.stages.sampling import group_of
from incofl.models.family import exit_logits
from incofl.streams import PROBE_INPUT_SEED

if TYPE_CHECKING:
    from incofl.fl.engine.server import Server


def training_flops(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """FLOPs of one training sample: forward and backward, counted by PyTorch's FlopCounterMode."""
    with FlopCounterMode(display=False) as counter:
        sum(F.cross_entropy(z, y) for z in exit_logits(model(x))).backward()  # every exit's loss
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / len(x)


class Work:
    """The training work of rounds `start` to the end of a run."""

    def __init__(self, server: Server, start: int):
        cfg, data, facts = server.settings, server.test, server.facts  # no training sample read
        gen = torch.Generator().manual_seed(PROBE_INPUT_SEED)  # its own generator: the run's draws stay untouched
        x = torch.rand((2, data.x.shape[1], data.input_size, data.input_size), generator=gen).to(data.x.device)
        y = torch.zeros(2, dtype=torch.long, device=data.x.device)
        per_sample = [training_flops(copy.deepcopy(m).eval(), x, y) for m in server.models]  # eval: no dropout draws
        sizes = [c.samples * cfg.local_epochs for c in facts.clients]
        rounds = [[int(c) for c in server.schedule[t]] for t in range(start, cfg.rounds)]
        self.round_passes = [sum(sizes[c] for c in clients) for clients in rounds]
        self.flops = sum(sizes[c] * per_sample[group_of(c, cfg.clients, cfg.groups)] for r in rounds for c in r)
        self.largest = max(per_sample)

    @property
    def passes(self) -> int:
        return sum(self.round_passes)

    def line(self) -> str:
        return (
            f"work: {self.passes:,} training sample-passes in {len(self.round_passes)} rounds, "
            f"{_si(self.flops, 'FLOP')} (largest model {_si(self.largest, 'FLOP')} a sample)"
        )

    def time_line(self, first_round_seconds: float) -> str:
        """The remaining rounds at the speed of the first one (which is often slower: warm-up)."""
        left = first_round_seconds * (self.passes - self.round_passes[0]) / max(self.round_passes[0], 1)
        return f"estimate: about {_duration(left)} for the remaining rounds at the first round's speed"


def _si(value: float, unit: str) -> str:
    """3 significant digits and an SI prefix: 934 FLOP, 12.5 MFLOP, 195 TFLOP."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"
