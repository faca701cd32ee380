"""The run directory: one writer at a time, nothing half-written left behind.

`incofl train` claims its `--out` with an exclusive lock (a second process on the same
directory is refused with one line naming the holder's pid) and, holding it, removes the
temporary files a killed writer left (atomic writes go through `.<name>~<host>~<pid>.tmp`).
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from incofl.atomic import remove_stale_temporaries

LOCK = ".lock"


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
        except OSError as err:  # a file system without flock (some network mounts): run unlocked
            logging.getLogger(__name__).warning("%s: cannot lock (%s); running without a lock", out, err.strerror)
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        remove_stale_temporaries(out)
        yield
