"""What a federation's server holds of the data: the run's facts (data/facts.py: each client's
share size, held-out size and classes; the data set's class count, image shape and
normalisation), the settings its partition was drawn with, and the data set's test split, on
which it scores the global model; never a training image. `incofl federation export` writes it
(`keys/facts.npz`, beside the server's key) from the partition (with `--declared`, no partition:
each client's facts left to its site's signed declaration, data/facts.py), signed with the server's key;
the ServerApp checks the signature (with its own key's public half), then every value, before it
reads a fact, and refuses a run whose config would partition otherwise, in one line. It also
says the most bytes one reply of the run may take (`reply_cap`), which `incofl federation up` makes
the gate's cap on what a node may have the SuperLink store for one reply (`stated_reply_cap`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from incofl.atomic import atomic_path
from incofl.config import ConfigError, RunConfig
from incofl.data.facts import Facts, TestSplit
from incofl.deploy.wire.exported import check_settings, partition_settings, split_sha256
from incofl.deploy.wire.signing import SignatureError, sign, statement, verify

FACTS = "facts.npz"  # in the keys folder, beside the server's key


def _statement(text: str, x_test: np.ndarray, y_test: np.ndarray) -> bytes:
    """What is signed: the facts' text and the test split's dtypes, shapes and bytes, by SHA-256."""
    return statement("facts", facts=hashlib.sha256(text.encode()).hexdigest(), test=split_sha256(x_test, y_test))


def export_facts(cfg: RunConfig, test: TestSplit, facts: Facts, out: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """Write the server's file (module docstring) to `out` (0600, atomically), signed with `key`."""
    text = json.dumps(
        {"settings": partition_settings(cfg), "facts": facts.to_json(), "reply_cap": reply_cap(cfg, facts)}
    )
    signature = sign(key, _statement(text, test.x, test.y))
    with atomic_path(out, mode=0o600) as tmp, open(tmp, "wb") as fh:
        # as uint8: numpy's fixed-width bytes drop trailing NULs, and a DER signature can end in one
        raw = np.frombuffer(signature, dtype=np.uint8)
        np.savez(fh, facts=np.str_(text), x_test=test.x, y_test=test.y, signature=raw)


def load_facts(path: Path, cfg: RunConfig, key: ec.EllipticCurvePublicKey) -> tuple[TestSplit, Facts]:
    """The run's test split and facts, once `key` has signed them and they fit `cfg`; refused in one
    line naming the file otherwise."""
    try:
        with np.load(path, allow_pickle=False) as f:
            text, x_test, y_test = str(f["facts"]), f["x_test"], f["y_test"]
            signature = f["signature"].astype(np.uint8, casting="no").tobytes()
        verify(key, _statement(text, x_test, y_test), signature, "the server key")
        saved = json.loads(text)
        facts = Facts.from_json(saved["facts"], cfg.clients)
        facts.check(x_test, y_test)
    except (OSError, KeyError, TypeError, ValueError) as err:  # SignatureError, a bad zip, JSON or value too
        why = str(err)[:160] if isinstance(err, (SignatureError, ValueError)) else type(err).__name__
        raise ConfigError(
            f"facts {path}: not the server's facts file ({why}); make it with incofl federation export"
        ) from None
    check_settings(f"facts {path}", saved["settings"], partition_settings(cfg))
    return TestSplit(x_test, y_test), facts


REPLY_STATES = (
    3  # states of a model's size a reply may hold at most: its delta, a method's extra (SCAFFOLD's control), a spare
)


def reply_cap(cfg: RunConfig, facts: Facts) -> int:
    """The most bytes one reply of the run may take as Flower moves it: REPLY_STATES times the state
    of the run's largest model (every parameter and buffer, at full width), and the reply's other
    records (REPLY_OVERHEAD). What a method really sends is checked by the ServerApp
    (codec.reply_bytes); this bounds what a node can make the SuperLink hold before that."""
    import torch  # the export's process trains nothing: the models are built for their sizes only

    from incofl.deploy import REPLY_OVERHEAD
    from incofl.models.family import build_model, input_size
    from incofl.registry import METHODS

    method = METHODS[cfg.method]
    kwargs = method.model_kwargs(method.parse_args(cfg.method_args))
    classes, (channels, side, _) = facts.classes, facts.shape
    size = input_size(cfg.models[0], cfg.resize or side)
    largest = 0
    for name in dict.fromkeys(cfg.models):
        model = build_model(name, classes, channels, stem=cfg.stem, image_size=size, scale=cfg.model_scale, **kwargs)
        state = model.state_dict().values()
        largest = max(largest, sum(t.numel() * t.element_size() for t in state if isinstance(t, torch.Tensor)))
    return REPLY_STATES * largest + REPLY_OVERHEAD


def stated_reply_cap(path: Path) -> int | None:
    """The reply cap the facts file at `path` states (`reply_cap`), None where it states none (or is no facts file)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            cap = json.loads(str(f["facts"])).get("reply_cap")
    except (OSError, KeyError, ValueError):
        return None
    return cap if isinstance(cap, int) and cap > 0 else None
