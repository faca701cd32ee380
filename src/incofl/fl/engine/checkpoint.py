"""Checkpoints: everything a run needs to continue bit-identically after a kill.

A checkpoint holds plain types only (tensors, numbers, strings, lists, tuples, dicts, None) and
is read with `torch.load(weights_only=True)`, which unpickles nothing else: a planted or shared
ckpt.pt cannot run code, it is refused as unreadable.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from incofl.atomic import save_tensors
from incofl.config import Affects, Analyses, run_settings
from incofl.registry import METHODS

# Settings a checkpoint stays valid across: those that change nothing a run computes, and those
# that change only its last bits (a resumed run's thread count or device may differ: the same
# experiment). `rounds` is not one: the evaluation schedule (eval_last) and round-based schedules
# depend on it; nor is `eval_batch_size`: it decides which test images are scored (drop_last).
NON_SEMANTIC = run_settings(Affects.NOTHING, Affects.BITS)
# Settings added after runs were written, with the value a file without them was made with: a
# checkpoint or summary.json from before one is the run it would be with that value. `label` is
# semantic otherwise: it is the name summary.json records.
ADDED = {
    "label": None,
    "client_samples": None,
    "bn_stats": "averaged",
    "shard_classes": 2,
    "width_rates": None,
    "exits": None,
    "rate_assignment": "fixed",
    "model_scale": 1.0,
    "eval_bn": None,
    "static_bn_samples": None,
    "update_noise": 0.0,
    "analyses": Analyses().model_dump(),
}


class CheckpointMismatch(RuntimeError):
    """The checkpoint (or finished run) on disk was made with different settings, or cannot be read."""


def semantic_config(config: dict[str, Any]) -> dict[str, Any]:
    """`config` as compared across files: defaults of later settings filled in, settings that do
    not change the numbers dropped, and method_args under their current names (Method.migrate)."""
    out = {k: v for k, v in {**ADDED, **config}.items() if k not in NON_SEMANTIC}
    method = METHODS.get(out.get("method", ""))
    if method is not None and isinstance(out.get("method_args"), dict):
        out["method_args"] = method.migrate(out["method_args"])
    return out


PLAIN = (int, float, str, bool, type(None))


def check_plain(value: Any, where: str = "checkpoint") -> None:
    """Refuse, naming the entry, a value that `torch.load(weights_only=True)` would not read
    back (a NumPy scalar or array, a module, any other object)."""
    if isinstance(value, dict):
        for key, item in value.items():
            check_plain(key, f"{where} key {key!r}")
            check_plain(item, f"{where}[{key!r}]")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_plain(item, f"{where}[{i}]")
    elif type(value) not in PLAIN and not isinstance(value, torch.Tensor):
        raise TypeError(f"{where}: a {type(value).__module__}.{type(value).__name__}, not a plain type")


def save(path: str | os.PathLike, payload: dict[str, Any]) -> None:
    check_plain(payload)
    save_tensors(path, payload)


def load(path: str | os.PathLike, config: dict[str, Any]) -> dict[str, Any] | None:
    """The checkpoint at `path`, or None if there is none; refuses one made with other settings."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        theirs = payload["config"]
    except Exception as err:  # truncated, corrupt (writes are atomic, so not by us) or planted: say which file
        raise CheckpointMismatch(
            f"{path}: unreadable checkpoint ({type(err).__name__}: not one incofl wrote, or damaged; objects other "
            "than tensors and plain values are never loaded); delete it to start the run over"
        ) from None
    check_same(path, theirs, config, "delete the checkpoint or use another --out")
    return payload


def check_same(path: Path, theirs: dict[str, Any], config: dict[str, Any], remedy: str) -> None:
    """Refuse, naming the first differing key, a file made with other semantic settings."""
    ours = semantic_config(config)
    theirs = semantic_config(theirs)
    if theirs != ours:
        key = next(k for k in sorted(set(theirs) | set(ours)) if theirs.get(k) != ours.get(k))
        raise CheckpointMismatch(
            f"{path}: made with {key}={theirs.get(key)!r}, this run has {key}={ours.get(key)!r}; {remedy}"
        )


def checkpointed(round_: int, every: int, rounds: int) -> bool:
    """Whether a run's checkpoint is written after round `round_` (1-based): every `every`-th
    round (`checkpoint_every`) but the last, `rounds` (summary.json marks a finished run)."""
    return round_ % every == 0 and round_ < rounds


def last_checkpoint(round_: int, every: int) -> int:
    """The last round before round `round_` after which a checkpoint was written every `every`
    rounds (0: none): where a run stopped during round `round_` resumes from."""
    return (round_ - 1) // every * every
