"""Similarity of representations: linear CKA (Kornblith et al., ICML 2019), from Gram matrices.

For representations X (n x p) and Y (n x q) of the same n inputs, linear CKA is
HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)) with K = X X^T and L = Y Y^T. Working from the
n x n Gram matrices lets the analyses keep one small matrix per client and layer instead of
its activations (a CIFAR stage output is 65,536 numbers an image), and compare layers of
different widths. The biased estimator centres the Grams (HSIC = <HKH, HLH>); the debiased one
uses the unbiased HSIC estimator (Song et al., JMLR 2012), which removes the bias towards 1 of
wide layers on few inputs (Nguyen et al., ICLR 2021) and can be slightly negative.
"""

from __future__ import annotations

import torch


def gram(x: torch.Tensor) -> torch.Tensor:
    """K = X X^T in float64, X = the representation flattened per input (n x features)."""
    flat = x.reshape(x.shape[0], -1).double()
    return flat @ flat.T


def _centered(k: torch.Tensor) -> torch.Tensor:
    return k - k.mean(0, keepdim=True) - k.mean(1, keepdim=True) + k.mean()


def _hsic_biased(k: torch.Tensor, l: torch.Tensor) -> torch.Tensor:  # noqa: E741
    return (_centered(k) * _centered(l)).sum()


def _hsic_unbiased(k: torch.Tensor, l: torch.Tensor) -> torch.Tensor:  # noqa: E741 (the papers' name)
    n = k.shape[0]
    k, l = k.clone().fill_diagonal_(0), l.clone().fill_diagonal_(0)  # noqa: E741
    ones = torch.ones(n, dtype=k.dtype, device=k.device)
    trace = (k * l).sum()
    return (trace + k.sum() * l.sum() / ((n - 1) * (n - 2)) - 2 * (ones @ k) @ (l @ ones) / (n - 2)) / (n * (n - 3))


def cka(k: torch.Tensor, l: torch.Tensor, debiased: bool = False) -> float:  # noqa: E741
    """Linear CKA of two Gram matrices of the same inputs (debiased: needs n >= 4 inputs)."""
    hsic = _hsic_unbiased if debiased else _hsic_biased
    denominator = torch.sqrt(hsic(k, k) * hsic(l, l))
    return float(hsic(k, l) / denominator) if denominator > 0 else float("nan")


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two same-shaped tensors (NaN if either is zero)."""
    a, b = a.flatten().double(), b.flatten().double()
    norms = a.norm() * b.norm()
    return float(a @ b / norms) if norms > 0 else float("nan")
