"""Portable numerics (incofl.numerics): each pin checked where it is made, and refused in one line
where it cannot hold; `auto` portable where they hold and native, saying why, where they cannot.
Pins act once per process, so everything that pins runs in a subprocess."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from workflows import ENV, REPO, snakemake_cmd

from incofl import numerics
from incofl.config import ConfigError, RunConfig, load_run_config
from incofl.numerics import PORTABLE_ENV, NumericsError, conflicts, decide, environment, notice


def python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**{k: v for k, v in os.environ.items() if k not in PORTABLE_ENV}, **(env or {})},
        timeout=300,
    )


def test_portable_kernels_compute_an_exact_sqrt_and_refuse_the_vector_maths():
    """sqrt is IEEE's (numpy's) in all three forms, with its gradient; exp is refused by name."""
    done = python("""
        from incofl.numerics import activate, mkl_branch, pin
        pin("portable")
        import numpy as np
        import torch
        activate("portable")
        b = torch.rand(4096, generator=torch.Generator().manual_seed(1)) + 0.1
        s = b.sqrt()
        assert np.array_equal(s.numpy(), np.sqrt(b.numpy()))
        assert b.clone().sqrt_().equal(s) and torch.sqrt(b, out=torch.empty(0)).equal(s)
        x = b.clone().requires_grad_()
        x.sqrt().sum().backward()
        assert torch.allclose(x.grad, 0.5 / s)
        assert torch.backends.cpu.get_cpu_capability() == "AVX2" and mkl_branch() == 3
        b.exp()
    """)
    assert "NumericsError: numerics: portable: torch.exp runs on MKL's vector maths" in done.stderr


def test_a_pin_set_after_torch_computed_is_refused():
    done = python("""
        import torch
        torch.ones(2) + 1
        from incofl.numerics import activate, pin
        pin("portable")
        activate("portable")
    """)
    assert "torch was imported before ATEN_CPU_CAPABILITY=avx2 was set" in done.stderr


def test_the_cli_refuses_an_environment_that_overrides_a_pin(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "incofl.cli", "train", "--out", str(tmp_path / "run"), "--set", "numerics=portable"],
        capture_output=True,
        text=True,
        env={**os.environ, "ATEN_CPU_CAPABILITY": "avx512"},
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "incofl train: error: numerics: portable, but the environment sets ATEN_CPU_CAPABILITY=avx512 "
        "(portable numerics need ATEN_CPU_CAPABILITY=avx2)"
    )
    assert not (tmp_path / "run").exists()


def test_incofl_train_pins_before_anything_imports_torch(tmp_path):
    """The command the workflow runs (a fresh process, no pins in its environment): nothing it
    imports before it reads the config and pins imports torch (the CLI's imports once did, and
    every portable run was refused as pinned too late)."""
    done = python(
        """
        import sys
        import incofl.numerics
        from incofl import cli
        pinned = []
        cli.pin = lambda mode: pinned.append("torch" in sys.modules)
        cli.run(["train", "--set", "numerics=portable", "cache_dir={tmp_path}", "--out", "{tmp_path}/run"])
        assert pinned == [False], pinned
    """.replace("{tmp_path}", str(tmp_path))
    )
    assert done.returncode in (0, 2), done.stderr


def test_pins_are_environment_variables_of_portable_runs_only():
    assert environment("native") == {} and conflicts("native", {"MKL_CBWR": "AVX512"}) == []
    assert environment("portable") == {
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_CBWR": "COMPATIBLE",
        "OPENBLAS_CORETYPE": "Haswell",
    }
    assert conflicts("portable", {"MKL_CBWR": "compatible", "ATEN_CPU_CAPABILITY": "AVX2"}) == []


def test_a_portable_run_on_cuda_is_refused():
    with pytest.raises(ConfigError, match="numerics: portable pins CPU kernels"):
        load_run_config(None, {"numerics": "portable", "device": "cuda"})


def test_a_process_without_the_pins_refuses_a_portable_run_and_stays_as_it_was():
    """The test process computed before any pin: a portable run (the server's engine, a node's
    client) is refused, and nothing in this process changed (its other tests run native)."""
    import torch

    from incofl.config import RunConfig
    from incofl.fl.engine.device import run_device
    from incofl.numerics import NumericsError

    with pytest.raises(NumericsError, match="numerics: portable cannot hold here"):
        run_device(RunConfig(numerics="portable", progress=False))
    assert torch.backends.mkldnn.enabled and torch.ones(3).exp().equal(torch.full((3,), torch.e).float())


def test_federation_up_starts_its_processes_with_the_pins_and_refuses_an_override(tmp_path, monkeypatch):
    from incofl.deploy.up import Processes
    from incofl.numerics import NumericsError

    assert Processes(tmp_path / "a", "portable").env.items() >= environment("portable").items()
    assert "MKL_CBWR" not in Processes(tmp_path / "b").env or "MKL_CBWR" in os.environ
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    with pytest.raises(NumericsError, match="--numerics portable, but the environment sets MKL_CBWR=AVX2"):
        Processes(tmp_path / "c", "portable")


def test_federation_up_decides_auto_once_for_every_process(monkeypatch, capsys):
    """`up --numerics auto`: portable where a pinned process holds them (this machine), native
    after one line where they cannot (here: an environment that pins ATen below AVX2)."""
    from incofl.cli import federation_numerics

    assert federation_numerics("auto") == "portable" and capsys.readouterr().err == ""
    assert federation_numerics("native") == "native"
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert federation_numerics("auto") == "native"
    assert "numerics: auto starts every process native: portable numerics cannot hold here" in capsys.readouterr().err


def test_a_pin_in_a_process_that_imported_torch_leaves_its_environment_alone(monkeypatch):
    """An in-process `incofl train` of a portable config (as the CLI tests run it) must not pin
    every process the tests start after it: the variables would pin nothing here anyway."""
    import torch  # noqa: F401

    from incofl.numerics import pin

    for key in PORTABLE_ENV:
        monkeypatch.delenv(key, raising=False)
    pin("portable")
    assert not PORTABLE_ENV.keys() & os.environ.keys()


HASWELL = ("0.3.31.188.0", "Haswell")  # numpy 2.4.6's OpenBLAS, held to its Haswell kernels


@pytest.mark.parametrize(
    ("capability", "avx2", "branch", "blas", "why"),
    [
        ("AVX2", True, numerics.MKL_CBWR_COMPATIBLE, HASWELL, None),  # an x86-64 CPU with AVX2 (or AVX-512), pinned
        ("AVX2", False, numerics.MKL_CBWR_COMPATIBLE, HASWELL, "this CPU has no AVX2"),  # ATen trusts the pin
        ("DEFAULT", True, numerics.MKL_CBWR_COMPATIBLE, HASWELL, "ATen computes with DEFAULT kernels, not AVX2"),
        (
            "AVX2",
            True,
            numerics.MKL_CBWR_COMPATIBLE,
            ("0.3.31.188.0", "SkylakeX"),
            "numpy's OpenBLAS computes with its SkylakeX kernels: OPENBLAS_CORETYPE=Haswell was set too late",
        ),
        (
            "AVX2",
            True,
            numerics.MKL_CBWR_COMPATIBLE,
            ("0.3.29", "Haswell"),
            "numpy's OpenBLAS is 0.3.29, not 0.3.31 (numpy 2.4.6's wheel)",
        ),
        (
            "SVE256",
            False,
            None,
            ("0.3.31.188.0", "NeoverseV1"),
            "this CPU has no AVX2; this torch build has no MKL (portable numerics pin MKL's compatible branch); "
            "numpy's OpenBLAS computes with its NeoverseV1 kernels: OPENBLAS_CORETYPE=Haswell was set too late",
        ),
        (
            "AVX2",
            True,
            numerics.MKL_CBWR_COMPATIBLE,
            None,
            "numpy links no OpenBLAS of its own (portable convolutions need numpy's wheel's)",
        ),
    ],
    ids=["avx2", "westmere", "aten-lowered", "openblas-late", "openblas-other", "graviton3", "numpy-other-blas"],
)
def test_portable_numerics_hold_where_aten_computes_avx2_with_mkl_and_say_why_not(
    monkeypatch, capability, avx2, branch, blas, why
):
    """The decision's facts, as a process pinned for portable numerics sees them on each kind of
    CPU: ATen's capability (on a CPU without AVX2 it takes ATEN_CPU_CAPABILITY=avx2 on trust, so
    the CPU's AVX2 is asked apart), MKL's branch (none: an aarch64 torch, an Apple Silicon's too),
    and numpy's OpenBLAS (its version and the kernels it computes with)."""
    import torch

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(numerics, "cpu_has_avx2", lambda: avx2)
    monkeypatch.setattr(numerics, "mkl_branch", lambda: branch)
    monkeypatch.setattr(numerics, "openblas", lambda: blas)
    assert numerics.obstacle() == why


def test_portable_numerics_asked_for_on_a_cpu_without_avx2_are_refused_in_one_line_before_torch(tmp_path):
    """`incofl train` pins before it imports torch; on a CPU without AVX2 (here: said so) it
    refuses there, as ATen would take the pin on trust and stop at its first AVX2 kernel
    (seen under QEMU's Westmere: an illegal instruction)."""
    done = python(
        """
        import sys
        from incofl import cli, numerics
        numerics.cpu_has_avx2 = lambda: False
        sys.exit(cli.run(["train", "--set", "numerics=portable", "--out", "{out}"]))
    """.replace("{out}", str(tmp_path / "run"))
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "incofl train: error: numerics: portable cannot hold here: this CPU has no AVX2"
    assert not (tmp_path / "run").exists()


def test_auto_is_portable_on_this_machine_as_a_fresh_pinned_process_finds():
    """This machine (x86-64, AVX2, torch with MKL): the default experiment's runs are portable,
    the same bits as the committed ones."""
    assert decide("auto") == ("portable", None)


def test_auto_is_native_with_the_reason_where_a_pinned_process_finds_one(monkeypatch):
    monkeypatch.setattr(numerics, "PROBE", "print('this CPU has no AVX2')")
    assert decide("auto") == ("native", "this CPU has no AVX2")
    why = "this CPU has no AVX2"
    line = notice(why)
    assert "\n" not in line and line.startswith("numerics: auto computes natively on this machine: portable")
    assert "INCONCLUSIVE with the seeds a yes would need" in line


def test_auto_asks_no_process_where_the_answer_is_known(monkeypatch):
    """As asked for native and portable; native on cuda (portable pins CPU kernels); native where
    the environment sets a pin to another value (the user's setting is kept, not overridden)."""
    monkeypatch.setattr(numerics, "PROBE", "raise SystemExit('no process should start')")
    assert decide("native") == ("native", None) and decide("portable") == ("portable", None)
    assert decide("auto", "cuda") == ("native", None)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert decide("auto") == (
        "native",
        "the environment sets ATEN_CPU_CAPABILITY=default (portable numerics need ATEN_CPU_CAPABILITY=avx2)",
    )


def test_auto_refuses_in_one_line_where_torch_cannot_be_imported(monkeypatch):
    monkeypatch.setattr(numerics, "PROBE", "raise ImportError('libtorch_cpu.so: cannot open shared object file')")
    with pytest.raises(NumericsError, match=r"^numerics: auto: a process importing torch failed: ImportError: lib"):
        decide("auto")


def test_auto_in_a_process_that_imported_torch_unpinned_is_native_and_recorded_so():
    """A federation's processes decide `auto` themselves (nothing decided it before): this test
    process imported torch without the pins, so native, and the config records it."""
    import torch

    from incofl.fl.engine.device import run_device

    cfg = RunConfig(numerics="auto", progress=False)
    assert run_device(cfg).type in ("cpu", "cuda") and cfg.numerics == "native"
    assert torch.backends.mkldnn.enabled  # nothing of portable numerics switched on


def test_auto_on_cuda_is_native_even_where_portable_numerics_would_hold(monkeypatch):
    from incofl.fl.engine import device

    monkeypatch.setattr(device, "activate", lambda mode: "portable" if mode == "auto" else mode)
    cfg = RunConfig(numerics="auto", device="cuda", progress=False)
    with contextlib.suppress(ConfigError):  # this machine has no CUDA device: the numerics are set before
        device.run_device(cfg)
    assert cfg.numerics == "native"


def _run_files(workdir: Path, env: dict[str, str]) -> tuple[str, list[str]]:
    """The default experiment's run config files as the workflow writes them (no training)."""
    targets = [str(p.relative_to(REPO)) for p in sorted((REPO / "results").glob("runs/digits/a*/*/s*/config.yaml"))]
    done = subprocess.run(
        snakemake_cmd(workdir, "--cores", "1", *targets, config=REPO / "config" / "config.yaml"),
        cwd=REPO,
        env={**ENV, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr, [(workdir / t).read_text() for t in targets]


@pytest.mark.slow
def test_the_default_experiment_writes_the_committed_run_files_here_and_native_ones_with_one_notice(tmp_path):
    """numerics: auto resolves to portable on this machine, so the run files are the committed
    runs' (their settings, and Snakemake's params, unchanged); where portable cannot hold (here:
    an environment that pins ATen below AVX2), every run file says native after one notice."""
    committed = [p.read_text() for p in sorted((REPO / "results").glob("runs/digits/a*/*/s*/config.yaml"))]
    stderr, files = _run_files(tmp_path / "here", {})
    assert len(files) == 18 and files == committed and "numerics: auto" not in stderr
    stderr, files = _run_files(tmp_path / "elsewhere", {"ATEN_CPU_CAPABILITY": "default"})
    assert stderr.count("numerics: auto computes natively on this machine") == 1
    assert [f.replace("numerics: native", "numerics: portable") for f in files] == committed
