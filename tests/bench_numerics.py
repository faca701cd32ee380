"""What portable numerics cost: one run of the default experiment under three kinds of kernels,
alternated in fresh processes (each pins its kernels before torch is imported), and the ratios
of their median CPU seconds (user + system of the training process: robust to other work on the
machine, which wall time is not). docs/performance.md reports it.

- `native`: torch's fastest kernels for this CPU (here oneDNN's AVX-512 convolutions);
- `native-avx2`: the same held to AVX2 (ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2): what
  a CPU with AVX2 and no AVX-512 computes natively;
- `portable`: portable numerics (incofl.numerics, incofl.portable_conv).

`--breakdown` adds where a training step's CPU time goes under each: the convolutions' forward,
grad-input and grad-weight, each timed alone on the inputs one step of the run's five models
gives them (in the layout training gives them), and the rest of the step (batch norm, pooling,
the loss, the optimiser).

    python tests/bench_numerics.py                                   # 3 rounds, the default config
    python tests/bench_numerics.py --rounds 3 --breakdown --set model_scale=0.25
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "config/config.yaml"
RUN = ["alpha=0.5", "method=InCoAvg", "seed=0", "progress=false"]
ARMS = {
    "native": ("native", {}),
    "native-avx2": ("native", {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}),
    "portable": ("portable", {}),
}
PARTS = ("forward", "grad-input", "grad-weight", "rest")


def arm_env(arm: str) -> dict[str, str]:
    malloc = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "4294967296"}
    return {**os.environ, **malloc, **ARMS[arm][1]}


def timed_run(arm: str, sets: list[str], out: Path) -> dict[str, float]:
    """One `incofl train` in a fresh process: its wall and CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "incofl.cli", "train", "--config", str(CONFIG), "--out", str(out)]
        + ["--set", *RUN, f"numerics={ARMS[arm][0]}", *sets],
        check=True,
        capture_output=True,
        env=arm_env(arm),
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    summary = json.loads((out / "summary.json").read_text())
    return {"wall_s": time.perf_counter() - start, "cpu_s": cpu, "final_acc": summary["final_acc"]}


def breakdown(arm: str, sets: list[str]) -> dict[str, float]:
    """Milliseconds of CPU a training step of the run's five models spends in each of PARTS (a fresh process)."""
    code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import bench_numerics as b; b.step_parts()"
    done = subprocess.run(
        [sys.executable, "-c", code, ARMS[arm][0], json.dumps(sets)],
        check=True,
        capture_output=True,
        text=True,
        env=arm_env(arm),
    )
    return json.loads(done.stdout)


def step_parts() -> None:
    """In a fresh process (`breakdown`): pin the arm's numerics, then time one step's parts."""
    from incofl.numerics import activate, pin

    numerics = sys.argv[1]
    pin(numerics)
    import torch

    activate(numerics)
    from incofl.config import load_run_config
    from incofl.models.family import build_model

    cfg = load_run_config(CONFIG, dict(s.split("=", 1) for s in [*RUN, *json.loads(sys.argv[2])]))
    torch.set_num_threads(cfg.threads or 1)
    torch.manual_seed(0)
    models = [build_model(name, 10, 1, stem=cfg.stem, scale=cfg.model_scale) for name in cfg.models]
    x, y = torch.randn(cfg.batch_size, 1, 32, 32), torch.randint(0, 10, (cfg.batch_size,))
    calls = convolutions(models, x)
    parts = {part: 0.0 for part in PARTS}
    backward = torch.ops.aten.convolution_backward
    for conv, inp, first in calls:
        w, stride, padding, dilation = conv.weight.detach(), list(conv.stride), list(conv.padding), list(conv.dilation)
        out = torch.nn.functional.conv2d(inp, w, None, stride, padding, dilation)
        grad = torch.randn(out.shape).contiguous(memory_format=_format(out))
        geometry = (None, stride, padding, dilation, False, [0, 0], 1)
        parts["forward"] += cpu_ms(lambda: torch.nn.functional.conv2d(inp, w, None, stride, padding, dilation))  # noqa: B023
        if not first:  # the stem's input (the images) needs no gradient
            parts["grad-input"] += cpu_ms(lambda: backward(grad, inp, w, *geometry, [True, False, False]))  # noqa: B023
        parts["grad-weight"] += cpu_ms(lambda: backward(grad, inp, w, *geometry, [False, True, False]))  # noqa: B023
    optimizers = [torch.optim.SGD(m.parameters(), lr=cfg.lr) for m in models]

    def step() -> None:
        for model, opt in zip(models, optimizers, strict=True):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    parts["rest"] = cpu_ms(step) - sum(parts.values())
    print(json.dumps(parts))


def convolutions(models: list, x: object) -> list[tuple[object, object, bool]]:
    """(conv module, its input as a training step gives it, whether it is the model's first) of each convolution."""
    import torch

    calls = []
    for model in models:
        convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]

        def record(module: object, inputs: tuple, _: object, first: object = convs[0]) -> None:
            calls.append((module, inputs[0].detach(), module is first))

        hooks = [conv.register_forward_hook(record) for conv in convs]
        model(x).sum().backward()
        for hook in hooks:
            hook.remove()
    return calls


def _format(t: object) -> object:
    import torch

    return torch.channels_last if t.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format


def cpu_ms(fn: object, repeats: int = 5) -> float:
    """The median CPU milliseconds of one call of `fn` (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append((time.process_time() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each arm, their order rotated each round")
    parser.add_argument("--set", nargs="*", default=[], help="more settings, e.g. model_scale=0.25")
    parser.add_argument("--breakdown", action="store_true", help="also each arm's training step, part by part")
    args = parser.parse_args()
    arms = list(ARMS)
    times: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for arm in arms[i % 3 :] + arms[: i % 3]:
                times[arm].append(timed_run(arm, args.set, Path(tmp) / f"{arm}{i}"))
                print(arm, times[arm][-1], flush=True)
    median = {arm: statistics.median(t["cpu_s"] for t in v) for arm, v in times.items()}
    print(f"settings {args.set or 'of config/config.yaml'}, {args.rounds} runs of each, median CPU s:")
    print(", ".join(f"{arm} {s:.1f}" for arm, s in median.items()))
    print(
        f"portable / native = {median['portable'] / median['native']:.2f}, "
        f"portable / native-avx2 = {median['portable'] / median['native-avx2']:.2f}"
    )
    if args.breakdown:
        print("one training step of the five models, CPU ms: " + ", ".join(PARTS))
        for arm in arms:
            parts = breakdown(arm, args.set)
            print(f"{arm}: " + ", ".join(f"{parts[p]:.1f}" for p in PARTS) + f" (step {sum(parts.values()):.1f})")


if __name__ == "__main__":
    main()
