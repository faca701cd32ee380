"""The evaluate stage: every group's model on the global test set (the paper's metric)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from incofl.data.tensors import TensorSplit
from incofl.fl.client import evaluate

State = dict[str, torch.Tensor]


class GroupEvaluator:
    def __init__(self, models: list[nn.Module], test: TensorSplit, batch_size: int, drop_last: bool = False):
        self.models, self.test, self.batch_size, self.drop_last = models, test, batch_size, drop_last

    def __call__(self, sub_state: Callable[[int], State]) -> dict[str, float]:
        """mean_acc, mean_loss (unweighted over groups) and acc_g{g} per group."""
        accs, losses = [], []
        for group, model in enumerate(self.models):
            model.load_state_dict(sub_state(group))
            acc, loss = evaluate(model, self.test, self.batch_size, self.drop_last)
            accs.append(acc)
            losses.append(loss)
        return {"mean_acc": float(np.mean(accs)), "mean_loss": float(np.mean(losses)),
                **{f"acc_g{g}": a for g, a in enumerate(accs)}}  # fmt: skip
