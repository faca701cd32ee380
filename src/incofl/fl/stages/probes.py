"""The paper's analyses as probes: observers of the round that also look at its trained models
(config `analyses`; docs/analyses.md; their tables and figures: report/analyses.py).

An observer that `wants` a round is shown, besides the round's report, the models its
clients trained (`see_clients`, before any transform touches their updates) and each
federation's averaged update before and after the server's transforms (`see_average`). A run
whose `analyses` lists no rounds builds none of these, so the round loop is unchanged.

- `CKAProbe` (cka.csv, update_similarity.csv): linear CKA (fl/stages/similarity.py) between every
  pair of the round's trained clients, at every stage and block output both models have, on
  one probe batch of test images (the same for every run); and the cosine of their updates of
  every weight tensor both hold (paper Figs. 1, 2a-b, 10).
- `UpdateHistogram` (gradients.csv): histograms of the averaged update of every conv and linear
  weight, before ("aggregated") and after ("applied") the server's transforms, on the same
  bins (Figs. 2c-d, 3).
- `FeatureMap` (tsne.csv): a t-SNE (scikit-learn) of the penultimate features of one trained
  client per listed model group on test images of the listed classes (Fig. 9d-f).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import combinations
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from incofl.config import ConfigError
from incofl.data.tensors import TensorSplit
from incofl.fl.contracts import State, Trained
from incofl.fl.stages.observers import Observer, write_rows
from incofl.fl.stages.similarity import cka, cosine, gram
from incofl.streams import PROBE_SEED, fixed_generator

if TYPE_CHECKING:
    from incofl.sides import ServerSettings

STAGE, BLOCK = re.compile(r"layer\d+"), re.compile(r"(layer\d+|blocks)\.\d+")


def probe_points(model: nn.Module) -> dict[str, str]:
    """Stage and block outputs, in network order: module name -> "stage" or "block"."""
    points = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Identity):
            continue
        if STAGE.fullmatch(name):
            points[name] = "stage"
        elif BLOCK.fullmatch(name):
            points[name] = "block"
    return points


@contextmanager
def grams_of(model: nn.Module, points: dict[str, str], grams: dict[str, torch.Tensor]) -> Iterator[None]:
    """Forward hooks that store each probe point's Gram matrix (not its activations)."""
    modules = dict(model.named_modules())

    def hook(name: str):
        def store(_module: nn.Module, _inputs: tuple, output: torch.Tensor) -> None:
            grams[name] = gram(output).cpu()

        return store

    handles = [modules[name].register_forward_hook(hook(name)) for name in points]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class ModelProbe(Observer):
    """An analysis of the models clients trained in the listed rounds: loads a client's weights
    into its group's model object (the trainer reloads its own before every client)."""

    def __init__(self, rounds: list[int], models: list[nn.Module], test: TensorSplit):
        super().__init__()
        self.rounds, self.models, self.test = set(rounds), models, test

    def wants(self, round_: int) -> bool:
        return round_ in self.rounds

    def loaded(self, client: Trained) -> nn.Module:
        """The client's group model holding its trained weights, in evaluation mode."""
        model = self.models[client.group]
        model.load_state_dict(client.state)
        model.eval()
        return model


class CKAProbe(ModelProbe):
    filename = "cka.csv"
    state = ("rows", "similarity")

    def __init__(self, rounds: list[int], models: list[nn.Module], test: TensorSplit, samples: int):
        super().__init__(rounds, models, test)
        self.points = [probe_points(m) for m in models]
        if not any(self.points):
            raise ConfigError("analyses.cka_rounds: the model has no stage or block outputs to compare")
        order = fixed_generator(PROBE_SEED).permutation(len(test))[: min(samples, len(test))]
        self.images = torch.from_numpy(np.sort(order))
        self.similarity: list[dict] = []  # update_similarity.csv

    def see_clients(self, round_: int, trained: list[Trained]) -> None:
        grams = [self.grams(t) for t in trained]
        for (a, ka), (b, kb) in combinations(zip(trained, grams, strict=True), 2):
            pair = {"round": round_, "client_a": a.client, "client_b": b.client, "group_a": a.group, "group_b": b.group}
            self.rows += [
                {
                    **pair,
                    "layer": name,
                    "kind": kind,
                    "cka": cka(ka[name], kb[name]),
                    "cka_debiased": cka(ka[name], kb[name], debiased=True),
                }
                for name, kind in self.points[a.group].items()
                if name in kb
            ]
            if a.view is None and b.view is None:  # width levels' equal shapes may sit in other places
                self.similarity += [
                    {**pair, "layer": k, "cosine": cosine(a.delta[k], b.delta[k])}
                    for k, v in a.delta.items()
                    if v.dim() > 1 and k in b.delta and b.delta[k].shape == v.shape
                ]

    @torch.inference_mode()
    def grams(self, client: Trained) -> dict[str, torch.Tensor]:
        grams: dict[str, torch.Tensor] = {}
        x, _ = self.test.batch(self.images.to(self.test.x.device))
        model = self.loaded(client)
        with grams_of(model, self.points[client.group], grams):
            model(x)
        return grams

    def write(self, out_dir) -> None:
        super().write(out_dir)
        write_rows(out_dir / "update_similarity.csv", self.similarity)


class FeatureMap(ModelProbe):
    filename = "tsne.csv"

    def __init__(self, rounds: list[int], models: list[nn.Module], test: TensorSplit, settings: ServerSettings):
        super().__init__(rounds, models, test)
        a = settings.analyses
        self.groups, self.seed = a.tsne_groups, settings.seed
        labels = test.y.cpu().numpy()
        missing = [c for c in a.tsne_classes if c not in set(labels.tolist())]
        if missing:
            raise ConfigError(f"analyses.tsne_classes: class {missing[0]} has no test images")
        self.images = torch.from_numpy(
            np.concatenate([np.flatnonzero(labels == c)[: a.tsne_per_class] for c in a.tsne_classes])
        )
        if not all(hasattr(m, "features") for m in models):
            raise ConfigError(f"analyses.tsne_rounds: {settings.models[0]} has no penultimate features to map")

    def chosen(self, trained: list[Trained]) -> list[Trained]:
        """One client of each listed group (each listed group taken in client order)."""
        free = sorted(trained, key=lambda t: t.client)
        picked = []
        for group in self.groups:
            match = next((t for t in free if t.group == group), None)
            if match is not None:
                picked.append(match)
                free.remove(match)
        return picked

    def see_clients(self, round_: int, trained: list[Trained]) -> None:
        from sklearn.manifold import TSNE  # imported here: it costs every training process a second

        picked = self.chosen(trained)
        if not picked:
            return
        x, y = self.test.batch(self.images.to(self.test.x.device))
        features = [self.features(t, x) for t in picked]
        points = np.concatenate(features)
        perplexity = min(30.0, (len(points) - 1) / 3)
        xy = TSNE(2, perplexity=perplexity, init="pca", random_state=self.seed).fit_transform(points)
        labels = y.cpu().numpy()
        for i, t in enumerate(picked):
            block = xy[i * len(labels) : (i + 1) * len(labels)]
            self.rows += [
                {
                    "round": round_,
                    "client": t.client,
                    "group": t.group,
                    "label": int(c),
                    "x": float(p[0]),
                    "y": float(p[1]),
                }
                for c, p in zip(labels, block, strict=True)
            ]

    @torch.inference_mode()
    def features(self, client: Trained, x: torch.Tensor) -> np.ndarray:
        model = self.loaded(client)
        embed = getattr(model, "embed", model.features)
        return embed(x).float().cpu().numpy()


class UpdateHistogram(Observer):
    filename = "gradients.csv"

    def __init__(self, rounds: list[int], bins: int):
        super().__init__()
        self.rounds, self.bins = set(rounds), bins

    def wants(self, round_: int) -> bool:
        return round_ in self.rounds

    def see_average(self, round_: int, federation: int, aggregated: State, applied: State) -> None:
        for name, before in aggregated.items():
            if before.dim() < 2 or not before.is_floating_point():  # conv and linear weights
                continue
            after = applied[name]
            edge = float(torch.maximum(before.abs().max(), after.abs().max())) or 1.0
            edges = np.linspace(-edge, edge, self.bins + 1)
            for which, values in (("aggregated", before), ("applied", after)):
                counts = torch.histc(values.float().cpu(), self.bins, -edge, edge).long().tolist()
                self.rows += [
                    {
                        "round": round_,
                        "federation": federation,
                        "layer": name,
                        "which": which,
                        "bin_left": float(edges[i]),
                        "bin_right": float(edges[i + 1]),
                        "count": n,
                    }
                    for i, n in enumerate(counts)
                ]


def analyses_for(settings: ServerSettings, models: list[nn.Module], test: TensorSplit) -> list[Observer]:
    """The observers the config's `analyses` asks for (none when it lists no rounds)."""
    a, out = settings.analyses, []
    if a.cka_rounds:
        out.append(CKAProbe(a.cka_rounds, models, test, a.probe_samples))
    if a.gradient_rounds:
        out.append(UpdateHistogram(a.gradient_rounds, a.gradient_bins))
    if a.tsne_rounds:
        out.append(FeatureMap(a.tsne_rounds, models, test, settings))
    return out
