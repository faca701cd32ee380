"""The run directory: one writer at a time, nothing half-written left behind.

`incofl train` claims its `--out` with an exclusive `flock` on `<out>/.lock` (a second process
on the same directory is refused with one line naming the holder's pid). Where the file system
has no `flock` (some network mounts), the claim is an exclusive-create lock file,
`<out>/.lock.owner`, holding the writer's host and pid: one left by a dead process of this host
is taken over, one of another host is refused (its process cannot be checked from here).
Holding the claim, the run removes the temporary files a killed writer left (atomic writes go
through `.<name>~<random>~<host>~<pid>.tmp`).
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from incofl.atomic import alive, remove_stale_temporaries

LOCK = ".lock"
OWNER = ".lock.owner"


class RunDirError(RuntimeError):
    """--out cannot be used: not a directory, or another process is writing it."""


@contextmanager
def claimed(out: Path) -> Iterator[None]:
    if out.exists() and not out.is_dir():
        raise RunDirError(f"--out {out}: is a file, not a directory")
    out.mkdir(parents=True, exist_ok=True)
    with open(out / LOCK, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            raise RunDirError(
                f"--out {out}: another incofl train (pid {holder}) is writing this run; wait or use another --out"
            ) from None
        except OSError:  # no flock on this file system (ENOLCK, EOPNOTSUPP: some network mounts)
            with owned(out / OWNER):
                remove_stale_temporaries(out)
                yield
            return
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        remove_stale_temporaries(out)
        yield


@contextmanager
def owned(lock: Path) -> Iterator[None]:
    """Hold `lock`, a file created exclusively with `<host> <pid>`; removed at the end."""
    me = f"{socket.gethostname()} {os.getpid()}"
    while True:
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except FileExistsError:
            _take_over_if_stale(lock)
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{me}\n")
            fh.flush()
            os.fsync(fh.fileno())
        break
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def _take_over_if_stale(lock: Path) -> None:
    """Remove `lock` if its process, of this host, is gone; else refuse naming its holder."""
    try:
        holder = lock.read_text().split()
    except FileNotFoundError:  # its holder just finished
        return
    out = lock.parent
    if len(holder) != 2 or not holder[1].isdigit():
        raise RunDirError(
            f"--out {out}: unreadable lock file {lock} (no flock on this file system); delete it "
            "if no incofl train is writing this run"
        )
    host, pid = holder[0], int(holder[1])
    if host == socket.gethostname() and not alive(pid):
        lock.unlink(missing_ok=True)
        return
    raise RunDirError(
        f"--out {out}: another incofl train (pid {pid} on {host}) is writing this run ({lock}; no "
        "flock on this file system); wait, or delete the file if that process is gone"
    )
