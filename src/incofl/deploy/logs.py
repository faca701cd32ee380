"""Each process's log that `incofl federation up` keeps, bounded so that a flood cannot hide how it began.

A security review measured a peer flooding the SuperLink: Flower, uvicorn and asyncio wrote ~41,000
tracebacks (36 MiB) and 63,000 error lines in under a minute, and a log that only rotated (16 MiB x 3)
rotated every earlier line away. A BoundedLog therefore keeps the first HEAD_BYTES of a process's
output for ever (`<name>.log`), writes the rest to a rotating tail (`<name>.tail.log`, `.tail.log.1`),
admits at most RATE lines a second (BURST at once) and says how many it dropped: at most DISK_BYTES a
process on disk, whatever the process is made to print.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

LINE_CAP = 4096  # bytes of a line a process logs (the rest of a longer one is cut)
CUT = " [cut]"  # ends a line that was cut
HEAD_BYTES = 4 << 20  # the first bytes of a process's log, kept for ever
TAIL_BYTES = 8 << 20  # each of the two tail files, the newer lines after the head
DISK_BYTES = HEAD_BYTES + 2 * TAIL_BYTES  # on disk a process, at most: 20 MiB
RATE, BURST = 50.0, 500  # lines a second on average, and at once; more are dropped and counted
FD_CAP = 1 << 20  # open files up asks for where the hard limit is unlimited
MODE = 0o600  # every log file: its owner's only, from the moment it exists


def _create(path: Path) -> int:
    """`path` made anew 0600, open to append: an earlier up's file (of whatever mode) or link is removed
    first, and the mode given at creation, so that no other user can open it at any moment."""
    path.unlink(missing_ok=True)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, MODE)


class BoundedLog:
    """One process's log: its first `head_bytes` in `path` (never rotated), then a tail rotating between
    `<stem>.tail.log` and `<stem>.tail.log.1` at `tail_bytes` each, every line cut at LINE_CAP bytes, at
    most `rate` lines a second (`burst` at once; a token bucket on `clock`). A line admitted after some
    were dropped is preceded by one saying how many and since when. Locked: a pump thread writes while
    up closes."""

    def __init__(
        self,
        path: Path,
        head_bytes: int = HEAD_BYTES,
        tail_bytes: int = TAIL_BYTES,
        rate: float = RATE,
        burst: int = BURST,
        clock: Callable[[], float] = time.monotonic,
    ):
        path = Path(path)
        self.tail = path.with_name(f"{path.stem}.tail.log")
        self.older = path.with_name(f"{self.tail.name}.1")
        ends = f"[incofl] the head of this log ends here; later lines: {self.tail.name}, {self.older.name}\n"
        self.marker = ends.encode()
        if tail_bytes < LINE_CAP + len(CUT) + 128 or head_bytes < len(self.marker):
            raise ValueError(f"head_bytes {head_bytes}, tail_bytes {tail_bytes}: too small for a line")
        self.head_bytes, self.tail_bytes, self.rate, self.burst, self.clock = head_bytes, tail_bytes, rate, burst, clock
        self.lock = threading.Lock()
        for stale in (self.tail, self.older):  # an earlier up's
            stale.unlink(missing_ok=True)
        self.head: int | None = _create(path)
        self.fd: int | None = None  # the tail's, once the head is full
        self.written = 0  # bytes in the file written to now
        self.tokens, self.last = float(burst), clock()
        self.dropped, self.since = 0, ""
        self.closed = False

    def write(self, line: str, cut: bool = False) -> None:
        """`line` (no newline) logged unless over the rate, cut at LINE_CAP bytes (and then marked CUT)."""
        with self.lock:
            if self.closed:
                return
            now = self.clock()
            self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.rate)
            self.last = now
            if self.tokens < 1:
                if not self.dropped:
                    self.since = time.strftime("%Y-%m-%d %H:%M:%S")
                self.dropped += 1
                return
            self.tokens -= 1
            self._summary()
            data = line.encode("utf-8", "replace")
            if len(data) > LINE_CAP:  # the cut may split a character: its bytes left are dropped
                data, cut = data[:LINE_CAP].decode("utf-8", "ignore").encode(), True
            self._append(data + (CUT.encode() if cut else b"") + b"\n")

    def close(self) -> None:
        """Says what was dropped since the last line, then closes the files; later writes are ignored."""
        with self.lock:
            if self.closed:
                return
            self._summary()
            self.closed = True
            for fd in (self.head, self.fd):
                if fd is not None:
                    os.close(fd)

    def __enter__(self) -> BoundedLog:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _summary(self) -> None:
        if self.dropped:
            note = f"[incofl] {self.dropped} lines dropped since {self.since} (over {self.rate:g} a second)\n"
            self.dropped = 0
            self._append(note.encode())

    def _append(self, data: bytes) -> None:
        if self.head is not None:
            if self.written + len(data) + len(self.marker) <= self.head_bytes:
                self.written += os.write(self.head, data)
                return
            os.write(self.head, self.marker)  # the head is full: kept as it is from now on
            os.close(self.head)
            self.head, self.fd, self.written = None, _create(self.tail), 0
        assert self.fd is not None
        if self.written + len(data) > self.tail_bytes:  # the tail rotates: its older file is replaced
            os.close(self.fd)
            os.replace(self.tail, self.older)
            self.fd, self.written = _create(self.tail), 0
        self.written += os.write(self.fd, data)


def pump(stream: IO[bytes], log: BoundedLog) -> None:
    """Each line a process writes, into `log` until EOF: read LINE_CAP bytes at most at a time, so a line
    of any length (a request's path, a peer's bytes) costs a bounded read, and a longer line's rest is
    skipped, the line marked CUT."""
    whole = True  # the last piece read ended its line
    for piece in iter(lambda: stream.readline(LINE_CAP), b""):
        ends = piece.endswith(b"\n")
        if whole:
            log.write(piece[: -1 if ends else None].decode("utf-8", "replace"), cut=not ends and len(piece) >= LINE_CAP)
        whole = ends


def raise_fd_limit() -> int:
    """This process's soft limit of open files raised to its hard limit (FD_CAP where that is unlimited, or
    what the OS allows below it), for the processes started after to inherit: a SuperLink that many peers
    connect to runs out of descriptors at a soft limit of 1024 long before its hard limit. The soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = FD_CAP if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft
    for want in (target, 1 << 16, 10240):  # macOS refuses more than kern.maxfilesperproc
        if want > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
                break
            except (ValueError, OSError):
                continue
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
