"""Convolutions for portable numerics: one channels-last im2col and one GEMM of numpy's OpenBLAS
each way, so that their bits are one function of the inputs on every x86-64 CPU with AVX2.

numerics.py registers `convolution` and `convolution_backward` as ATen's CPU kernels of the
operators of the same names (so autograd, `F.conv2d` and every `nn.Conv2d` reach them). Why this
way (docs/workflow.md, "Bit for bit on any CPU"): oneDNN's convolutions block by the caches' sizes
and promise the same bits only on one platform; ATen's own fallback (im2col and one MKL GEMM per
sample, on MKL's SSE2-class compatible branch) is portable but 2-4x slower. OpenBLAS held to its
Haswell kernels (`OPENBLAS_CORETYPE=Haswell`: AVX2 and FMA3) blocks its GEMMs by constants fixed
when it was built, on any CPU, Intel or AMD; so each output's sum runs in one order everywhere.

Layout: an input of N images, C channels, H x W, is read as N x H x W x C (free when it is
channels-last already, as every output here is): a kernel's window is then kh runs of kw x C
contiguous numbers, which one strided copy gathers into the (N*Ho*Wo) x (kh*kw*C) matrix that
multiplies the kernel. Forward: cols @ W^T. Grad-weight: G^T @ cols (one GEMM over the batch, not
a sum of per-sample ones). Grad-input: G @ W, then each kernel tap's slice added into the padded
input's gradient, taps in a fixed order.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

Pair = tuple[int, int]


class UnsupportedConvolution(ValueError):
    """A convolution this path does not compute (numerics.py names it in one line)."""


def check(x: torch.Tensor, weight: torch.Tensor, transposed: bool, groups: int) -> None:
    """What this path computes: 2-D, not transposed, one group, float32 or float64."""
    import torch

    wrong = [f"{x.dim() - 2}-D"] if x.dim() != 4 else []
    wrong += ["transposed"] if transposed else []
    wrong += [f"groups={groups}"] if groups != 1 else []
    if x.dtype not in (torch.float32, torch.float64) or weight.dtype != x.dtype:
        wrong.append(f"{x.dtype} by {weight.dtype}")
    if wrong:
        raise UnsupportedConvolution(", ".join(wrong))


def match_threads() -> None:
    """numpy's OpenBLAS computing with torch's thread count (a GEMM's bits depend on it)."""
    import torch

    threads = torch.get_num_threads()
    if _blas_threads[0] != threads:
        _openblas().limit(limits=threads)
        _blas_threads[0] = threads


_blas_threads = [0]  # what match_threads last set


@functools.cache
def _openblas():  # noqa: ANN202 (threadpoolctl's controller)
    """threadpoolctl's controller of numpy's OpenBLAS."""
    import threadpoolctl

    return threadpoolctl.ThreadpoolController().select(internal_api="openblas")


def output_size(size: Pair, kernel: Pair, stride: Pair, padding: Pair, dilation: Pair) -> Pair:
    """Ho, Wo of a convolution (torch.nn.Conv2d's formula)."""
    h, w = ((size[i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in (0, 1))
    return h, w


def forward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: Pair, padding: Pair, dilation: Pair
) -> torch.Tensor:
    """`F.conv2d(x, weight, bias, stride, padding, dilation)`, channels-last."""
    o, _, kh, kw = weight.shape
    n = x.shape[0]
    ho, wo = output_size(x.shape[2:], (kh, kw), stride, padding, dilation)
    cols = _columns(_padded(x, padding), (kh, kw), (ho, wo), stride, dilation)
    out = _gemm(cols, _kernel_rows(weight).numpy().T)  # (n*ho*wo, o)
    if bias is not None:
        out += bias
    return out.view(n, ho, wo, o).permute(0, 3, 1, 2)


def backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    stride: Pair,
    padding: Pair,
    dilation: Pair,
    mask: tuple[bool, bool, bool],
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The gradients of `forward`'s output `grad` with respect to (x, weight, bias), each where `mask` asks."""
    o, c, kh, kw = weight.shape
    n, ho, wo = grad.shape[0], grad.shape[2], grad.shape[3]
    rows = grad.permute(0, 2, 3, 1).reshape(n * ho * wo, o).numpy()  # a view when grad is channels-last
    grad_x = grad_w = grad_b = None
    if mask[1]:
        cols = _columns(_padded(x, padding), (kh, kw), (ho, wo), stride, dilation)
        grad_w = _gemm(rows.T, cols).view(o, kh, kw, c).permute(0, 3, 1, 2).contiguous()
    if mask[0]:
        taps = _gemm(rows, _kernel_rows(weight).numpy()).view(n, ho, wo, kh, kw, c)
        grad_x = _scatter(taps, x.shape, stride, padding, dilation)
    if mask[2]:
        grad_b = grad.sum((0, 2, 3))
    return grad_x, grad_w, grad_b


def _padded(x: torch.Tensor, padding: Pair) -> torch.Tensor:
    """x as a contiguous N x (H + 2ph) x (W + 2pw) x C tensor, zeros around."""
    ph, pw = padding
    nhwc = x.permute(0, 2, 3, 1)
    if ph == pw == 0:
        return nhwc.contiguous()
    n, h, w, c = nhwc.shape
    out = x.new_zeros((n, h + 2 * ph, w + 2 * pw, c))
    out[:, ph : ph + h, pw : pw + w] = nhwc
    return out


def _columns(padded: torch.Tensor, kernel: Pair, out: Pair, stride: Pair, dilation: Pair) -> np.ndarray:
    """The (N*Ho*Wo) x (kh*kw*C) matrix of every output's window, rows in (n, y, x) order, columns (i, j, c)."""
    n, _, _, c = padded.shape
    s = padded.stride()
    windows = padded.as_strided(
        (n, *out, *kernel, c),
        (s[0], s[1] * stride[0], s[2] * stride[1], s[1] * dilation[0], s[2] * dilation[1], s[3]),
    )
    return windows.reshape(n * out[0] * out[1], kernel[0] * kernel[1] * c).numpy()


def _kernel_rows(weight: torch.Tensor) -> torch.Tensor:
    """The kernel as O x (kh*kw*C), columns in `_columns`' order."""
    o = weight.shape[0]
    return weight.permute(0, 2, 3, 1).reshape(o, -1)


def _gemm(a: np.ndarray, b: np.ndarray) -> torch.Tensor:
    """a @ b by numpy's OpenBLAS (sgemm or dgemm; a transposed operand is passed as such, not copied)."""
    import torch

    return torch.from_numpy(np.matmul(a, b))


def _scatter(taps: torch.Tensor, shape: torch.Size, stride: Pair, padding: Pair, dilation: Pair) -> torch.Tensor:
    """The input's gradient from each window's (N x Ho x Wo x kh x kw x C): every tap's slice added
    into the padded gradient, taps in row-major order (one order of the sums on every CPU)."""
    n, c, h, w = shape
    _, ho, wo, kh, kw, _ = taps.shape
    ph, pw = padding
    padded = taps.new_zeros((n, h + 2 * ph, w + 2 * pw, c))
    for i in range(kh):
        for j in range(kw):
            top, left = i * dilation[0], j * dilation[1]
            rows = slice(top, top + (ho - 1) * stride[0] + 1, stride[0])
            columns = slice(left, left + (wo - 1) * stride[1] + 1, stride[1])
            padded[:, rows, columns] += taps[:, :, :, i, j]
    return padded[:, ph : ph + h, pw : pw + w].permute(0, 3, 1, 2)
