"""The evaluate stage: every group's model on the global test set (the paper's metric), and
with `holdout` every client's model on its held-out data (personal accuracy); `score` is the
one loop over a split that every evaluator (the width levels' too) scores with."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from incofl.data.tensors import TensorSplit
from incofl.fl.contracts import State
from incofl.models.family import exit_logits
from incofl.streams import EVAL_ORDER_SEED


@dataclass(frozen=True)
class Scores:
    """A model's scores on a split: per exit (one for a model without early exits) the correct
    predictions and the summed cross-entropy, and the samples scored."""

    correct: list[int]
    loss: list[float]
    n: int

    def accuracy(self, exit_: int = -1) -> float:
        """In percent, of the last exit unless asked."""
        return 100.0 * self.correct[exit_] / self.n

    def mean_loss(self, exit_: int = -1) -> float:
        return self.loss[exit_] / self.n


def batch_statistics(model: nn.Module) -> bool:
    """Whether the model's BN layers normalise with the batch's statistics at evaluation too
    (no running statistics: ScaleFL's ResNet-110, width models without static BN)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is None for m in model.modules())


def mixed_order(order: torch.Tensor) -> torch.Tensor:
    """`order` shuffled by a fixed seed, the same for every run and evaluation: all methods score
    the same batches. With batch statistics a prediction depends on the rest of its batch, and
    data sets read from class folders (the CIFAR-10 archive here) list each class together:
    scored in that order, every batch is one class and its statistics erase what tells classes
    apart (ScaleFL stayed near chance). torchvision's CIFAR-10 test set is mixed alike."""
    return order[torch.randperm(len(order), generator=torch.Generator().manual_seed(EVAL_ORDER_SEED))]


@torch.inference_mode()
def score(
    model: nn.Module, data: TensorSplit, batch_size: int, drop_last: bool = False, indices: torch.Tensor | None = None
) -> Scores:
    """The model on a split, or on `indices` of it; with `drop_last` on its full batches only
    (as released: 9,728 of CIFAR-10's 10,000 test images in batches of 512). A model that
    normalises with each batch's own statistics scores the samples in a fixed shuffled order
    (`mixed_order`). Counted on the device, the losses in float64 (each batch's float32 sum added
    as Python would add its `.item()`): one host sync per call, not two per batch."""
    model.eval()
    order = torch.arange(len(data)) if indices is None else indices
    if batch_statistics(model):
        order = mixed_order(order)
    n = scored_samples(len(order), batch_size, drop_last)
    correct = loss = None
    for batch in order[:n].split(batch_size):
        x, y = data.batch(batch)
        outs = [z.float() for z in exit_logits(model(x))]
        batch_loss = torch.stack([F.cross_entropy(z, y, reduction="sum") for z in outs]).double()
        batch_correct = torch.stack([(z.argmax(1) == y).sum() for z in outs])
        correct = batch_correct if correct is None else correct + batch_correct
        loss = batch_loss if loss is None else loss + batch_loss
    if correct is None:
        return Scores([0], [0.0], n)
    return Scores(correct.tolist(), loss.tolist(), n)


def scored_samples(count: int, batch_size: int, drop_last: bool = False) -> int:
    """How many of `count` samples `score` scores: with `drop_last` those in full batches (all
    when there are fewer than a batch)."""
    return count // batch_size * batch_size if drop_last and count >= batch_size else count


class GroupEvaluator:
    """Each model group's model on the global test set."""

    def __init__(self, models: list[nn.Module], test: TensorSplit, batch_size: int, drop_last: bool = False):
        self.models, self.test, self.batch_size, self.drop_last = models, test, batch_size, drop_last

    def score_group(self, group: int, state: State) -> Scores:
        """Group `group`'s model with `state` on the test set."""
        model = self.models[group]
        model.load_state_dict(state)
        return score(model, self.test, self.batch_size, self.drop_last)

    @staticmethod
    def combine(scores: list[Scores]) -> dict[str, float]:
        """mean_acc, mean_loss (unweighted over groups) and acc_g{g}, from each group's scores in order."""
        accs = [s.accuracy() for s in scores]
        return {
            "mean_acc": float(np.mean(accs)),
            "mean_loss": float(np.mean([s.mean_loss() for s in scores])),
            **{f"acc_g{g}": a for g, a in enumerate(accs)},
        }


class PersonalEvaluator:
    """Each client's model (its group's global weights with what the client keeps) on its
    held-out share of its data, as FedLAG's release measures at the start of a round after the
    broadcast: accuracy micro-averaged over clients (`personal_acc`), the population std of
    the per-client accuracies (`personal_acc_std`), and per model group."""

    def __init__(
        self,
        models: list[nn.Module],
        data: TensorSplit,
        held_out: Mapping[int, np.ndarray],
        groups: list[int],
        batch_size: int,
    ):
        self.models, self.data, self.held_out, self.groups, self.batch_size = models, data, held_out, groups, batch_size

    def score_client(self, client: int, state: State) -> Scores:
        """Client `client`'s model with `state` on its held-out samples."""
        model = self.models[self.groups[client]]
        model.load_state_dict(state)
        return score(model, self.data, self.batch_size, indices=torch.from_numpy(self.held_out[client]))


def personal_metrics(scores: dict[int, Scores], groups: list[int], models: int) -> dict[str, float]:
    """The personal metrics (PersonalEvaluator) from each scored client's held-out scores (a client
    missing from `scores` is left out); `groups`: each client's model group, of `models`."""
    accs, by_group = [], np.zeros((models, 3))  # per group: correct, loss, samples
    for client, s in sorted(scores.items()):  # in client order: the sums' rounding is fixed
        correct, loss, n = s.correct[-1], s.loss[-1], s.n
        accs.append(100.0 * correct / n)
        by_group[groups[client]] += (correct, loss, n)
    correct, loss, n = by_group.sum(0).tolist()  # plain floats: the metrics rows go into the checkpoint
    return {
        "personal_acc": 100.0 * correct / n,
        "personal_acc_std": float(np.std(accs)),
        "personal_loss": loss / n,
        **{f"personal_g{g}": 100.0 * c / m for g, (c, _, m) in enumerate(by_group.tolist()) if m},
    }
