"""The evaluate stage: every group's model on the global test set (the paper's metric), and
with `holdout` every client's model on its held-out data (personal accuracy)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from incofl.data.tensors import TensorSplit
from incofl.fl.client import count_correct, evaluate

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


class PersonalEvaluator:
    """Each client's model (its group's global weights with what the client keeps) on its
    held-out share of its data, as FedLAG's release measures at the start of a round after the
    broadcast: accuracy micro-averaged over clients (`personal_acc`), the population std of
    the per-client accuracies (`personal_acc_std`), and per model group."""

    def __init__(self, models: list[nn.Module], data: TensorSplit, held: list[np.ndarray], groups: list[int],
                 batch_size: int):  # fmt: skip
        self.models, self.data, self.held, self.groups, self.batch_size = models, data, held, groups, batch_size

    def __call__(self, client_state: Callable[[int, int], State]) -> dict[str, float]:
        accs, by_group = [], np.zeros((len(self.models), 3))  # per group: correct, loss, samples
        for client, indices in enumerate(self.held):
            if len(indices) == 0:
                continue
            group, model = self.groups[client], self.models[self.groups[client]]
            model.load_state_dict(client_state(client, group))
            correct, loss, n = count_correct(model, self.data, self.batch_size, indices=torch.from_numpy(indices))
            accs.append(100.0 * correct / n)
            by_group[group] += (correct, loss, n)
        correct, loss, n = by_group.sum(0)
        return {"personal_acc": 100.0 * correct / n, "personal_acc_std": float(np.std(accs)), "personal_loss": loss / n,
                **{f"personal_g{g}": 100.0 * c / m for g, (c, _, m) in enumerate(by_group) if m}}  # fmt: skip
