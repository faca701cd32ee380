"""Issue 64: a peer flooding the SuperLink made its processes print ~41,000 tracebacks in under a minute
and the rotating log rotated how the flood began away. deploy/logs.py keeps each process's first
bytes for ever, rotates a bounded tail after them, drops lines over a rate (saying how many) and cuts
long lines; raise_fd_limit lifts the soft limit of open files. Fast: nothing is started but Python."""

from __future__ import annotations

import io
import itertools
import os
import re
import resource
import subprocess
import sys

import pytest

from incofl.deploy.logs import BURST, CUT, DISK_BYTES, FD_CAP, LINE_CAP, BoundedLog, pump, raise_fd_limit

FLOOD = 1_000_000
QUICK = 200_000  # enough for the head to fill once and the tail to rotate many times


def flood(n: int = FLOOD) -> io.BytesIO:
    """`n` numbered lines, a traceback's size each, as fast as a pipe would give them."""
    return io.BytesIO(b"".join(b"%07d Traceback: %s\n" % (i, b"x" * 80) for i in range(n)))


def files(tmp_path, name="superlink"):
    return sorted(tmp_path.glob(f"{name}.*"))


def dropped(text: str) -> int:
    return sum(int(n) for n in re.findall(r"^\[incofl\] (\d+) lines dropped since ", text, re.M))


@pytest.fixture
def open_umask():
    """A umask that lets anyone read a file: only an explicit mode keeps a log private."""
    old = os.umask(0)
    yield
    os.umask(old)


def test_a_flood_keeps_the_first_lines_says_what_it_dropped_and_stays_within_the_bound(tmp_path):
    """The module's own limits, the real clock: 1,000,000 lines pumped as fast as Python reads them."""
    start = [b"%d starting: the first line of the process" % i for i in range(20)]
    log = BoundedLog(tmp_path / "superlink.log")
    pump(io.BytesIO(b"\n".join(start) + b"\n" + flood().getvalue()), log)
    log.close()
    head = (tmp_path / "superlink.log").read_text().splitlines()
    assert head[:20] == [line.decode() for line in start]
    assert sum(f.stat().st_size for f in files(tmp_path)) <= DISK_BYTES
    text = "".join(f.read_text() for f in files(tmp_path))
    kept = len(re.findall(r"^\d{7} Traceback", text, re.M))
    assert BURST - 20 <= kept < FLOOD // 10  # the burst, then what the rate let through
    assert dropped(text) + kept == FLOOD  # every line written or counted
    assert text.endswith(" a second)\n")  # closing said what was dropped last


def test_the_head_is_kept_for_ever_and_the_tail_rotates_within_the_bound(tmp_path):
    """No rate limit (a clock a second on per line), small files: 200,000 lines fill the head once,
    then the tail rotates many times and the head stays as it was."""
    head_bytes, tail_bytes = 20_000, 10_000
    log = BoundedLog(tmp_path / "node1.log", head_bytes, tail_bytes, clock=itertools.count().__next__)
    pump(flood(QUICK), log)
    log.close()
    names = [f.name for f in files(tmp_path, "node1")]
    assert names == ["node1.log", "node1.tail.log", "node1.tail.log.1"]
    head = (tmp_path / "node1.log").read_text().splitlines()
    assert head[:-1] == [f"{i:07d} Traceback: {'x' * 80}" for i in range(len(head) - 1)]
    assert head[-1].startswith("[incofl] the head of this log ends here; later lines: node1.tail.log")
    assert (tmp_path / "node1.log").stat().st_size <= head_bytes
    sizes = [(tmp_path / name).stat().st_size for name in names[1:]]
    assert max(sizes) <= tail_bytes and sum(sizes) > tail_bytes  # both tail files in use
    older, newer = ((tmp_path / name).read_text().splitlines() for name in names[:0:-1])
    tail = [int(line[:7]) for line in older + newer]
    assert tail == list(range(QUICK - len(tail), QUICK))  # the newest lines, in order, none lost between
    assert "dropped" not in "".join(older + newer)


def test_lines_over_the_rate_are_dropped_counted_and_summed_up_before_the_next(tmp_path):
    """A clock that stands still: the burst is written, the rest dropped; a second on, the rate's worth
    more, the first preceded by the count of those dropped."""
    now = [0.0]
    log = BoundedLog(tmp_path / "superlink.log", rate=50, burst=500, clock=lambda: now[0])
    for i in range(10_000):
        log.write(f"line {i}")
    now[0] = 1.0
    for i in range(10_000, 10_100):
        log.write(f"line {i}")
    log.close()
    lines = (tmp_path / "superlink.log").read_text().splitlines()
    assert lines[:500] == [f"line {i}" for i in range(500)]
    summary = r"\[incofl\] (\d+) lines dropped since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(over 50 a second\)"
    assert re.fullmatch(summary, lines[500]).group(1) == "9500"
    assert lines[501:551] == [f"line {i}" for i in range(10_000, 10_050)]
    assert len(lines) == 552 and re.fullmatch(summary, lines[551]).group(1) == "50"  # said on closing


def test_lines_at_a_normal_rate_are_written_whole_and_in_order(tmp_path):
    log = BoundedLog(tmp_path / "node2.log")
    pump(io.BytesIO(b"".join(b"INFO : round %d: %s\n" % (i, "é".encode() * 30) for i in range(20))), log)
    log.close()
    assert (tmp_path / "node2.log").read_text().splitlines() == [f"INFO : round {i}: {'é' * 30}" for i in range(20)]
    assert [f.name for f in files(tmp_path, "node2")] == ["node2.log"]


def test_long_lines_are_cut_and_every_file_is_0600_whatever_the_umask(tmp_path, monkeypatch, open_umask):
    """As up's log did (test_federation_credentials): a 60 KB line logged as LINE_CAP bytes and CUT; a
    line cut inside a character loses its bytes left, not the file its UTF-8. Files 0600 under umask 0
    from the moment each is opened, also one an earlier up left readable."""
    (tmp_path / "superlink.log").write_text("an earlier up's")
    os.chmod(tmp_path / "superlink.log", 0o644)
    opened, os_open = {}, os.open

    def seen(path, *args, **kwargs):
        fd = os_open(path, *args, **kwargs)
        opened.setdefault(os.fspath(path), set()).add(os.stat(path).st_mode & 0o777)
        return fd

    monkeypatch.setattr(os, "open", seen)
    log = BoundedLog(tmp_path / "superlink.log", 10_000, 10_000, clock=itertools.count().__next__)
    pump(io.BytesIO(b"first\n" + b"p" * 60_000 + b"\n" + b"a" + "é".encode() * 5000 + b"\nlast"), log)
    for i in range(300):  # the tail rotates
        log.write(f"{i} " + "y" * 100)
    log.close()
    lines = (tmp_path / "superlink.log").read_text().splitlines()
    assert lines[:4] == ["first", "p" * LINE_CAP + CUT, "a" + "é" * ((LINE_CAP - 1) // 2) + CUT, "last"]
    assert [f.name for f in files(tmp_path)] == ["superlink.log", "superlink.tail.log", "superlink.tail.log.1"]
    assert {f.stat().st_mode & 0o777 for f in files(tmp_path)} == {0o600}
    assert sorted(opened) == [os.fspath(f) for f in files(tmp_path)[:2]]  # .tail.log.1: a .tail.log renamed
    assert set().union(*opened.values()) == {0o600}


def test_a_log_opened_again_starts_empty_and_drops_an_earlier_tail(tmp_path):
    for run in range(2):
        with BoundedLog(tmp_path / "superlink.log", 10_000, 10_000, clock=itertools.count().__next__) as log:
            for i in range(200 // (run + 1)):
                log.write(f"run {run} line {i} " + "z" * 100)
    assert [f.name for f in files(tmp_path)] == ["superlink.log", "superlink.tail.log"]
    lines = [line for f in files(tmp_path) for line in f.read_text().splitlines() if not line.startswith("[incofl]")]
    assert lines == [f"run 1 line {i} " + "z" * 100 for i in range(100)]


def test_raise_fd_limit_lifts_a_lowered_soft_limit_to_the_hard_one_for_children_too(tmp_path):
    """In a process of its own (the limit is the process's): soft lowered, raised, seen by a child."""
    script = """
import resource, subprocess, sys
from incofl.deploy.logs import raise_fd_limit
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
now = raise_fd_limit()
child = subprocess.run([sys.executable, "-c", "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])"],
                       capture_output=True, text=True, check=True).stdout
print(hard, now, resource.getrlimit(resource.RLIMIT_NOFILE)[0], child)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=os.environ)
    hard, now, soft, child = (int(n) for n in out.stdout.split())
    assert now == soft == child > 64
    if hard != resource.RLIM_INFINITY:  #: FD_CAP or what the OS allows
        assert now == hard
    else:
        assert now <= FD_CAP
    assert raise_fd_limit() >= 64  # here too: never lowers
