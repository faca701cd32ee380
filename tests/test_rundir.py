"""The run directory's lock file where the file system has no flock (fl/engine/rundir.py):
two processes taking over one dead writer's lock at once, the race the takeover's rename and
token close."""

from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess
import sys
from pathlib import Path

from incofl.fl.engine import rundir


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def _taker(lock: Path, dead: int, first: bool, gate, holding, done, results) -> None:
    """Take over `lock`: both takers judge the dead writer's lock stale together (`gate`); the
    second goes on only once the first holds the claim, the order in which a blind unlink
    deletes the winner's fresh lock."""
    alive = rundir.alive

    def judged(pid: int) -> bool:
        if pid != dead:
            return alive(pid)
        gate.wait(timeout=10)
        if not first:
            holding.wait(timeout=10)
        return False

    rundir.alive = judged
    try:
        with rundir.owned(lock):
            holding.set()
            done.wait(timeout=10)  # the other taker has finished trying
            results.put(("held", lock.read_text().split()[1] == str(os.getpid())))
    except rundir.RunDirError as err:
        results.put(("refused", str(err)))
    finally:
        done.set()


def test_two_takers_of_a_stale_lock_one_holds_it_and_its_lock_stays(tmp_path):
    lock, dead = tmp_path / rundir.OWNER, _dead_pid()
    lock.write_text(f"{socket.gethostname()} {dead}\n")  # as an incofl before tokens left it, too
    fork = multiprocessing.get_context("fork")
    gate, holding, done, results = fork.Barrier(2), fork.Event(), fork.Event(), fork.Queue()
    takers = [
        fork.Process(target=_taker, args=(lock, dead, first, gate, holding, done, results)) for first in (True, False)
    ]
    for p in takers:
        p.start()
    for p in takers:
        p.join(timeout=30)
    outcomes = sorted(results.get(timeout=5) for _ in takers)
    assert [o[0] for o in outcomes] == ["held", "refused"], outcomes
    assert outcomes[0][1] is True  # the lock named the holder all along: the loser left it alone
    assert "another incofl train (pid" in outcomes[1][1]
    assert not lock.exists() and sorted(p.name for p in tmp_path.iterdir()) == []  # the holder removed its own


def test_the_holder_removes_only_its_own_lock(tmp_path):
    lock = tmp_path / rundir.OWNER
    with rundir.owned(lock):
        lock.unlink()
        lock.write_text("elsewhere 1 feedfacefeedface\n")  # another's lock, e.g. after a forced delete
    assert lock.read_text() == "elsewhere 1 feedfacefeedface\n"
