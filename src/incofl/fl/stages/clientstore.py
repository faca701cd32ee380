"""What each client keeps across rounds, in one store: in memory up to a budget, on disk beyond.

A client's state (SCAFFOLD's c_i, MOON's previous local models, the entries a client keeps to
itself: local BN statistics, personal layers) lives under a namespace (`space`) and the
client's index. `put` replaces a state (the store never copies: a state put or returned must
not be modified in place); `get` returns it, or None if the client has none in that space.

Memory: states are held on the CPU, least recently used first out. Past the budget the oldest
are spilled to files in the run's folder (`attach`; before one, a temporary folder), each a new
immutable file, written atomically and read back with `torch.load(weights_only=True)` (tensors
only, no pickled code). A state read back stays in its file, so dropping it again costs no
write. With budget 0 every state goes to disk as it is put; None keeps everything in memory.

Checkpoints: `state_dict()` holds the states in memory themselves (at most the budget: they
go into ckpt.pt) and the names of the spilled ones' files. A file is deleted once no state
refers to it and neither of the last two checkpoints does (the newest may still be being
written when a later `put` replaces its state; the one before is then the one on disk). Later
puts never change a file, so a checkpoint (ckpt.pt with the folder) stays valid until a newer
one is saved; `attach` after resuming deletes what the checkpoint does not name. A name read
from a checkpoint must be one the store writes (`<space>-<client>-<n>.pt` of its own key, n up
to the checkpoint's version): a damaged or planted one (`../../x.pt`) is refused before any file
is read or deleted. A file that cannot be written (a full disk) or read back (damaged) is one
line naming it.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from incofl.atomic import remove_stale_temporaries, save_tensors
from incofl.fl.contracts import State

Key = tuple[str, int]  # (space, client)
PINNED = 2  # manifests whose files are kept: the newest and the checkpoint before it


@dataclass
class _Entry:
    state: State | None  # in memory (None: only in its file)
    file: str | None  # the name of its file (None: not written since it was put)
    nbytes: int


class ClientStateError(ValueError):
    """A client state file that a checkpoint names wrongly, or that cannot be read: names it."""


def checked_name(key: Any, name: Any, version: int) -> str:
    """`name`, a spill file of state `key` read from a checkpoint, if it is one the store writes."""
    space, client = key if isinstance(key, tuple) and len(key) == 2 else (None, None)
    ours = isinstance(space, str) and type(client) is int and isinstance(name, str)
    n = re.fullmatch(rf"{re.escape(space)}-{client}-([1-9][0-9]*)\.pt", name) if ours else None
    if n is None or int(n[1]) > version or "/" in name or "\\" in name or name.startswith("."):
        raise ClientStateError(
            f"checkpoint: client state {key!r} names the file {name!r}, not one the client store writes "
            f"(<space>-<client>-<n>.pt, n <= {version}): a damaged or planted checkpoint; delete it to start over"
        )
    return name


class ClientStore:
    """Per-client states by (space, client): an LRU cache over immutable spill files."""

    def __init__(self, budget_mb: float | None = None):
        self.budget = None if budget_mb is None else int(budget_mb * 2**20)
        self.entries: dict[Key, _Entry] = {}
        self.resident: OrderedDict[Key, None] = OrderedDict()  # states in memory, least recently used first
        self.used = 0  # bytes of the states in memory
        self.version = 0  # the last file written: names are never reused, so files never change
        self.folder: Path | None = None
        self.spill_dir: tempfile.TemporaryDirectory | None = None  # spills before a folder is attached
        self.pinned: list[set[str]] = []  # the files of the last manifests, oldest first

    def get(self, space: str, client: int) -> State | None:
        key = (space, client)
        entry = self.entries.get(key)
        if entry is None:
            return None
        state = entry.state
        if state is None:
            state = entry.state = self._read(entry.file)
            self._admit(key, entry)
        else:
            self.resident.move_to_end(key)
        return state

    def put(self, space: str, client: int, state: State) -> None:
        key = (space, client)
        old = self.entries.pop(key, None)
        if old is not None:
            self._drop(key, old)
            if old.file is not None:
                self._release({old.file})
        state = {k: v.detach().cpu() for k, v in state.items()}
        self.entries[key] = entry = _Entry(state, None, 0)
        self._admit(key, entry)

    def clients(self, space: str) -> list[int]:
        """The clients with a state in `space`, in order."""
        return sorted(client for s, client in self.entries if s == space)

    def attach(self, folder: str | os.PathLike) -> None:
        """Spill into `folder` from now on (a run's <out>/clientstate): files spilled before move
        there, and files no state or manifest names (a killed run's, after its checkpoint) go."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(folder)
        if self.spill_dir is not None:
            for entry in self.entries.values():
                if entry.file is not None:
                    shutil.move(Path(self.spill_dir.name) / entry.file, folder / entry.file)
            self.spill_dir.cleanup()
            self.spill_dir = None
        self.folder = folder
        named = self._named()
        for path in folder.glob("*.pt"):
            if path.name not in named:
                path.unlink()
        missing = sorted(e.file for e in self.entries.values() if e.file and not (folder / e.file).exists())
        if missing:
            raise FileNotFoundError(
                f"{folder / missing[0]}: a client state the checkpoint names is missing "
                "(a checkpoint is ckpt.pt with its clientstate/ folder)"
            )

    def state_dict(self) -> dict[str, Any]:
        """The states in memory themselves and the names of the spilled ones' files (without a
        folder, every state: a temporary folder does not outlive the process)."""
        inline = {key: self._peek(e) for key, e in self.entries.items() if e.state is not None or self.folder is None}
        files = {key: e.file for key, e in self.entries.items() if key not in inline}
        dropped = set().union(*self.pinned[: -PINNED + 1])
        self.pinned = [*self.pinned[-PINNED + 1 :], set(files.values())]
        self._release(dropped)
        return {"states": inline, "files": files, "version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.entries, self.resident, self.used = {}, OrderedDict(), 0
        self.version = state["version"]
        files = {key: checked_name(key, name, self.version) for key, name in state["files"].items()}
        self.pinned = [set(files.values())]
        self.entries |= {key: _Entry(None, name, 0) for key, name in files.items()}
        for key, saved in state["states"].items():
            self.put(*key, saved)

    def _admit(self, key: Key, entry: _Entry) -> None:
        """Count a state in memory as the most recently used, then spill the oldest past the budget."""
        entry.nbytes = sum(v.nbytes for v in entry.state.values())
        self.resident[key] = None
        self.used += entry.nbytes
        while self.budget is not None and self.used > self.budget and self.resident:
            oldest = next(iter(self.resident))
            spilled = self.entries[oldest]
            if spilled.file is None:
                spilled.file = self._write(oldest, spilled.state)
            self._drop(oldest, spilled)

    def _drop(self, key: Key, entry: _Entry) -> None:
        """Out of memory (its file, if any, stays)."""
        if key in self.resident:
            del self.resident[key]
            self.used -= entry.nbytes
        entry.state = None

    def _write(self, key: Key, state: State) -> str:
        self.version += 1
        name = f"{key[0]}-{key[1]}-{self.version}.pt"
        save_tensors(self._dir() / name, state)
        return name

    def _peek(self, entry: _Entry) -> State:
        """A state without touching the cache's order."""
        if entry.state is not None:
            return entry.state
        return self._read(entry.file)

    def _read(self, name: str) -> State:
        path = self._dir() / name
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise
        except Exception as err:  # truncated, damaged, or objects other than tensors: never unpickled
            raise ClientStateError(
                f"{path}: unreadable client state ({type(err).__name__}: damaged, or not a file incofl wrote); "
                "delete the run's ckpt.pt and clientstate/ to start it over"
            ) from None

    def _named(self) -> set[str]:
        """The files a state or a pinned manifest refers to."""
        return {e.file for e in self.entries.values() if e.file is not None}.union(*self.pinned)

    def _release(self, names: set[str]) -> None:
        """Delete those of `names` nothing refers to any more."""
        if not names:
            return
        for name in names - self._named():
            (self._dir() / name).unlink(missing_ok=True)

    def _dir(self) -> Path:
        if self.folder is not None:
            return self.folder
        if self.spill_dir is None:
            self.spill_dir = tempfile.TemporaryDirectory(prefix="incofl-clientstate-")
        return Path(self.spill_dir.name)
