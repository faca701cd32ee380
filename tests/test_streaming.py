"""Rounds that stream (fl/engine/fold.py): each client's update is folded into the round's
running sums as it is trained and then let go; folding in any order, or holding updates on disk
for a whole-round transform, gives the same bits."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from helpers import engine_on, small_synthetic

from incofl.fl.contracts import ClientUpdate, Round
from incofl.fl.engine.divergence import first_nonfinite
from incofl.fl.engine.fold import Held, RoundFold

SETTINGS = {
    "clients": 6,
    "partition": "iid",
    "ratio": 1.0,
    "models": ["resnet10"],
    "model_scale": 0.25,
    "batch_size": 4,
    "rounds": 2,
}


@pytest.fixture(scope="module")
def data():
    return small_synthetic(48)


def _tensors(update: ClientUpdate) -> list[torch.Tensor]:
    extras = [t for v in update.extra.values() for t in v.values()]
    return [*update.delta.values(), *extras]


@pytest.mark.parametrize("method", ["FedAvg", "SCAFFOLD", "InCoAvg"])
def test_a_round_holds_no_update_but_the_one_in_flight(method, data):
    """When a client's update is handed on, every update before the previous one (which the
    consumer's loop still names) is gone: deltas and extras (SCAFFOLD's increments) alike. The
    engine that kept the round's updates until aggregation fails this."""
    engine = engine_on(data, method=method, **SETTINGS)
    train, refs, alive = engine.transport.clients.runner.trainer.train, [], []

    def watched(*args):
        for update in train(*args):
            gc.collect()
            alive.append(sum(ref() is not None for earlier in refs[:-1] for ref in earlier))
            refs.append([weakref.ref(t) for t in _tensors(update)])
            yield update

    engine.transport.clients.runner.trainer.train = watched
    engine.run_round(Round(1))
    assert len(refs) == 6 and all(refs) and alive == [0] * 6


def _trained_round(engine):
    """Round 1's plans and its clients' updates, through the engine's transport (not yet folded in)."""
    plans, server = engine.server.plan(Round(1)), engine.server
    return plans, [
        reply.update for reply in engine.transport.train(Round(1), plans, server.start, server.broadcasts(plans))
    ]


def _concluded(engine, plans, updates):
    """The round's report with `updates` folded in, in order (what Engine.run_round does with them)."""
    fold = RoundFold(engine.server, Round(1), plans)
    for update in updates:
        fold.add(update)
    return fold.finish()


def test_updates_in_any_order_or_left_out_fold_to_the_same_bits(data):
    """A federation's replies come in any order and some never come: folded in the plans' order
    (the early ones wait), with a dropped client left out, the round equals the simulator's
    `conclude` over the clients that replied, bit for bit."""
    ordered, shuffled = (engine_on(data, method="SCAFFOLD", **SETTINGS) for _ in range(2))
    plans, updates = _trained_round(ordered)
    expected = _concluded(ordered, plans[:2] + plans[3:], updates[:2] + updates[3:])
    plans, updates = _trained_round(shuffled)
    fold = RoundFold(shuffled.server, Round(1), plans)
    for update in [*reversed(updates[3:]), updates[1]]:
        fold.add(update)
    fold.drop(plans[2].client)
    fold.add(updates[0])
    got = fold.finish()
    assert (got.samples, got.upload_bytes, got.losses) == (expected.samples, expected.upload_bytes, expected.losses)
    assert ordered.fingerprint() == shuffled.fingerprint()
    assert all(
        torch.equal(ordered.server.objective.c[0][k], shuffled.server.objective.c[0][k])
        for k in ordered.server.objective.c[0]
    )  # SCAFFOLD's c: the increments' sum, in the plans' order
    with pytest.raises(ValueError, match=r"round 1: client 99 is not planned or was already folded in"):
        RoundFold(shuffled.server, Round(1), plans).add(ClientUpdate(99, 0, {}, 1, 1))
    fold = RoundFold(shuffled.server, Round(1), plans)
    fold.add(updates[0])
    with pytest.raises(ValueError, match=rf"client {plans[0].client} is not planned or was already folded in"):
        fold.add(updates[0])


def test_held_updates_spill_to_disk_and_come_back_the_same():
    held = Held(0, torch.device("cpu"))  # budget 0: every delta goes to disk as it is put
    updates = [ClientUpdate(c, 0, {"w": torch.randn(3, 2), "b": torch.randn(2)}, 5 + c, 2) for c in range(3)]
    copies = [{k: v.clone() for k, v in u.delta.items()} for u in updates]
    for u in updates:
        held.put(u)
    assert held.store.used == 0 and all(e.state is None and e.file for e in held.store.entries.values())
    back = list(held)
    assert [(u.client, u.num_samples) for u in back] == [(u.client, u.num_samples) for u in updates]
    assert all(torch.equal(u.delta[k], c[k]) for u, c in zip(back, copies, strict=True) for k in c)


def test_fednova_round_with_its_updates_on_disk_is_the_same(data):
    """FedNova's tau_eff needs every client first: the round holds its updates, here every one on
    disk (client_memory_mb 0), and folds them after the last, to the same bits as in memory."""
    in_memory, on_disk = (
        engine_on(data, method="FedNova", **SETTINGS, client_memory_mb=budget) for budget in (2048, 0)
    )
    for engine in (in_memory, on_disk):
        engine.run_round(Round(1))
    assert in_memory.fingerprint() == on_disk.fingerprint()


def test_the_engine_ticks_once_a_client(data):
    engine = engine_on(data, method="FedAvg", **{**SETTINGS, "ratio": 0.5})
    ticks = []
    engine.tick = lambda: ticks.append(1)
    engine.run_round(Round(1))
    assert len(ticks) == len(engine.server.schedule[0]) == 3


def test_the_finiteness_check_names_the_first_bad_tensor_and_nothing_finite():
    """Per client: a sum first (NaN and inf make it non-finite), element by element only then; a
    finite tensor whose sum overflows is still finite."""
    finite = {"a": torch.ones(4), "n": torch.arange(3)}
    assert first_nonfinite(finite) is None and first_nonfinite({}) is None
    assert first_nonfinite({"big": torch.full((4,), 60000.0, dtype=torch.float16), **finite}) is None
    for bad in (float("nan"), float("inf"), -float("inf")):
        assert first_nonfinite({**finite, "b": torch.tensor([1.0, bad]), "c": torch.tensor([bad])}) == "b"
