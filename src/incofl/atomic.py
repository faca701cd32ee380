"""Atomic file writes: a reader (or a killed job) never sees a half-written file."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _temporary(path: Path) -> Path:
    """The writer's temporary name beside `path`: host and pid tell a killed writer's leftovers."""
    return path.with_name(f".{path.name}~{socket.gethostname()}~{os.getpid()}.tmp")


def remove_stale_temporaries(folder: str | os.PathLike) -> None:
    """Remove the temporary files of writers on this host that are no longer running."""
    for tmp in Path(folder).glob(".*~*~*.tmp"):
        _, host, pid = tmp.name[: -len(".tmp")].rsplit("~", 2)
        if host == socket.gethostname() and pid.isdigit() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    tmp.touch()
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # readable like any file this user writes (shared caches)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | os.PathLike, obj: Any, strict: bool = False) -> None:
    """`strict`: standard JSON (a NaN or inf is an error, not the non-standard `NaN`)."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=not strict) + "\n")
