"""Numerics: which floating-point kernels a CPU run computes with (the `numerics` setting).

`native` lets torch pick its fastest kernels for the CPU at hand, so a run's bits depend on the
CPU kind: ATen's vectorised kernels follow the instruction set (AVX2, AVX-512), MKL's SGEMM takes
another path on an AMD than on an Intel CPU, oneDNN's convolutions block by the caches' sizes,
and MKL's vector maths (VML), where ATen sends the sqrt, exp, log and a few more of CPU tensors,
follow the CPU's branch.

`portable` pins every one of those choices, so that a CPU run computes the same bits on every
x86-64 CPU with AVX2, Intel or AMD, AVX-512 or not (for one torch build and thread count):
ATen's AVX2 kernels (`ATEN_CPU_CAPABILITY=avx2`), MKL's conditional numerical reproducibility
on its compatible branch (`MKL_CBWR=COMPATIBLE`, the one branch MKL honours on AMD) for the
matrix products that remain MKL's (linear layers), convolutions as one im2col and one GEMM of
numpy's OpenBLAS held to its Haswell kernels (`OPENBLAS_CORETYPE=Haswell`: portable_conv.py,
registered as ATen's CPU convolution), and no VML: sqrt is computed by numpy (IEEE's correctly
rounded square root, the same bits on every CPU), and the other functions ATen sends to VML are
refused in one line (no method trains with them). The environment variables are read once, when
torch (or numpy's OpenBLAS) first loads, so `pin` must run before torch is imported; `activate`
then checks that each pin took effect and refuses in one line where one did not
(docs/workflow.md, "Bit for bit on any CPU").

`auto` is portable where its pins hold on this machine and native where they cannot (a torch
without MKL, as on every aarch64 CPU, or a CPU without AVX2): `decide` asks a fresh process
pinned for them, before the run's own process imports torch, and says why when they cannot.

This module imports no torch at its top: the CLI pins before it imports the engine.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn

if TYPE_CHECKING:
    import torch

    from incofl.portable_conv import Pair

Numerics = Literal["native", "portable"]
Requested = Literal["auto", "native", "portable"]  # what a config asks for; auto is decided per machine
PORTABLE_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "OPENBLAS_CORETYPE": "Haswell"}
OPENBLAS_VERSION = "0.3.31"  # numpy 2.4.6's wheels' OpenBLAS: its Haswell kernels and blocking are the pinned ones
MKL_CBWR_BRANCH, MKL_CBWR_COMPATIBLE = 1, 3  # mkl_service.h: the option to read, the branch wanted
# Unary functions of float CPU tensors whose bits follow MKL's branch (ATen computes them with MKL's
# VML): even on the compatible branch, sqrt's differed under emulated AVX2 CPUs (docs/workflow.md).
VML_FUNCTIONS = ("exp", "log", "erf", "erfc", "acos", "asin", "atan", "tan")
_kernels: list[object] = []  # the portable kernels' torch.library registration, kept alive once made


class NumericsError(RuntimeError):
    """A pin that cannot hold in this process or on this machine, as one line."""


def environment(mode: Numerics) -> dict[str, str]:
    """The variables a process that computes a `mode` run must start with."""
    return dict(PORTABLE_ENV) if mode == "portable" else {}


def conflicts(mode: Numerics, env: dict[str, str] | os._Environ[str] = os.environ) -> list[str]:
    """The variables of `env` that set a pin of `mode` to another value."""
    return [
        f"{key}={env[key]} (portable numerics need {key}={value})"
        for key, value in environment(mode).items()
        if key in env and env[key].upper() != value.upper()
    ]


def pin(mode: Numerics) -> None:
    """Set `mode`'s variables in this process; before torch is imported, or `activate` refuses.
    A variable the environment sets to another value is refused, not overridden: the user set it."""
    if bad := conflicts(mode):
        raise NumericsError(f"numerics: portable, but the environment sets {', '.join(bad)}")
    if mode == "portable" and not cpu_has_avx2():  # ATen would take the pin on trust and stop at its first kernel
        raise NumericsError("numerics: portable cannot hold here: this CPU has no AVX2")
    if "torch" not in sys.modules:  # else they would pin nothing here, only the child processes
        os.environ.update(environment(mode))


def cpu_has_avx2() -> bool:
    """Whether the CPU has AVX2 (and the OS its registers), as numpy's dispatch asked CPUID: torch-free,
    so before the pins, and true to an emulated CPU (QEMU's CPUID), unlike /proc/cpuinfo under qemu-user.
    Asked in a fresh process while numpy is not loaded here: loading it loads its OpenBLAS, which
    reads OPENBLAS_CORETYPE once, and the pins are not set yet."""
    if "numpy" not in sys.modules:
        done = subprocess.run([sys.executable, "-c", AVX2_PROBE], capture_output=True, text=True, check=True)
        return done.stdout.strip() == "True"
    from numpy._core._multiarray_umath import __cpu_features__

    return bool(__cpu_features__.get("AVX2"))


AVX2_PROBE = "from numpy._core._multiarray_umath import __cpu_features__ as f; print(bool(f.get('AVX2')))"


def activate(mode: Requested) -> Numerics:
    """Switch the convolution backends of `mode` and check every pin in effect (nothing for native);
    the numerics in effect: `auto` is portable where the pins hold in this process, else native."""
    if mode == "native":
        return "native"
    import torch

    if problem := obstacle():  # before this process is changed
        if mode == "auto":
            return "native"
        raise NumericsError(f"numerics: portable cannot hold here: {problem}")
    torch.backends.mkldnn.enabled = False  # no oneDNN kernel, whichever op would pick one
    _register_kernels()
    if problem := _conv_problem():
        raise NumericsError(f"numerics: portable cannot hold here: {problem}")
    return "portable"


def obstacle() -> str | None:
    """Why portable numerics cannot hold in this process (None: they can), from torch's kernels and MKL."""
    import torch

    problems = [
        _aten_problem(torch.backends.cpu.get_cpu_capability(), cpu_has_avx2()),
        _mkl_problem(mkl_branch()),
        _openblas_problem(openblas()),
    ]
    return "; ".join(p for p in problems if p) or None


# A fresh process pinned for portable numerics prints why they cannot hold there ('' where they can).
PROBE = "from incofl.numerics import obstacle; print(obstacle() or '')"


def decide(requested: Requested, device: str = "auto") -> tuple[Numerics, str | None]:
    """A run's numerics, decided before its process imports torch, and why auto is native here
    (None: as asked, or portable). A cuda run computes natively (portable pins CPU kernels)."""
    if requested != "auto":
        return requested, None
    if device == "cuda":
        return "native", None
    if bad := conflicts("portable"):
        return "native", f"the environment sets {', '.join(bad)}"
    env = {**os.environ, **PORTABLE_ENV}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
        raise NumericsError(f"numerics: auto: a process importing torch failed: {lines[-1]}")
    why = done.stdout.strip()
    return ("native", why) if why else ("portable", None)


def notice(why: str) -> str:
    """The one line a run under `auto` prints where portable numerics cannot hold, and what follows."""
    return (
        f"numerics: auto computes natively on this machine: portable numerics cannot hold here ({why}); the runs' "
        "bits differ from the committed runs', so `incofl compare` judges them on their accuracy (REPRODUCED, or "
        "INCONCLUSIVE with the seeds a yes would need), not bit for bit"
    )


def _aten_problem(capability: str, avx2: bool) -> str | None:
    """Why ATen does not compute with its AVX2 kernels; `avx2`: whether the CPU has AVX2, asked apart,
    as ATen takes ATEN_CPU_CAPABILITY=avx2 on trust (its AVX2 kernels would then stop the process)."""
    if not avx2:
        return "this CPU has no AVX2"
    if capability == "AVX2":
        return None
    if not capability.startswith("AVX512"):
        return f"ATen computes with {capability} kernels, not AVX2"
    return f"ATen computes with {capability} kernels: torch was imported before ATEN_CPU_CAPABILITY=avx2 was set"


def _mkl_problem(branch: int | None) -> str | None:
    if branch is None:
        return "this torch build has no MKL (portable numerics pin MKL's compatible branch)"
    if branch != MKL_CBWR_COMPATIBLE:
        return f"MKL computes on branch {branch}, not COMPATIBLE ({MKL_CBWR_COMPATIBLE}): MKL_CBWR was set too late"
    return None


def mkl_branch() -> int | None:
    """MKL's code branch as MKL reports it (`mkl_cbwr_get`), or None without MKL. torch links
    MKL statically and exports its service functions from libtorch_cpu."""
    import torch

    library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        get = ctypes.CDLL(str(library)).mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return None
    get.restype, get.argtypes = ctypes.c_int, [ctypes.c_int]
    return int(get(MKL_CBWR_BRANCH))


def openblas() -> tuple[str, str] | None:
    """(version, core type) of numpy's OpenBLAS as it reports them (threadpoolctl), or None: numpy
    links another BLAS."""
    import numpy  # noqa: F401 (loads its BLAS, which threadpoolctl then finds)
    import threadpoolctl

    for lib in threadpoolctl.threadpool_info():
        if lib.get("internal_api") == "openblas" and "numpy" in lib.get("filepath", ""):
            return str(lib.get("version")), str(lib.get("architecture"))
    return None


def _openblas_problem(found: tuple[str, str] | None) -> str | None:
    if found is None:
        return "numpy links no OpenBLAS of its own (portable convolutions need numpy's wheel's)"
    version, core = found
    if not version.startswith(OPENBLAS_VERSION):
        return f"numpy's OpenBLAS is {version}, not {OPENBLAS_VERSION} (numpy 2.4.6's wheel)"
    if core != "Haswell":
        return f"numpy's OpenBLAS computes with its {core} kernels: OPENBLAS_CORETYPE=Haswell was set too late"
    return None


def _conv_problem() -> str | None:
    """Whether ATen's CPU convolutions are portable_conv's."""
    import torch

    if all(torch._C._dispatch_has_kernel_for_dispatch_key(op, "CPU") for op in CONVOLUTION_OPS):
        return None
    return "ATen's CPU convolutions are not portable_conv's"


CONVOLUTION_OPS = ("aten::convolution", "aten::convolution_backward")


def _register_kernels() -> None:
    """Replace ATen's CPU kernels for this process: convolutions by portable_conv's; of the VML
    functions, sqrt by numpy's, the others by a refusal (what a portable run would compute with them
    differs between CPUs)."""
    if _kernels:
        return
    import torch

    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # "overriding a previously registered kernel": that is the point
        warnings.simplefilter("ignore", UserWarning)
        lib.impl("convolution", convolution, "CPU")
        lib.impl("convolution_backward", convolution_backward, "CPU")
        lib.impl("sqrt", exact_sqrt, "CPU")
        lib.impl("sqrt_", lambda x: x.copy_(exact_sqrt(x)), "CPU")
        lib.impl("sqrt.out", lambda x, *, out: out.resize_(x.shape).copy_(exact_sqrt(x)), "CPU")
        for name in VML_FUNCTIONS:
            for overload in (name, f"{name}_", f"{name}.out"):
                lib.impl(overload, _refusal(name), "CPU")
    _kernels.append(lib)


def convolution(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *schema: Any) -> torch.Tensor:
    """ATen's `convolution` (every CPU convolution) by portable_conv; `schema`: the rest of its
    arguments (stride, padding, dilation, transposed, output_padding, groups)."""
    from incofl import portable_conv

    return portable_conv.forward(x, weight, bias, *_geometry(x, weight, schema))


def convolution_backward(
    grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias_sizes: list[int] | None, *schema: Any
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """ATen's `convolution_backward` by portable_conv; `schema`: the convolution's arguments after
    its bias, then the output mask (which of the three gradients to compute)."""
    from incofl import portable_conv

    *arguments, mask = schema
    return portable_conv.backward(grad, x, weight, *_geometry(x, weight, arguments), tuple(mask))


def _geometry(x: torch.Tensor, weight: torch.Tensor, schema: Sequence[Any]) -> tuple[Pair, Pair, Pair]:
    """(stride, padding, dilation) of a convolution's `schema`; refused in one line where portable_conv
    does not compute it; OpenBLAS's threads set to torch's (its bits depend on the count: one
    `threads`, as every kernel's)."""
    from incofl import portable_conv

    stride, padding, dilation, transposed, _, groups = schema
    try:
        portable_conv.check(x, weight, transposed, groups)
    except portable_conv.UnsupportedConvolution as err:
        raise NumericsError(
            f"numerics: portable computes 2-D float32 and float64 convolutions of one group, not this one: {err}"
        ) from None
    portable_conv.match_threads()
    return _pair(stride), _pair(padding), _pair(dilation)


def _pair(values: list[int]) -> Pair:
    return int(values[0]), int(values[1])


def exact_sqrt(x: torch.Tensor) -> torch.Tensor:
    """IEEE's square root (correctly rounded: one answer on every CPU), by numpy."""
    import numpy as np
    import torch

    if x.dtype not in (torch.float32, torch.float64):
        raise NumericsError(f"numerics: portable computes sqrt of float32 and float64 tensors, not {x.dtype}")
    values = x.detach().numpy()
    out = np.empty(values.shape, values.dtype)
    np.sqrt(values, out=out)
    return torch.from_numpy(out)


def _refusal(name: str) -> Callable[..., NoReturn]:
    def refuse(*args: object, **kwargs: object) -> NoReturn:
        raise NumericsError(f"numerics: portable: torch.{name} runs on MKL's vector maths, whose bits differ by CPU")

    return refuse


def describe(mode: Numerics) -> str:
    """What summary.json's `hardware` says of the kernels: portable runs are one kind on any CPU."""
    return "portable (ATen AVX2, MKL compatible, OpenBLAS Haswell convolutions)" if mode == "portable" else "native"
