"""The client store (fl/stages/clientstore.py): what clients keep across rounds, in memory up to
a budget and in files beyond it, checkpointed with the run; and the methods that keep per-client
state give the same numbers whether it stays in memory or goes to disk."""

from __future__ import annotations

import errno
import io
import os
import re
import shutil

import pytest
import torch
from helpers import QUIET, engine_on, kept_by, small_synthetic

from incofl.cli import user_errors
from incofl.config import RunConfig
from incofl.deploy.site.client import SavedStores
from incofl.fl.contracts import Round
from incofl.fl.engine import checkpoint
from incofl.fl.engine.simulator import train
from incofl.fl.stages.clientstore import ClientStateError, ClientStore

MB = 2**20


def state(value: float, mb: float = 0.25) -> dict[str, torch.Tensor]:
    """A state of `mb` MiB, every element `value`."""
    return {"w": torch.full((int(mb * MB) // 4,), float(value))}


def value(store: ClientStore, client: int, space: str = "s") -> float:
    return float(store.get(space, client)["w"][0])


def files(folder) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_spills_the_least_recently_used_past_the_budget(tmp_path):
    store = ClientStore(budget_mb=0.6)  # two states of 0.25 MiB fit, three do not
    store.attach(tmp_path)
    for client in range(3):
        store.put("s", client, state(client))
    assert list(store.resident) == [("s", 1), ("s", 2)] and store.used == 2 * MB // 4
    assert files(tmp_path) == {"s-0-1.pt"}  # client 0, the oldest, went to disk
    assert value(store, 1) == 1.0  # read: now the most recent
    assert value(store, 0) == 0.0  # back from its file; client 2 is now the oldest and goes
    assert list(store.resident) == [("s", 1), ("s", 0)] and files(tmp_path) == {"s-0-1.pt", "s-2-2.pt"}
    assert store.get("s", 9) is None and store.get("other", 0) is None
    store.put("other", 5, state(5))
    assert store.clients("s") == [0, 1, 2] and store.clients("other") == [5]


def test_budget_zero_keeps_every_state_in_a_tensor_only_file(tmp_path):
    store = ClientStore(budget_mb=0)
    store.attach(tmp_path)
    store.put("s", 3, state(3.0))
    assert store.used == 0 and not store.resident
    (name,) = files(tmp_path)
    assert torch.equal(torch.load(tmp_path / name, weights_only=True)["w"], state(3.0)["w"])  # no pickled code
    store.put("s", 3, state(4.0))  # replaced: the old file goes, nothing pins it
    assert files(tmp_path) == {"s-3-2.pt"} and value(store, 3) == 4.0


def test_a_checkpoint_keeps_its_values_after_later_puts(tmp_path):
    store = ClientStore(budget_mb=0.3)  # one state in memory
    store.attach(tmp_path)
    store.put("s", 0, state(0.0))
    store.put("s", 1, state(1.0))
    saved = store.state_dict()
    assert set(saved["states"]) == {("s", 1)} and saved["files"] == {("s", 0): "s-0-1.pt"}
    store.put("s", 0, state(10.0))  # replaces the checkpoint's file: that file stays
    store.put("s", 1, state(11.0))
    assert "s-0-1.pt" in files(tmp_path)
    store.load_state_dict(saved)
    assert value(store, 0) == 0.0 and value(store, 1) == 1.0
    store.put("s", 0, state(20.0))
    store.state_dict()
    store.state_dict()  # two newer checkpoints: the first one's files are no longer kept
    assert "s-0-1.pt" not in files(tmp_path) and value(store, 0) == 20.0


def test_a_resumed_store_reads_the_checkpoint_and_drops_later_files(tmp_path):
    old = ClientStore(budget_mb=0)
    old.attach(tmp_path)
    for client in range(3):
        old.put("s", client, state(client))
    saved = old.state_dict()
    old.put("s", 2, state(99.0))  # after the checkpoint (then the process is killed)
    (tmp_path / f".s-1-9.pt~{os.uname().nodename}~999999999.tmp").write_bytes(b"half")  # a killed writer's
    new = ClientStore(budget_mb=0)
    new.load_state_dict(saved)
    new.attach(tmp_path)
    assert [value(new, c) for c in range(3)] == [0.0, 1.0, 2.0]
    assert files(tmp_path) == set(saved["files"].values())  # the later file and the temporary are gone
    new.put("s", 0, state(5.0))
    assert new.entries[("s", 0)].file not in saved["files"].values()  # names are never reused
    shutil.rmtree(tmp_path)
    lost = ClientStore(budget_mb=0)
    lost.load_state_dict(saved)
    with pytest.raises(FileNotFoundError, match="s-0-1.pt: a client state the checkpoint names is missing"):
        lost.attach(tmp_path)  # ckpt.pt copied without its folder


def test_without_a_folder_spills_to_a_temporary_one_and_checkpoints_every_state(tmp_path):
    store = ClientStore(budget_mb=0)
    store.put("s", 0, state(1.0))
    saved = store.state_dict()
    assert saved["files"] == {} and torch.equal(saved["states"][("s", 0)]["w"], state(1.0)["w"])
    store.attach(tmp_path)  # what was spilled moves into the folder
    assert files(tmp_path) == {"s-0-1.pt"} and value(store, 0) == 1.0
    unlimited = ClientStore()
    unlimited.load_state_dict(saved)
    assert value(unlimited, 0) == 1.0 and unlimited.spill_dir is None


# --- damaged, planted and unwritable files: refused, one line naming the file ---------------------


@pytest.mark.parametrize(
    "name",
    [
        "../../x.pt",  # outside the folder: never read, never deleted
        "/etc/x.pt",
        "s-0-9.pt",  # a number the checkpoint's version never reached
        "s-1-1.pt",  # another client's file
        ".s-0-1.pt",
        "s-0-1.pt/../../x.pt",
    ],
)
def test_a_checkpoints_file_names_are_checked_before_any_is_read_or_deleted(tmp_path, name):
    folder = tmp_path / "run" / "clientstate"
    folder.mkdir(parents=True)
    victim = tmp_path / "x.pt"
    torch.save(state(7.0), victim)
    store = ClientStore(budget_mb=0)
    with pytest.raises(ClientStateError, match=f"client state \\('s', 0\\) names the file {re.escape(repr(name))}"):
        store.load_state_dict({"states": {}, "files": {("s", 0): name}, "version": 5})
    assert victim.exists() and not store.entries


def _full_disk_save(real):
    """torch.save on a full disk: to a file object each write fails with ENOSPC; to a path
    torch's archive writer fails with its own RuntimeError, naming no file (what torch 2.14 does
    writing to /dev/full)."""

    class Full(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, data) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def save(obj, f, *args, **kwargs):
        if isinstance(f, str | os.PathLike):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
        return real(obj, Full(), *args, **kwargs)

    return save


def _one_line_naming(err: OSError, path) -> None:
    assert err.errno == errno.ENOSPC and err.filename == str(path)
    assert len(str(err).splitlines()) == 1 and "No space left on device" in str(err)


def test_a_spill_on_a_full_disk_is_one_line_naming_the_file(tmp_path, monkeypatch):
    store = ClientStore(budget_mb=0)
    store.attach(tmp_path)
    monkeypatch.setattr(torch, "save", _full_disk_save(torch.save))
    with pytest.raises(OSError) as err:
        store.put("s", 3, state(3.0))
    _one_line_naming(err.value, tmp_path / "s-3-1.pt")
    assert files(tmp_path) == set()  # no temporary left behind


def test_a_node_state_on_a_full_disk_is_one_line_naming_the_file(tmp_path, monkeypatch):
    states = SavedStores(tmp_path / "client0", every=1)
    monkeypatch.setattr(torch, "save", _full_disk_save(torch.save))
    with pytest.raises(OSError) as err:
        states.save(2, {"states": {}})
    _one_line_naming(err.value, states.path(2))


def test_a_damaged_spill_file_is_one_line_naming_it(tmp_path):
    store = ClientStore(budget_mb=0)
    store.attach(tmp_path)
    store.put("s", 0, state(1.0))
    (tmp_path / "s-0-1.pt").write_bytes(b"PK\x03\x04 not the rest of a torch archive")
    with pytest.raises(ClientStateError) as err:
        store.get("s", 0)
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 's-0-1.pt'}: unreadable client state") and len(message.splitlines()) == 1


# --- the methods: spilled state gives the same numbers --------------------------------------------


@pytest.fixture(scope="module")
def data():
    return small_synthetic(160, 32)


TINY = {
    "models": ["resnet10", "resnet14"],
    "model_scale": 0.125,
    "clients": 4,
    "ratio": 0.5,
    "rounds": 2,
    "batch_size": 20,
    "eval_every": 3,
}


def _fingerprints(engine) -> tuple[str, dict]:
    """The weights' hash (with kept entries) and every client's stored states."""
    spaces = {space for space, _ in engine.transport.clients.store.entries}
    return engine.fingerprint(), {
        (s, c): engine.transport.clients.store.get(s, c)
        for s in spaces
        for c in engine.transport.clients.store.clients(s)
    }


@pytest.mark.slow
@pytest.mark.parametrize("method, settings", [("SCAFFOLD", {}), ("MOON", {}), ("FedAvg", {"bn_stats": "local"})])
def test_a_tiny_budget_computes_what_unlimited_memory_does(data, method, settings):
    runs = []
    for budget in (0, 10_000):
        engine = engine_on(data, **TINY, method=method, client_memory_mb=budget, **settings)
        for round_ in Round.upto(TINY["rounds"]):
            engine.run_round(round_)
        runs.append(engine)
    (h0, stored0), (h1, stored1) = (_fingerprints(e) for e in runs)
    assert (
        runs[0].transport.clients.store.used == 0 and runs[1].transport.clients.store.spill_dir is None
    )  # all on disk / all in memory
    assert h0 == h1 and stored0.keys() == stored1.keys() and stored0
    for key, s in stored0.items():
        assert s.keys() == stored1[key].keys() and all(torch.equal(v, stored1[key][k]) for k, v in s.items())
    if settings:
        assert kept_by(runs[0]).keys() == kept_by(runs[1]).keys()


@pytest.mark.slow
def test_resumed_run_with_spilled_state_equals_uninterrupted(tmp_path, data, monkeypatch):
    """Killed after its round-2 checkpoint with every c_i on disk (ckpt.pt and clientstate/
    copied then), resumed, it ends as the straight run; the finished run removes clientstate/."""
    cfg = RunConfig(
        **{**QUIET, **TINY, "method": "SCAFFOLD", "rounds": 3, "checkpoint_every": 1, "client_memory_mb": 0}
    )
    save = checkpoint.save

    def keep_round_two(path, payload):
        save(path, payload)
        if payload["round"] == 2:
            for copy in ("resumed", "damaged"):
                shutil.copytree(path.parent, tmp_path / copy, ignore=shutil.ignore_patterns("*.log", ".lock"))

    monkeypatch.setattr(checkpoint, "save", keep_round_two)
    straight = train(cfg, tmp_path / "straight", data=data)
    monkeypatch.undo()
    assert any((tmp_path / "resumed" / "clientstate").iterdir())
    resumed = train(cfg, tmp_path / "resumed", data=data)
    assert "resumed from" in (tmp_path / "resumed" / "train.log").read_text()
    assert straight["state_sha256"] == resumed["state_sha256"] and straight["final_acc"] == resumed["final_acc"]
    assert not (tmp_path / "straight" / "clientstate").exists() and not (tmp_path / "resumed" / "clientstate").exists()
    spilled = sorted((tmp_path / "damaged" / "clientstate").iterdir())
    for path in spilled:
        path.write_bytes(path.read_bytes()[:100])  # truncated, as by a full disk without atomic writes
    with pytest.raises(ClientStateError, match=f"^{re.escape(str(spilled[0].parent))}/.*: unreadable client state"):
        train(cfg, tmp_path / "damaged", data=data)  # the CLI prints it as one line, exit 2
    assert ClientStateError in user_errors()
