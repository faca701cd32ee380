"""InCo Aggregation (Chan et al., ICLR 2024): internal cross-layer gradients, the family's one
stage of its own (`InCoStep`, after aggregation) and its theta/beta log (`InCoLog`, inco.csv).
The registry combines the step with any base method's other stages (InCoAvg, InCoProx, ...,
InCoHeteroFL).

Every variant computes T' = (t + c * r) * s for each target update T and its shallow
reference R, where (t, r, s) are either normalised (T/|T|, R/|R|, (|T|+|R|)/2) or raw
(T, R, 1) and c is the coefficient of the shallow gradient:

- ``official`` (the authors' code, default): norms, alpha = <R,R> and beta = <R,T> per
  kernel slice (o, i) on the raw tensors; c = clamp(|beta| / (alpha + eps), 0, clamp_max);
  T' clipped elementwise to [-clip, clip]. Vectors (ViT norms) count as one slice.
- ``paper`` (Theorem 3.1 / Algorithm 1): per whole tensor, alpha = <r,r> and beta = <r,t>
  after normalisation; mode ``always``: c = -beta/alpha; ``projection``: c = max(0, -beta/alpha).

Ablations: ``normalize=False`` uses raw t, r and s = 1; ``optimize=False`` sets c = 1.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from incofl.fl.contracts import Average, RoundContext, RoundReport, Setup
from incofl.fl.methods.inco.spec import InCoParams
from incofl.fl.stages.observers import Observer
from incofl.fl.stages.transforms import AverageTransform

_RESNET_CONV = re.compile(r"^layer(\d+)\.(\d+)\.conv([12])\.weight$")
_VIT_NORM2 = re.compile(r"^blocks\.(\d+)\.norm2\.weight$")


def find_pairs(names: Iterable[str]) -> dict[str, str]:
    """Map each InCo target to its reference.

    ResNet: in each stage, conv1/conv2 of blocks 1..n read the stage's block-0 conv2.
    ViT: ``blocks.i.norm2.weight`` reads ``blocks.i.norm1.weight``. Pairs whose reference
    is missing from `names` are left out; the reference itself is never a target.
    """
    names = set(names)
    pairs = {}
    for name in sorted(names):
        if m := _RESNET_CONV.match(name):
            stage, block, _ = m.groups()
            ref = f"layer{stage}.0.conv2.weight"
            if int(block) >= 1 and ref in names:
                pairs[name] = ref
        elif m := _VIT_NORM2.match(name):
            ref = f"blocks.{m.group(1)}.norm1.weight"
            if ref in names:
                pairs[name] = ref
    return pairs


def vit_pairs(pairs: Mapping[str, str]) -> bool:
    """Whether the pairs are the ViT family's (norm2 reads norm1)."""
    return any(_VIT_NORM2.match(target) for target in pairs)


@dataclass(frozen=True)
class InCoOptions:
    variant: str = "official"  # "official" | "paper"
    mode: str = "always"  # paper variant: "always" | "projection"
    normalize: bool = True
    optimize: bool = True
    eps: float = 1e-7
    clamp_max: float = 5.0  # official: upper bound of c
    clip: float = 0.1  # official: elementwise bound of T'

    def __post_init__(self) -> None:
        if self.variant not in ("official", "paper"):
            raise ValueError(f"inco variant must be 'official' or 'paper', not {self.variant!r}")
        if self.mode not in ("always", "projection"):
            raise ValueError(f"inco mode must be 'always' or 'projection', not {self.mode!r}")


def _columns(x: torch.Tensor, variant: str) -> torch.Tensor:
    """(entries, slices): kernel slices (o, i) for official convs, else the whole tensor as one
    slice. Slices are columns so per-slice sums reduce over dim 0, which is fast on CPU."""
    rows = x.reshape(x.shape[0] * x.shape[1], -1) if variant == "official" and x.dim() > 2 else x.reshape(1, -1)
    return rows.t().contiguous()


def cross_layer(
    target: torch.Tensor, ref: torch.Tensor, opts: InCoOptions
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(T', c per slice, beta per slice) for one target/reference pair.

    Written as T' = T * (s / |T|) + R * (c * s / |R|) (normalised) or T + c * R (raw), which is
    (t + c r) s with per-slice scalars, so only three reductions touch the full tensors."""
    dtype = torch.promote_types(target.dtype, torch.float32)  # half updates are computed in float32
    T, R = _columns(target.to(dtype), opts.variant), _columns(ref.to(dtype), opts.variant)
    tt, rr, rt = (T * T).sum(0), (R * R).sum(0), (R * T).sum(0)
    if opts.normalize:
        tn, rn = tt.sqrt(), rr.sqrt()
        t_scale, r_scale, s = 1 / (tn + opts.eps), 1 / (rn + opts.eps), (tn + rn) / 2
    else:
        t_scale = r_scale = s = torch.ones_like(tt)
    # official: statistics on the raw slices; paper: on the (possibly normalised) vectors
    if opts.variant == "official":
        alpha, beta = rr, rt
    else:
        alpha, beta = rr * r_scale**2, rt * r_scale * t_scale
    if not opts.optimize:
        c = torch.ones_like(beta)
    elif opts.variant == "official":
        c = (beta.abs() / (alpha + opts.eps)).clamp(0.0, opts.clamp_max)
    else:
        c = -beta / (alpha + opts.eps)
        if opts.mode == "projection":
            c = c.clamp(min=0.0)
    out = T * (t_scale * s) + R * (c * r_scale * s)
    if opts.variant == "official":
        out = out.clamp_(-opts.clip, opts.clip)
    return out.t().reshape(target.shape).to(target.dtype), c, beta


def cross_layer_update(
    update: Mapping[str, torch.Tensor],
    pairs: Mapping[str, str],
    *,
    variant: str = "official",
    mode: str = "always",
    normalize: bool = True,
    optimize: bool = True,
    stats: dict[str, dict[str, float]] | None = None,
    covered: Mapping[str, torch.Tensor] | None = None,
    **options: float,
) -> dict[str, torch.Tensor]:
    """Apply InCo to an (averaged) update. Returns a new dict; non-targets are unchanged.

    All targets read the unmodified update (no chaining). Pairs whose target or reference is
    absent from `update` are skipped. With `covered` (width splitting: per entry, the elements
    some client covered this round), a target changes only where both it and its reference were
    covered, computed on those elements alone (the rest read as 0); covered everywhere, this is the
    plain step. If `stats` is given, it receives per target the mean coefficient ``theta``,
    mean ``beta`` and the share of slices with beta > 0, ``beta_pos``, over the slices changed.
    `options` are the remaining InCoOptions fields (eps, clamp_max, clip).
    """
    opts = InCoOptions(variant=variant, mode=mode, normalize=normalize, optimize=optimize, **options)
    out = dict(update)
    for target, ref in pairs.items():
        if target not in update or ref not in update:
            continue
        T, R = update[target], update[ref]
        if covered is not None:
            both = covered[target] & covered[ref]
            if not both.any():
                continue
            T, R = T * both, R * both
        out[target], c, beta = cross_layer(T, R, opts)
        if covered is not None:
            out[target] = torch.where(both, out[target], update[target])
            changed = _columns(both.to(c.dtype), opts.variant).amax(0) > 0
            c, beta = c[changed], beta[changed]
        if stats is not None:
            stats[target] = {
                "theta": c.mean().item(),
                "beta": beta.mean().item(),
                "beta_pos": (beta > 0).float().mean().item(),
            }
    return out


class InCoStep(AverageTransform):
    """Internal cross-layer gradients on the averaged update (`cross_layer_update`). Pairs whose
    target or reference is not in the update (not uploaded this round) are skipped. The official variant's
    ViT form first divides the update by the number of local epochs (the authors' ViT path),
    unless the engine's EpochScale did for every method (`vit_epoch_scale: all`)."""

    def __init__(self, hp: Any, setup: Setup):
        super().__init__(hp, setup)
        self.pairs = find_pairs(setup.state_names)
        self.options = {k: getattr(hp, k) for k in InCoParams.model_fields}
        self.stats: dict[str, dict[str, float]] = {}
        vit = vit_pairs(self.pairs) and hp.variant == "official" and not setup.settings.scales_epochs
        self.scale = 1.0 / setup.settings.local_epochs if vit else 1.0

    def __call__(self, average: Average, ctx: RoundContext) -> Average:
        if self.scale != 1.0:
            for v in average.values():
                v.mul_(self.scale)
        return cross_layer_update(average, self.pairs, stats=self.stats, covered=ctx.covered, **self.options)

    def diagnostics(self) -> dict[str, dict[str, float]]:
        stats, self.stats = self.stats, {}
        return stats


class InCoLog(Observer):
    """inco.csv: per round and target layer, the mean coefficient theta (c), mean beta and the
    share of slices with beta > 0 (paper Table 3)."""

    filename = "inco.csv"

    def observe(self, report: RoundReport) -> None:
        self.rows += [{"round": report.round, "layer": k, **v} for k, v in report.diagnostics.items()]
