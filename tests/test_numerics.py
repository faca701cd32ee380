"""Portable numerics (incofl.numerics): each pin checked where it is made, and refused in one line
where it cannot hold. Pins act once per process, so everything that pins runs in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from incofl.config import ConfigError, load_run_config
from incofl.numerics import PORTABLE_ENV, conflicts, environment


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
        import numpy as np
        from incofl.numerics import activate, mkl_branch, pin
        pin("portable")
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
    assert environment("portable") == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"}
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


def test_a_pin_in_a_process_that_imported_torch_leaves_its_environment_alone(monkeypatch):
    """An in-process `incofl train` of a portable config (as the CLI tests run it) must not pin
    every process the tests start after it: the variables would pin nothing here anyway."""
    import torch  # noqa: F401

    from incofl.numerics import pin

    for key in PORTABLE_ENV:
        monkeypatch.delenv(key, raising=False)
    pin("portable")
    assert not PORTABLE_ENV.keys() & os.environ.keys()
