"""The golden runs and per-operation fingerprints, computed under portable numerics.

Run as a script (tests/test_golden.py does, in a subprocess): it pins portable numerics before
torch is imported, as `incofl train` does, checks that every pin took effect, and prints one JSON
object: `ops` (a SHA-256 prefix per operation of a training step, in the order a step runs them)
and `runs` (per method: the final weights' and metrics' SHA-256s, every round's loss and per-group
accuracy). Under portable numerics both are the same on every x86-64 CPU with AVX2
(incofl.numerics), so they are pinned once; when a run differs, the first operation whose bits
split says where.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

from incofl.numerics import activate, pin

pin("portable")  # before torch is imported: ATen and MKL read their pins once, at first use

import pandas as pd  # noqa: E402
import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from incofl.config import RunConfig  # noqa: E402
from incofl.data.sources import load_dataset  # noqa: E402
from incofl.fl.engine.simulator import train  # noqa: E402

SETTINGS = {
    "dataset": "synthetic",
    "clients": 6,
    "ratio": 0.5,
    "models": ["resnet10", "resnet14"],
    "model_scale": 0.25,
    "rounds": 3,
    "batch_size": 32,
    "min_size": 20,
    "eval_every": 1,
    "threads": 1,
    "device": "cpu",
    "numerics": "portable",
    "progress": False,
}
METHODS = ["FedAvg", "InCoAvg", "SCAFFOLD", "MOON", "FedNova", "InCoProx"]
METRIC_COLUMNS = ["round", "mean_acc", "mean_loss", "acc_g0", "acc_g1"]  # not `seconds` (timing)


def digest(*tensors: torch.Tensor) -> str:
    sha = hashlib.sha256()
    for t in tensors:
        sha.update(t.detach().contiguous().numpy().tobytes())
    return sha.hexdigest()[:16]


def op_fingerprints() -> dict[str, str]:
    """Each operation of a training step on fixed inputs (a batch of 32, as a client's), in the
    order a step runs them: where two CPUs first disagree is where a pin does not hold."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 16, 16, 16, generator=g, requires_grad=True)
    w = torch.randn(32, 16, 3, 3, generator=g, requires_grad=True)
    conv = F.conv2d(x, w, padding=1)
    grad_out = torch.randn(conv.shape, generator=g)
    conv_x, conv_w = torch.autograd.grad(conv, (x, w), grad_out)
    stem = torch.randn(8, 1, 7, 7, generator=g, requires_grad=True)  # a ResNet's stem (7x7/2) and a shortcut (1x1/2)
    strided = [F.conv2d(x[:, :1], stem, stride=2, padding=3), F.conv2d(x, w[:, :, 1:2, 1:2], stride=2)]
    strided_grads = torch.autograd.grad(strided, (x, stem, w), [torch.randn(s.shape, generator=g) for s in strided])
    bn = torch.nn.BatchNorm2d(32)
    h = conv.detach().requires_grad_()
    normed = bn(h)
    (bn_x,) = torch.autograd.grad(normed, h, grad_out)
    a = torch.randn(32, 256, generator=g, requires_grad=True)
    lin = torch.randn(10, 256, generator=g, requires_grad=True)
    logits = F.linear(a, lin)
    linear_a, linear_w = torch.autograd.grad(logits, (a, lin), torch.randn(32, 10, generator=g))
    z = logits.detach().requires_grad_()
    y = torch.randint(0, 10, (32,), generator=g)
    loss = F.cross_entropy(z, y)
    (ce_z,) = torch.autograd.grad(loss, z)
    return {
        "conv forward": digest(conv, *strided),
        "conv backward": digest(conv_x, conv_w, *strided_grads),
        "batch norm forward": digest(normed, bn.running_mean, bn.running_var),
        "batch norm backward": digest(bn_x),
        "matmul (linear forward, backward)": digest(logits, linear_a, linear_w),
        "cross-entropy forward, backward": digest(loss, ce_z),
        "SGD step": digest(*step(torch.optim.SGD, lr=0.1, momentum=0.9, weight_decay=5e-4)),
        "Adam step": digest(*step(torch.optim.Adam, lr=1e-3)),
    }


def step(optimizer: type[torch.optim.Optimizer], **kwargs: float) -> list[torch.Tensor]:
    """Two steps of `optimizer` on fixed weights and gradients."""
    g = torch.Generator().manual_seed(1)
    params = [torch.randn(64, 33, generator=g, requires_grad=True), torch.randn(7, generator=g, requires_grad=True)]
    opt = optimizer(params, **kwargs)
    for _ in range(2):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    return params


def golden_run(method: str, out: Path, cache: Path) -> dict:
    cfg = RunConfig(method=method, cache_dir=str(cache), **SETTINGS)
    summary = train(cfg, out, data=load_dataset("synthetic", cache_dir=cache))
    metrics = pd.read_csv(out / "metrics.csv")[METRIC_COLUMNS]
    return {
        "state": summary["state_sha256"],
        "metrics": hashlib.sha256(metrics.to_csv(index=False).encode()).hexdigest(),
        "loss": [round(v, 7) for v in metrics["mean_loss"]],
        "acc": [[float(a), float(b)] for a, b in zip(metrics["acc_g0"], metrics["acc_g1"], strict=True)],
    }


def main(methods: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        runs = {m: golden_run(m, Path(tmp) / m, Path(tmp) / "cache") for m in methods}
    return {"torch": torch.__version__, "ops": op_fingerprints(), "runs": runs}


if __name__ == "__main__":  # `--ops`: the operations alone (seconds; e.g. under an emulated CPU)
    activate("portable")  # refuses in one line (a CPU without AVX2, a pin overridden)
    ops_only = sys.argv[1:] == ["--ops"]
    json.dump({"ops": op_fingerprints()} if ops_only else main(sys.argv[1:] or METHODS), sys.stdout)
