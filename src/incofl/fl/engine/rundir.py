"""The run directory: one writer at a time, nothing half-written left behind.

`incofl train` claims its `--out` with an exclusive `flock` on `<out>/.lock` (a second process
on the same directory is refused with one line naming the holder's pid). Where the file system
has no `flock` (some network mounts), the claim is an exclusive-create lock file,
`<out>/.lock.owner`, holding the writer's host, pid and a random token: one left by a dead
process of this host is taken over, one of another host is refused (its process cannot be
checked from here). A takeover renames the stale file aside (atomic: of two takers one gets
it) and deletes it only if it is still the stale one it judged (the same token); a taker that
moved a fresh lock instead puts it back. So of two takers exactly one holds the claim, and
only the holder removes its lock.
Holding the claim, the run removes the temporary files a killed writer left (atomic writes go
through `.<name>~<random>~<host>~<pid>.tmp`).
"""

from __future__ import annotations

import fcntl
import os
import secrets
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
    """Hold `lock`, a file that appears exclusively with `<host> <pid> <token>`; removed at the
    end if it is still ours."""
    me = f"{socket.gethostname()} {os.getpid()} {secrets.token_hex(8)}\n"
    mine = lock.with_name(f"{lock.name}.{secrets.token_hex(8)}.new")
    fd = os.open(mine, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as fh:
        fh.write(me)
        fh.flush()
        os.fsync(fh.fileno())
    try:
        while True:
            try:  # a hard link appears whole and only where no lock is: a reader never sees it empty
                os.link(mine, lock)
                break
            except FileExistsError:
                _take_over_if_stale(lock)
    finally:
        mine.unlink()
    try:
        yield
    finally:
        _remove_if(lock, me)


def _remove_if(lock: Path, content: str) -> bool:
    """Remove `lock` if it holds `content`: renamed aside first (atomic), so that a lock another
    process put there in the meantime is never deleted but put back."""
    aside = lock.with_name(f"{lock.name}.{secrets.token_hex(8)}.aside")
    try:
        os.rename(lock, aside)
    except FileNotFoundError:  # another taker has it aside: it puts it back if it is not stale
        return False
    if aside.read_text() == content:
        aside.unlink()
        return True
    try:
        os.link(aside, lock)  # put back, unless a lock is there again (then two would claim it)
    except FileExistsError:
        raise RunDirError(f"--out {lock.parent}: its lock {lock} changed hands twice at once; rerun") from None
    finally:
        aside.unlink()
    return False


def _take_over_if_stale(lock: Path) -> None:
    """Remove `lock` if its process, of this host, is gone; else refuse naming its holder."""
    try:
        content = lock.read_text()
    except FileNotFoundError:  # its holder just finished
        return
    holder, out = content.split(), lock.parent
    if len(holder) not in (2, 3) or not holder[1].isdigit():  # 2: a lock of an incofl before tokens
        raise RunDirError(
            f"--out {out}: unreadable lock file {lock} (no flock on this file system); delete it "
            "if no incofl train is writing this run"
        )
    host, pid = holder[0], int(holder[1])
    if host == socket.gethostname() and not alive(pid):
        _remove_if(lock, content)
        return
    raise RunDirError(
        f"--out {out}: another incofl train (pid {pid} on {host}) is writing this run ({lock}; no "
        "flock on this file system); wait, or delete the file if that process is gone"
    )
