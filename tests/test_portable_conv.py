"""Portable numerics' convolutions (incofl.portable_conv): the same values as torch's own
convolution and its gradients, on random shapes, strides, paddings and dilations (float64, where
the order of the sums moves only the last bits); what it does not compute refused by name; and,
registered by numerics.activate, every CPU convolution of autograd computed by it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_numerics import python

from incofl import portable_conv


@st.composite
def convolutions(draw: st.DrawFn) -> dict:
    kernel = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    reach = [dilation[i] * (kernel[i] - 1) + 1 - 2 * padding[i] for i in (0, 1)]  # the least input side
    size = (max(reach[0], 1) + draw(st.integers(0, 6)), max(reach[1], 1) + draw(st.integers(0, 6)))
    return {
        "n": draw(st.integers(1, 4)),
        "c": draw(st.integers(1, 5)),
        "o": draw(st.integers(1, 6)),
        "size": size,
        "kernel": kernel,
        "stride": (draw(st.integers(1, 3)), draw(st.integers(1, 3))),
        "padding": padding,
        "dilation": dilation,
        "bias": draw(st.booleans()),
        "channels_last": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }


@settings(max_examples=60, deadline=None, database=None)  # nothing written into the checkout
@given(convolutions())
def test_forward_and_every_gradient_equal_torchs_own(spec):
    g = torch.Generator().manual_seed(spec["seed"])
    x = torch.randn(spec["n"], spec["c"], *spec["size"], generator=g, dtype=torch.float64)
    if spec["channels_last"]:
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(spec["o"], spec["c"], *spec["kernel"], generator=g, dtype=torch.float64)
    b = torch.randn(spec["o"], generator=g, dtype=torch.float64) if spec["bias"] else None
    geometry = (spec["stride"], spec["padding"], spec["dilation"])
    expected = torch.nn.functional.conv2d(x, w, b, *geometry)
    out = portable_conv.forward(x, w, b, *geometry)
    assert out.shape == expected.shape and torch.allclose(out, expected, rtol=1e-12, atol=1e-12)
    grad = torch.randn(expected.shape, generator=g, dtype=torch.float64)
    mask = [True, True, b is not None]
    bias_sizes = [spec["o"]] if b is not None else None
    want = torch.ops.aten.convolution_backward(grad, x, w, bias_sizes, *geometry, False, [0, 0], 1, mask)
    got = portable_conv.backward(grad, x, w, *geometry, tuple(mask))
    for name, mine, theirs in zip(("input", "weight", "bias"), got, want, strict=True):
        if theirs is None or not mask[("input", "weight", "bias").index(name)]:
            continue
        assert mine.shape == theirs.shape and torch.allclose(mine, theirs, rtol=1e-12, atol=1e-12), name


@pytest.mark.parametrize(
    ("x", "w", "transposed", "groups", "named"),
    [
        (torch.zeros(1, 4, 5, 5), torch.zeros(2, 2, 3, 3), False, 2, "groups=2"),
        (torch.zeros(1, 4, 5), torch.zeros(2, 4, 3), False, 1, "1-D"),
        (torch.zeros(1, 4, 5, 5), torch.zeros(4, 2, 3, 3), True, 1, "transposed"),
        (
            torch.zeros(1, 4, 5, 5, dtype=torch.float16),
            torch.zeros(2, 4, 3, 3, dtype=torch.float16),
            False,
            1,
            "float16",
        ),
    ],
)
def test_what_it_does_not_compute_is_refused_by_name(x, w, transposed, groups, named):
    with pytest.raises(portable_conv.UnsupportedConvolution, match=named):
        portable_conv.check(x, w, transposed, groups)


def test_registered_it_computes_every_cpu_convolution_and_its_gradients():
    """Under portable numerics, nn.Conv2d's output and autograd's gradients are portable_conv's bit
    for bit, with OpenBLAS on torch's thread count; a grouped convolution is refused in one line."""
    done = python("""
        from incofl.numerics import activate, pin
        pin("portable")
        import threadpoolctl, torch
        from incofl import portable_conv
        activate("portable")
        torch.set_num_threads(1)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(8, 3, 12, 12, generator=g, requires_grad=True)
        conv = torch.nn.Conv2d(3, 5, 3, stride=2, padding=1)
        out = conv(x)
        grad = torch.randn(out.shape, generator=g)
        out.backward(grad)
        geometry = ((2, 2), (1, 1), (1, 1))
        mine = portable_conv.forward(x.detach(), conv.weight.detach(), conv.bias.detach(), *geometry)
        gx, gw, gb = portable_conv.backward(grad, x.detach(), conv.weight.detach(), *geometry, (True, True, True))
        assert torch.equal(out.detach(), mine) and torch.equal(x.grad, gx)
        assert torch.equal(conv.weight.grad, gw) and torch.equal(conv.bias.grad, gb)
        print([i["num_threads"] for i in threadpoolctl.threadpool_info() if "numpy" in i["filepath"]])
        torch.nn.Conv2d(4, 4, 3, groups=2)(torch.zeros(1, 4, 5, 5))
    """)
    assert done.stdout.strip() == "[1]", done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "incofl.numerics.NumericsError: numerics: portable computes 2-D float32 and float64 convolutions of one "
        "group, not this one: groups=2"
    )
