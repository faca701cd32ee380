"""Atomic file writes: a reader (or a killed job, or a node that crashed) never sees a
half-written file.

A write goes to a temporary file created exclusively (O_EXCL, so never through a planted
symlink) under a random name in the target's folder, is flushed to disk (fsync), renamed onto
the target, and the folder is flushed so that the rename survives a crash too. A write that
fails (no space left, a quota) raises OSError naming the target file and the cause: tensors
too (`save_tensors`), where torch.save to a path would fail with a message naming neither.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _create_temporary(path: Path, mode: int) -> Path:
    """An empty new file beside `path`, `.<name>~<random>~<host>~<pid>.tmp`, of `mode` less the
    umask from the moment it exists: host and pid tell a killed writer's leftovers, the random
    part makes the name unguessable."""
    while True:
        tmp = path.with_name(f".{path.name}~{secrets.token_hex(4)}~{socket.gethostname()}~{os.getpid()}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode))
        except FileExistsError:
            continue
        return tmp


def remove_stale_temporaries(folder: str | os.PathLike) -> None:
    """Remove the temporary files of writers on this host that are no longer running."""
    for tmp in Path(folder).glob(".*~*~*.tmp"):
        _, host, pid = tmp.name[: -len(".tmp")].rsplit("~", 2)
        if host == socket.gethostname() and pid.isdigit() and not alive(int(pid)):
            tmp.unlink(missing_ok=True)


def alive(pid: int) -> bool:
    """Whether process `pid` of this host is running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def fsync(path: Path) -> None:
    """Flush a file, or a folder's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | os.PathLike, mode: int = 0o666) -> Iterator[Path]:
    """Yield a new temporary path beside `path`; move it onto `path` only if the block succeeds.
    `mode` (less the umask) holds from the file's creation: 0o666, readable like any file this
    user writes (shared caches); 0o600 for a secret, never readable by another user."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _create_temporary(path, mode)
    try:
        yield tmp
        fsync(tmp)
        os.replace(tmp, path)
        fsync(path.parent)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno is not None:  # say which file, not the temporary
            raise OSError(err.errno, f"cannot write it ({os.strerror(err.errno)})", str(path)) from None
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | os.PathLike, obj: Any, strict: bool = False) -> None:
    """`strict`: standard JSON (a NaN or inf is an error, not the non-standard `NaN`)."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=not strict) + "\n")


def save_tensors(path: str | os.PathLike, obj: Any) -> None:
    """torch.save `obj` to `path` atomically. Into a file object, so that a failed write is the
    OSError of `atomic_path` naming `path` (to a path, torch fails on a full disk with a
    RuntimeError of its archive writer, naming no file)."""
    import torch  # here, not at the top: the report commands write files without torch

    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        try:
            torch.save(obj, fh)
        except RuntimeError as err:  # torch's writer ends the archive after a failed write, and fails there
            if isinstance(err.__context__, OSError):
                raise err.__context__ from None
            raise
