"""incofl's methods as a Flower app (docs/federation.md): the codec is exact, the in-process
federation (the real ServerApp and ClientApp, one Context per node) gives the simulator's
weights and metrics for a method of each family, bad replies and lost nodes are refused by
name, and what cannot run federated is refused before anything starts."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

if not os.environ.get("CI"):  # CI installs the extra: there a missing flwr fails
    pytest.importorskip("flwr", reason="the flower extra is not installed (pip install -e '.[flower]')")

from federation_helpers import (  # noqa: E402
    TINY,
    WIDTH,
    export_sites,
    metrics,
    no_data_set,
    read_site,
    run_both,
    scheduled,
    server_facts,
    signed_sites,
    silent_from,
    write_config,
)

from incofl.config import ConfigError, RunConfig, load_run_config  # noqa: E402
from incofl.data.partition import partition_for  # noqa: E402
from incofl.data.sources import dataset_for  # noqa: E402
from incofl.fl.contracts import ClientPlan, ClientUpdate, Round, View  # noqa: E402
from incofl.registry import METHODS  # noqa: E402


def federated(name: str) -> dict[str, Any]:
    """What a registered method needs of the tiny federated run (digits, 4 clients, 2 rounds),
    from its registry entry: a new method is tested by being registered."""
    method, out = METHODS[name], {"methods": [name]}
    if method.width:  # colour images and batch BN at evaluation (static BN is refused federated), 24 images a client
        out |= {**WIDTH, "client_samples": 24}
        if method.objective.exits:
            out |= {"models": ["resnet110"], "width_rates": [0.5, 1.0], "exits": [2, 4]}
    if method.planner.personal:  # personal layers kept on the nodes, scored there on the held-out share
        out["holdout"] = 0.2
    if method.partial:  # FedPart: a full round, then partial ones
        out |= {"models": ["resnet10"], "rounds": 3}
    # an eighth of the channels for every method (in place of TINY's and WIDTH's quarter): the two
    # paths' bits agree at any width, and these 32 cases took 151 s on CI at a quarter
    return out | {"model_scale": 0.125}


# every registered method, and local BN statistics kept on the nodes (each group's first client's
# model then scored on its node's test split)
EQUAL = {name: federated(name) for name in sorted(METHODS)} | {
    "FedPer, bn_stats local": {**federated("FedPer"), "bn_stats": "local"}
}


def test_codec_round_trip_is_exact():
    from incofl.deploy.wire.codec import job_content, read_job, read_update, update_content
    from incofl.fl.engine.exchange import ExpectedUpdate, TrainJob

    gen = torch.Generator().manual_seed(0)
    start = {"w": torch.randn(3, 4, generator=gen), "n": torch.tensor(7)}
    index = {"w": (torch.tensor([0, 2]), None), "n": ()}
    plan = ClientPlan(
        3, 1, 0, 4, trainable=frozenset({"w"}), keep=frozenset({"n"}), last_grad=True, view=View(1, index, 0.25)
    )
    job = read_job(TrainJob, job_content(TrainJob(Round(5), plan, start, {"c": start["w"] * 2}, "ab12")), "cpu")
    back, got, broadcast = job.plan, job.start, job.broadcast
    assert (
        job.round == Round(5)
        and job.state_sha256 == "ab12"
        and (back.client, back.group, back.federation, back.federation_size) == (3, 1, 0, 4)
    )
    assert (back.trainable, back.upload, back.keep, back.last_grad) == ({"w"}, None, {"n"}, True)
    assert back.view.group == 1 and back.view.cost == 0.25 and back.view.index["w"][1] is None
    assert torch.equal(back.view.index["w"][0], index["w"][0]) and back.view.index["n"] == ()
    assert all(torch.equal(got[k], start[k]) and got[k].dtype == start[k].dtype for k in start)
    assert list(got) == list(start) and torch.equal(broadcast["c"], start["w"] * 2)
    update = ClientUpdate(
        3,
        1,
        {"w": start["w"] / 3},
        17,
        5,
        extra={"last_grad": {"w": start["w"]}},
        loss=0.5,
        upload_params=12,
        classes=torch.tensor([1, 4]),
    )
    entries = {"w": ((3, 4), torch.float32)}
    expected = ExpectedUpdate(plan, entries, {"last_grad": entries}, 17, 5, 12, torch.tensor([1, 4]))
    decoded, kept, state = read_update(update_content(update, "abc", "def"), expected, "cpu")
    assert (kept, state) == ("abc", "def") and torch.equal(decoded.delta["w"], update.delta["w"])
    assert torch.equal(decoded.extra["last_grad"]["w"], start["w"]) and torch.equal(decoded.classes, update.classes)
    assert (decoded.num_samples, decoded.steps, decoded.loss, decoded.upload_params) == (17, 5, 0.5, 12)


DTYPES_STATE = {  # one entry of every dtype a packed state may hold, odd shapes included
    "w": torch.randn(3, 4, generator=torch.Generator().manual_seed(1)),
    "nan": torch.tensor([float("nan"), -0.0, float("inf")]),
    "num_batches_tracked": torch.tensor(7),
    "f64": torch.tensor([1 / 3], dtype=torch.float64),
    "f16": torch.tensor([[0.1, -2.5]], dtype=torch.float16),
    "bf16": torch.tensor([0.1, 3e38], dtype=torch.bfloat16),
    "i32": torch.tensor([-(2**31)], dtype=torch.int32),
    "i16": torch.tensor([-3], dtype=torch.int16),
    "i8": torch.tensor([-1], dtype=torch.int8),
    "u8": torch.tensor([255], dtype=torch.uint8),
    "mask": torch.tensor([True, False]),
    "empty": torch.zeros(0, 3),
    "t": torch.arange(6.0).reshape(2, 3).t(),  # not contiguous
}


def _raw(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def test_a_packed_state_is_one_record_of_two_arrays_and_round_trips_bit_for_bit_in_every_dtype():
    from incofl.deploy.wire.codec import DTYPES, from_arrays, read_state, to_arrays

    assert {str(t.dtype).removeprefix("torch.") for t in DTYPES_STATE.values()} == set(DTYPES)
    record = to_arrays(DTYPES_STATE)
    assert list(record) == ["index", "data"]
    assert record["data"].data == b"".join(_raw(t) for t in DTYPES_STATE.values())
    expected = {name: (tuple(t.shape), t.dtype) for name, t in DTYPES_STATE.items()}
    for back in (from_arrays(record), read_state(record, expected, "delta", "cpu")):
        assert list(back) == list(DTYPES_STATE)  # the sender's order
        for name, t in DTYPES_STATE.items():
            assert back[name].dtype == t.dtype and back[name].shape == t.shape and _raw(back[name]) == _raw(t), name
    empty = to_arrays({})
    assert [len(a.data) for a in empty.values()] == [2, 0] and from_arrays(empty) == {}
    assert read_state(empty, {}, "extra", "cpu") == {}


def test_a_messages_states_travel_bundled_as_three_objects_and_unbundle_to_the_same_records():
    """k packed states are 5k of Flower's objects (a record, its two Arrays and their data), bundled
    3 whatever k: fewer requests on every hop (docs/performance.md, Flower)."""
    from flwr.app import ConfigRecord, RecordDict
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    from incofl.deploy.wire.codec import BUNDLE, bundled, to_arrays, unbundled

    states = {"delta": to_arrays(DTYPES_STATE), "classes": to_arrays({"classes": torch.tensor([1, 4])})}
    content = RecordDict({**states, "kept": ConfigRecord({"sha256": "a"})})
    travels = bundled(content)
    assert set(travels.array_records) == {BUNDLE} and set(travels.config_records) == {"kept"}
    objects = lambda c: len(get_all_nested_objects(c))  # noqa: E731 (a message: its content and one more)
    assert objects(content) - objects(travels) == 5 * len(states) - 3
    back = unbundled(travels)
    assert list(back.array_records) == list(states) and set(back.config_records) == {"kept"}
    for name, record in states.items():
        assert [(k, a.data, a.stype, a.shape) for k, a in back[name].items()] == [
            (k, a.data, a.stype, a.shape) for k, a in record.items()
        ]
    no_arrays = RecordDict({"kept": ConfigRecord({"sha256": "a"})})
    assert bundled(no_arrays) is no_arrays and unbundled(no_arrays) is no_arrays


def _bundle(table, tail: bytes = b"", size: int | None = None):
    """A message whose bundle holds this table (JSON of `table`, or these bytes) and `tail` after it."""
    from flwr.app import ArrayRecord, ConfigRecord, RecordDict

    from incofl.deploy.wire.codec import BUNDLE, HEAD, packed_array

    head = table if isinstance(table, bytes) else json.dumps(table).encode()
    blob = (len(head) if size is None else size).to_bytes(HEAD, "little") + head + tail
    return RecordDict({BUNDLE: ArrayRecord({"data": packed_array(blob)}), "kept": ConfigRecord({"sha256": "a"})})


@pytest.mark.parametrize(
    "content, why",
    [
        (lambda: _bundle([["delta", 1, 2]], b"ab"), "lengths do not add up"),
        (lambda: _bundle([["delta", 1, 2]], b"abcd"), "lengths do not add up"),
        (lambda: _bundle([["delta", -1, 2]], b"a"), "not [str, int >= 0, int >= 0]"),
        (lambda: _bundle([["delta", 1, 1], ["delta", 0, 0]], b"ab"), "'delta' twice"),
        (lambda: _bundle([["kept", 0, 0]]), "'kept' twice"),
        (lambda: _bundle([["incofl.bundle", 0, 0]]), "'incofl.bundle' twice"),
        (lambda: _bundle(b"[[", size=2), "its table is not JSON"),
        (lambda: _bundle({"delta": [0, 0]}), "not a list of at most 256 entries"),
        (lambda: _bundle([[f"s{i}", 0, 0] for i in range(257)]), "not a list of at most 256 entries"),
        (lambda: _bundle([], size=1 << 40), "a table of 1099511627776 bytes"),
        (lambda: _bundle([], size=(1 << 16) + 1, tail=bytes(1 << 17)), "a table of 65537 bytes"),
    ],
)
def test_a_malformed_bundle_is_refused_before_any_state_is_read(content, why):
    from incofl.deploy.wire.codec import CodecError, unbundled

    with pytest.raises(CodecError, match=re.escape(why)):
        unbundled(content())


def test_states_beside_or_without_a_bundle_are_refused():
    from flwr.app import ArrayRecord, RecordDict

    from incofl.deploy.wire.codec import BUNDLE, CodecError, bundled, packed_array, to_arrays, unbundled

    travels = bundled(RecordDict({"delta": to_arrays(STATE)}))
    for content in (
        RecordDict({"delta": to_arrays(STATE)}),  # unbundled: not how states travel
        RecordDict({**travels, "classes": to_arrays({"classes": torch.tensor([1])})}),
        RecordDict({BUNDLE: ArrayRecord({"data": packed_array(b""), "more": packed_array(b"")})}),
    ):
        with pytest.raises(CodecError, match="travel in one record"):
            unbundled(content)


def _pack(index, data: bytes):
    """A record in the packed form with this index (JSON of `index`, or these bytes) and data."""
    from flwr.app import ArrayRecord

    from incofl.deploy.wire.codec import packed_array

    raw = index if isinstance(index, bytes) else json.dumps(index, separators=(",", ":")).encode()
    return ArrayRecord({"index": packed_array(raw), "data": packed_array(data)})


STATE = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "n": torch.tensor(4)}
EXPECTED = {"w": ((2, 3), torch.float32), "n": ((), torch.int64)}
DATA = _raw(STATE["w"]) + _raw(STATE["n"])
W, N = ["w", "float32", [2, 3]], ["n", "int64", []]


def _malformed():
    """{case: (record, what the server's refusal says, what a node's says)}: packs a node could
    send, none EXPECTED's state; a node reading an instruction cannot know what the server
    expects (None: it takes it), so it checks the form only. An index longer than the expected
    entries' is refused by its length before it is parsed."""
    from flwr.app import Array, ArrayRecord

    from incofl.deploy.wire.codec import PACKED, to_arrays

    honest = to_arrays(STATE)
    longer = "an index of {} bytes, the expected entries' is 40"
    index = honest["index"].data
    return {
        "a name missing": (_pack([W], _raw(STATE["w"])), "entries other than expected: 'n'", None),
        "an extra name": (_pack([W, N, ["x", "int64", []]], DATA + bytes(8)), longer.format(57), None),
        "a renamed entry": (_pack([W, ["m", "int64", []]], DATA), "entries other than expected: 'm', 'n'", None),
        "a wrong dtype of the same size": (
            _pack([["w", "int32", [2, 3]], N], DATA),
            "w: int32 (2, 3), expected float32 (2, 3)",
            None,
        ),
        "float64 for float32": (
            _pack([["w", "float64", [2, 3]], N], _raw(STATE["w"].double()) + _raw(STATE["n"])),
            "w: float64 (2, 3), expected float32 (2, 3)",
            None,
        ),
        "a wrong shape of the same size": (
            _pack([["w", "float32", [3, 2]], N], DATA),
            "w: float32 (3, 2), expected float32 (2, 3)",
            None,
        ),
        "a shape of more dimensions": (
            _pack([["w", "float32", [6]], ["n", "int64", [1]]], DATA),
            "w: float32 (6,)",
            None,
        ),
        "a dtype no state holds": (
            _pack([["w", "complex", [2, 3]], N], DATA),
            "w: dtype 'complex', expected one of float32",
            "w: dtype 'complex', expected one of float32",
        ),
        "one byte short": (_pack([W, N], DATA[:-1]), "31 bytes of data, its index says 32", "31 bytes of data"),
        "one byte more": (_pack([W, N], DATA + b"\0"), "33 bytes of data, its index says 32", "33 bytes of data"),
        "no data": (_pack([W, N], b""), "0 bytes of data, its index says 32", "0 bytes of data"),
        "a name twice": (_pack([W, ["w", "int64", []]], DATA), "'w' twice in its index", "'w' twice in its index"),
        "a name twice, and the other": (_pack([W, N, W], DATA + DATA[:24]), longer.format(62), "'w' twice"),
        "an index not a list": (_pack({"w": 1}, DATA), "its index is a dict, expected a list", "is a dict"),
        "an entry of two": (
            _pack([W, ["n", "int64"]], DATA),
            "an index entry [str, str], expected [str, str, list]",
            "an index entry [str, str], expected",
        ),
        "an entry not a list": (_pack([W, "n"], DATA), "an index entry str, expected", "an index entry str"),
        "a name not a string": (_pack([W, [7, "int64", []]], DATA), "an index entry [int, str, list]", "[int, str"),
        "a shape not a list": (
            _pack([W, ["n", "int64", {}]], DATA),
            "an index entry [str, str, dict]",
            "[str, str, dict]",
        ),
        "a size not an int": (_pack([["w", "float32", [6.0]], N], DATA), "w: its shape is not a list", "w: its shape"),
        "a bool size": (_pack([["w", "float32", [True]], N], DATA), longer.format(41), "w: its shape is not a list"),
        "a negative size": (_pack([["w", "float32", [-6]], N], DATA), "w: its shape is not a list", "w: its shape"),
        "an index not JSON": (
            _pack(b'[["w","float32",[2,3]],', DATA),
            "its index is not JSON",
            "its index is not JSON",
        ),
        "an index not ASCII": (_pack('[["\u00e9","int64",[]]]'.encode(), DATA), "its index is not JSON", "not JSON"),
        "an index nested deep": (_pack(b"[" * 19 + b"]" * 19, DATA), "an index entry [list]", "an index entry [list]"),
        "an index nested past Python's limit": (_pack(b"[" * 100_000, DATA), longer.format(100_000), "not JSON"),
        "an index with spaces": (_pack(b" " * 39 + b"[]", DATA), longer.format(41), "its index says 0"),
        "no index": (ArrayRecord({"data": honest["data"]}), "arrays 'data', expected a packed state", "arrays 'data'"),
        "an array per tensor": (
            ArrayRecord({k: Array(t.numpy()) for k, t in STATE.items()}),
            "arrays 'n', 'w', expected a packed state (index, data)",
            "arrays 'n', 'w', expected a packed state",
        ),
        "a .npy array for the data": (
            ArrayRecord({"index": honest["index"], "data": Array(STATE["w"].numpy())}),
            "data: numpy.ndarray float32 (2, 3), expected incofl.packed uint8 of its length",
            "data: numpy.ndarray float32",
        ),
        "data of another stype": (
            ArrayRecord({"index": honest["index"], "data": Array("uint8", (32,), "numpy.ndarray", DATA)}),
            "data: numpy.ndarray uint8 (32,), expected",
            "data: numpy.ndarray uint8",
        ),
        "data whose shape is not its length": (
            ArrayRecord({"index": honest["index"], "data": Array("uint8", (33,), PACKED, DATA)}),
            "data: incofl.packed uint8 (33,), expected",
            "data: incofl.packed uint8 (33,)",
        ),
        "an index of another dtype": (
            ArrayRecord({"index": Array("int8", (len(index),), PACKED, index), "data": honest["data"]}),
            "index: incofl.packed int8",
            "index: incofl.packed int8",
        ),
    }


@pytest.mark.parametrize("case", list(_malformed()))
def test_a_malformed_pack_is_refused_before_any_tensor_is_decoded(monkeypatch, case):
    """Each way a node's packed state can differ from the expected one (its names, dtypes, shapes,
    length, its index's form and size, its arrays' metadata) is refused in one line, by the
    server and by a node reading it as an instruction, before a byte of its data is read."""
    from incofl.deploy.wire import codec

    record, server, node = _malformed()[case]

    def decoded(*args, **kwargs):
        raise AssertionError("decoded")

    monkeypatch.setattr(codec, "unpack", decoded)
    with pytest.raises(codec.CodecError, match="^delta.*" + re.escape(server)):
        codec.read_state(record, EXPECTED, "delta", "cpu")
    if node is None:
        with pytest.raises(AssertionError, match="decoded"):  # well-formed: the node decodes it
            codec.from_arrays(record, what="start")
    else:
        with pytest.raises(codec.CodecError, match="^start.*" + re.escape(node)):
            codec.from_arrays(record, what="start")


def test_a_bool_entry_holding_other_bytes_is_refused():
    from incofl.deploy.wire.codec import CodecError, from_arrays, read_state

    record = _pack([["mask", "bool", [2]]], bytes([1, 2]))
    with pytest.raises(CodecError, match="mask: bool values other than 0 and 1"):
        read_state(record, {"mask": ((2,), torch.bool)}, "classes", "cpu")
    with pytest.raises(CodecError, match="mask: bool values other than 0 and 1"):
        from_arrays(record)


def test_a_malformed_pack_in_an_instruction_is_refused_by_the_node():
    from flwr.app import ArrayRecord

    from incofl.deploy.wire.codec import CodecError, job_content, read_job
    from incofl.fl.engine.exchange import EvalJob, TrainJob

    plan = ClientPlan(0, 0, 0, 1, trainable=frozenset({"w"}))
    train = job_content(TrainJob(Round(1), plan, STATE, {}, ""))
    train["job.start"] = _pack([W, N], DATA[:-1])  # one byte short
    with pytest.raises(CodecError, match="malformed TrainJob message: .*state: 31 bytes of data, its index says 32"):
        read_job(TrainJob, train, "cpu")
    evaluate = job_content(EvalJob(Round(1), 0, 0, ("test",), STATE, ""))
    evaluate["job.start"] = ArrayRecord()
    with pytest.raises(CodecError, match="malformed EvalJob message: .*expected a packed state"):
        read_job(EvalJob, evaluate, "cpu")


def test_the_byte_budget_refuses_a_message_before_any_state_is_read():
    from flwr.app import RecordDict

    from incofl.deploy.wire.codec import CodecError, check_budget, index_bytes, to_arrays

    honest = RecordDict({"delta": to_arrays(STATE), "classes": to_arrays({"classes": torch.tensor([1, 4])})})
    states = [EXPECTED, {"classes": ((2,), torch.int64)}]
    check_budget(honest, states)  # exactly the budget: indexes and data
    assert sum(len(a.data) for r in honest.array_records.values() for a in r.values()) == sum(
        len(index_bytes(s)) + sum(math.prod(shape) * d.itemsize for shape, d in s.values()) for s in states
    )
    bigger = RecordDict({"delta": _pack([W, N], DATA + b"\0"), "classes": honest["classes"]})
    with pytest.raises(CodecError, match="bytes of arrays, the plan allows"):
        check_budget(bigger, states)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(EQUAL))
def test_flower_path_equals_the_simulator(tmp_path, case):
    """The same state_sha256 and metrics.csv (less its timing column) as `incofl train`."""
    simulated, through_flower, sim, fed = run_both(tmp_path, **EQUAL[case])
    assert through_flower["state_sha256"] == simulated["state_sha256"]
    assert metrics(fed).equals(metrics(sim))
    traffic = pd.read_csv(fed / "federation.csv")  # client models go to their nodes to be scored only where needed
    assert set(traffic["stage"]) == ({"train", "evaluate"} if "holdout" in EQUAL[case] else {"train"})


def test_static_bn_of_the_width_models_is_refused_by_name():
    from incofl.deploy.server.serverapp import check_federated

    with pytest.raises(ConfigError, match="method HeteroFL cannot run .*eval_bn: static gathers BN statistics"):
        check_federated(RunConfig(dataset="digits", method="HeteroFL", models=["preresnet18"]))
    for method in ("InCoAvg", "FedPer", "Local", "FedLAG"):  # no refusal
        check_federated(RunConfig(dataset="digits", method=method, holdout=0.2, bn_stats="local"))


@pytest.mark.slow
def test_a_node_without_the_test_split_its_model_is_scored_on_is_refused_before_the_first_round(tmp_path):
    """FedPer scores client 0's model (its personal layers are on its node) on the test split:
    a node whose file lacks it is refused by name before any round."""
    from federation_helpers import direct_grid

    from incofl.deploy.server.serverapp import AppSettings, serve
    from incofl.deploy.site.sitedata import export_client

    config = write_config(tmp_path, methods=["FedPer"], holdout=0.2)
    cfg = load_run_config(config)
    nodes = export_sites(cfg, tmp_path)
    data = dataset_for(cfg)
    export_client(cfg, data, partition_for(cfg, data), 0, nodes[0]["data-path"])  # without the test split
    settings = AppSettings(str(config), {}, tmp_path / "federation", join_timeout=5.0, server_key=_server(tmp_path))
    with pytest.raises(ConfigError, match=r"\(client 0\): its data file lacks the test split .* export it with --test"):
        serve(direct_grid(nodes), settings)
    assert not (tmp_path / "federation" / "metrics.csv").exists()


def test_without_node_keys_a_nodes_refusal_stops_the_run_in_its_own_words(tmp_path):
    """Without node-keys any node's refusal stops the run, in the node's one line: not Flower's
    `<class '...NodeError'>:<'...'>` of it (before: its reason as it came, a traceback in process)."""
    from federation_helpers import direct_grid

    from incofl.deploy.server.serverapp import AppSettings, serve

    config = write_config(tmp_path)
    nodes = export_sites(load_run_config(config), tmp_path)
    nodes[0]["data-path"] = str(tmp_path / "nowhere.npz")
    settings = AppSettings(str(config), {}, tmp_path / "federation", join_timeout=30.0, server_key=_server(tmp_path))
    with pytest.raises(ConfigError) as refused:
        serve(direct_grid(nodes), settings)
    assert str(refused.value) == "node 101 refused the run: node 101: data-path <data-path>: not a regular file"


def test_the_server_holds_the_facts_and_the_test_split_and_reads_no_data_set(tmp_path):
    """The facts file export writes is the simulator's facts (one rule), with the test split and no
    training image; with it, a server that may read no data set builds its side (run_both runs
    every equality test so); a run that partitions otherwise is refused naming the setting."""
    from incofl.data.shares import shares
    from incofl.deploy.server.serverdata import FACTS, load_facts
    from incofl.deploy.wire.signing import private_key
    from incofl.fl.engine.server import build_server
    from incofl.sides import ServerSettings

    cfg = load_run_config(write_config(tmp_path, methods=["FedPer"], holdout=0.2))
    public = private_key(server_facts(cfg, tmp_path)).public_key()
    data = dataset_for(cfg)
    with no_data_set():
        with pytest.raises(PermissionError, match="may not read a data set"):
            dataset_for(cfg)
        test, facts = load_facts(tmp_path / "keys" / FACTS, cfg, public)
        server = build_server(ServerSettings.of(cfg), facts, test, torch.device("cpu"))
    assert facts == shares(data, partition_for(cfg, data), cfg.holdout, cfg.partition_seed, cfg.normalize)[1]
    assert (test.x == data.x_test).all() and (test.y == data.y_test).all() and facts.classes == data.num_classes
    assert server.facts == facts and len(server.test) == len(data.y_test) and facts.held_out_clients()
    other = RunConfig(**{**cfg.model_dump(), "alpha": 0.1})
    with pytest.raises(ConfigError, match=r"^facts .*facts.npz: exported with alpha=0.5, the run has alpha=0.1$"):
        load_facts(tmp_path / "keys" / FACTS, other, public)


def test_the_facts_file_states_the_runs_reply_cap_which_up_makes_the_gates(tmp_path):
    """Export's facts file states the most one reply of the run may take: REPLY_STATES times the
    state of its largest model and REPLY_OVERHEAD (each of the run's models built here: the cap is
    the largest); `up` passes it to the SuperLink's gate in MiB, and 512 MiB where a file states none."""
    from incofl.deploy import REPLY_OVERHEAD
    from incofl.deploy.server.serverdata import FACTS, REPLY_STATES, stated_reply_cap
    from incofl.deploy.up import DEFAULT_REPLY_CAP, LocalFederation, reply_cap_mib
    from incofl.models.family import build_model

    cfg = load_run_config(write_config(tmp_path))
    server_facts(cfg, tmp_path)
    data = dataset_for(cfg)
    states = [
        sum(
            t.numel() * t.element_size()
            for t in build_model(
                name, data.num_classes, data.channels, stem=cfg.stem, image_size=data.image_size, scale=cfg.model_scale
            )
            .state_dict()
            .values()
        )
        for name in cfg.models
    ]
    cap = stated_reply_cap(tmp_path / "keys" / FACTS)
    assert cap == REPLY_STATES * max(states) + REPLY_OVERHEAD and max(states) > min(states)
    assert reply_cap_mib(LocalFederation(tmp_path)) == round(cap / (1 << 20), 3)
    (tmp_path / "keys" / FACTS).unlink()
    assert stated_reply_cap(tmp_path / "keys" / FACTS) is None
    assert reply_cap_mib(LocalFederation(tmp_path)) == DEFAULT_REPLY_CAP


def test_a_facts_file_not_signed_by_the_servers_key_or_changed_is_refused(tmp_path):
    """The ServerApp checks the facts file's signature with its own key before it reads a fact:
    a file signed with another key, or one fact changed after signing, is refused in one line."""
    from incofl.deploy.server.serverapp import AppSettings
    from incofl.deploy.server.serverdata import FACTS, load_facts
    from incofl.deploy.wire.credentials import node_key
    from incofl.deploy.wire.signing import private_key

    cfg = load_run_config(write_config(tmp_path))
    public = private_key(server_facts(cfg, tmp_path)).public_key()
    path = tmp_path / "keys" / FACTS
    with np.load(path) as f:
        saved = {k: f[k] for k in f.files}
    changed = str(saved["facts"]).replace('"clients": [[', '"clients": [[1', 1)  # client 0's samples, 1 before
    np.savez(path, **{**saved, "facts": np.str_(changed)})
    with pytest.raises(ConfigError, match=r"^facts .*: not the server's facts file \(its signature is not the server"):
        load_facts(path, cfg, public)
    other = tmp_path / "other"
    server_facts(cfg, other)
    with pytest.raises(ConfigError, match="its signature is not the server key's"):
        load_facts(other / "keys" / FACTS, cfg, private_key(node_key(tmp_path / "keys", 0)[0]).public_key())
    with pytest.raises(ConfigError, match="^run config: server-key: set the server's private key"):
        AppSettings.of({"out": "run", "insecure": True}).facts_path()
    assert AppSettings.of({"out": "run", "node-keys": "keys"}).facts_path() == Path("keys") / FACTS


def test_a_facts_file_whose_signature_ends_in_a_nul_byte_is_read(tmp_path, monkeypatch):
    """One DER signature in 256 ends in 0x00, which numpy's fixed-width bytes drop: the file
    stored its signature so once, and one equality run in a few hundred failed on it."""
    from incofl.deploy.server import serverdata
    from incofl.deploy.wire.signing import private_key

    def ending_in_nul(key, statement: bytes) -> bytes:
        return next(s for s in iter(lambda: sign(key, statement), None) if s.endswith(b"\0"))

    sign = serverdata.sign
    monkeypatch.setattr(serverdata, "sign", ending_in_nul)
    cfg = load_run_config(write_config(tmp_path))
    public = private_key(server_facts(cfg, tmp_path)).public_key()
    serverdata.load_facts(tmp_path / "keys" / serverdata.FACTS, cfg, public)


def test_a_node_is_told_its_schedule_and_no_path_or_server_only_setting(tmp_path):
    """Every message a node receives in a run holds no path of the server's (its config's data,
    cache and key folders) and, of the run's settings, only the client side's (config.py's
    Role.CLIENT tags): no server-only setting (the sampling ratio, the evaluation's cadence, ...)."""
    from federation_helpers import direct_grid

    from incofl.config import Affects, Role, run_settings
    from incofl.deploy.flower.directgrid import FIRST_NODE
    from incofl.deploy.server.serverapp import AppSettings, serve
    from incofl.deploy.site.clientapp import app

    config = write_config(tmp_path, rounds=1, data_dir=str(tmp_path / "data"), label="told", eval_every=2)
    cfg = load_run_config(config)
    received: list[str] = []

    def node(message, context):
        content = message.content
        records = [*content.config_records.values(), *content.metric_records.values()]
        received.extend(f"{key}={value}" for record in records for key, value in record.items())
        return app(message, context)

    nodes = export_sites(cfg, tmp_path)
    grid = direct_grid(nodes, apps={FIRST_NODE + c: node for c in range(cfg.clients)})
    serve(grid, AppSettings(str(config), {}, tmp_path / "federation", join_timeout=5.0, server_key=_server(tmp_path)))
    assert received and not [entry for entry in received if str(tmp_path) in entry]
    [schedule] = {entry[len("schedule=") :] for entry in received if entry.startswith("schedule=")}
    told = set(json.loads(schedule)["config"])
    paths, every = run_settings(Role.PATH), set(RunConfig.model_fields)
    server_only = every - run_settings(Role.CLIENT)
    assert told == every - server_only and not told & paths and not run_settings(Role.CLIENT) & paths
    assert {"ratio", "eval_every", "label", "analyses", "update_noise"} <= server_only
    assert run_settings(Affects.NOTHING) & server_only  # the server's budgets and cadence stay there


def test_a_schedule_without_a_setting_the_client_side_computes_with_is_refused(tmp_path):
    """A node computes with the server's value of every client setting or refuses the run: one left
    out of its schedule is named, not silently taken at its default on the node."""
    from incofl.deploy.wire.schedule import Schedule, schedule_of

    cfg = load_run_config(write_config(tmp_path, lr=0.5))
    told = json.loads(schedule_of(cfg))
    assert Schedule.read(json.dumps(told)).settings.lr == 0.5
    del told["config"]["lr"]
    with pytest.raises(ValueError, match="^schedule: config: lr: Field required$"):
        Schedule.read(json.dumps(told))
    told["config"] |= {"lr": 0.5, "ratio": 0.5}  # a server-only setting: not the client's to be told
    with pytest.raises(ValueError, match="^schedule: config: ratio: unknown key$"):
        Schedule.read(json.dumps(told))


def test_a_site_file_of_another_client_or_partition_is_refused(tmp_path):
    cfg = load_run_config(write_config(tmp_path))
    nodes = export_sites(cfg, tmp_path)
    with pytest.raises(ConfigError, match="holds client 1's data, this node is client 0"):
        read_site(nodes[1]["data-path"], cfg, 0)
    other = RunConfig(**{**cfg.model_dump(), "alpha": 0.1})
    with pytest.raises(ConfigError, match=r"exported with other partition settings than the run's \(alpha=0.5, "):
        read_site(nodes[0]["data-path"], other, 0)
    assert TINY["clients"] == len(nodes)


@pytest.mark.parametrize(("key", "value"), [("min_size", 3), ("max_retries", 7)])
def test_a_site_file_drawn_with_another_partition_setting_is_refused(tmp_path, key, value):
    """A node checks every setting the partition is drawn with (config.Affects.PARTITION), not a list of its
    own: its file's against the digest it is told (sides.partition_digest), naming what the file holds."""
    cfg = load_run_config(write_config(tmp_path))
    nodes = export_sites(cfg, tmp_path)
    other = RunConfig(**{**cfg.model_dump(), key: value})
    with pytest.raises(
        ConfigError, match=f"exported with other partition settings than the run's .*{key}={getattr(cfg, key)}"
    ):
        read_site(nodes[0]["data-path"], other, 0)
    read_site(nodes[0]["data-path"], cfg, 0)  # the run's own: taken


def _server(folder: Path) -> Path:
    """The server's key export_sites made in `folder` (the facts file beside it)."""
    return folder / "keys" / "server"


def _node_of(client: int) -> int:
    from incofl.deploy.flower.directgrid import FIRST_NODE

    return FIRST_NODE + client  # export_sites lists the clients in order


def _corrupting(change):
    """A node whose training replies are changed by `change(content)` after honest training (its
    states unbundled for the change, bundled again as they travel)."""
    from incofl.deploy.site.clientapp import app
    from incofl.deploy.wire.codec import bundled, unbundled

    def node(message, context):
        reply = app(message, context)
        if message.metadata.message_type == "train":
            content = unbundled(reply.content)
            change(content)
            reply.content = bundled(content)
        return reply

    return node


def _first_delta(content, change):
    from incofl.deploy.wire.codec import from_arrays, to_arrays

    delta = from_arrays(content.array_records["delta"])
    name = next(iter(delta))
    delta[name] = torch.from_numpy(change(delta[name].numpy().copy()))
    content["delta"] = to_arrays(delta)  # packed again: a well-formed reply with the changed entry


def _nan(content):
    _first_delta(content, lambda a: a * float("nan"))


def _reshaped(content):
    _first_delta(content, lambda a: a[:1])


def _impostor(content):
    metrics = content.metric_records["metrics"]
    metrics["client"] = (metrics["client"] + 1) % TINY["clients"]


def _inf_samples(content):  # crashed the server (OverflowError) before
    content.metric_records["metrics"]["num_samples"] = float("inf")


@pytest.mark.slow
@pytest.mark.parametrize("method,settings", [("SCAFFOLD", {}), ("FedPer", {"holdout": 0.2})])
def test_a_lost_node_stops_the_run_by_name_and_a_restart_resumes(tmp_path, method, settings):
    """Round 2's first client never answers: the run stops naming it, after round 1's checkpoint;
    with its node back, the same command resumes and ends with the simulator's weights, though
    the other nodes' clients (SCAFFOLD's c_i, FedPer's personal layers) had trained round 2 already."""
    from federation_helpers import direct_grid

    from incofl.deploy.server.serverapp import AppSettings, serve
    from incofl.fl.engine.exchange import MissingClients

    lost = scheduled(1)[0]
    config = write_config(tmp_path, methods=[method], **settings)
    cfg = load_run_config(config)
    nodes = export_sites(cfg, tmp_path)
    settings = AppSettings(
        str(config), {}, tmp_path / "federation", join_timeout=5.0, round_timeout=1.0, server_key=_server(tmp_path)
    )  # the lost node: missing after 1 s
    with pytest.raises(MissingClients, match=f"round 2: no accepted reply from client\\(s\\) {lost} "):
        serve(direct_grid(nodes, apps={_node_of(lost): silent_from(2)}), settings)
    assert (tmp_path / "federation" / "ckpt.pt").exists() and not (tmp_path / "federation" / "summary.json").exists()
    ahead = [c for c in scheduled(1) if c != lost]  # trained round 2 before the stop
    assert all(list((tmp_path / f"site{c}.state").rglob("after-round-2.pt")) for c in ahead)
    resumed = serve(direct_grid(nodes, run_id=2), settings)
    from incofl.fl.engine.simulator import train

    assert resumed["state_sha256"] == train(cfg, tmp_path / "simulator")["state_sha256"]
    assert metrics(tmp_path / "federation").equals(metrics(tmp_path / "simulator"))


@pytest.mark.slow
def test_a_node_whose_saved_state_is_gone_stops_the_run_instead_of_training_from_scratch(tmp_path, caplog):
    """SCAFFOLD: after round 1, one trained client's node loses its state files (its c_i); in the
    round it trains next, its node refuses to start from a fresh state, and the run stops naming it."""
    import shutil

    from federation_helpers import direct_grid

    from incofl.deploy.server.serverapp import AppSettings, serve
    from incofl.fl.engine.exchange import MissingClients

    config = write_config(tmp_path, methods=["SCAFFOLD"], rounds=4)
    cfg = load_run_config(config)
    nodes = export_sites(cfg, tmp_path)
    first = set(scheduled(0))
    wiped = next(c for r in range(1, 4) for c in scheduled(r) if c in first)  # trains in round 1 and again
    from incofl.deploy.site.clientapp import app

    def forgetful(message, context):  # the node's state folder deleted after its first round
        reply = app(message, context)
        if message.metadata.message_type == "train" and message.metadata.group_id == "1":
            shutil.rmtree(tmp_path / f"site{wiped}.state")
        return reply

    settings = AppSettings(str(config), {}, tmp_path / "federation", join_timeout=5.0, server_key=_server(tmp_path))
    with pytest.raises(MissingClients, match=f"client\\(s\\) {wiped} .*is not the one it reported"):
        serve(direct_grid(nodes, apps={_node_of(wiped): forgetful}), settings)


def test_a_run_and_its_nodes_share_one_rule_of_the_checkpointed_rounds():
    """A stopped run resumes from the last round `checkpointed` (the server's Run writes them) before
    the round it stopped in: `last_checkpoint`, which a node reads to keep what it may be asked for."""
    from incofl.fl.engine.checkpoint import checkpointed, last_checkpoint

    for every, rounds in ((1, 5), (2, 7), (3, 9), (5, 5)):
        cfg = RunConfig(checkpoint_every=every, rounds=rounds)
        for round_ in range(1, rounds + 1):
            written = [r for r in range(1, round_) if checkpointed(r, cfg.checkpoint_every, cfg.rounds)]
            assert last_checkpoint(round_, cfg.checkpoint_every) == max(written, default=0)
        assert not checkpointed(rounds, cfg.checkpoint_every, cfg.rounds)  # a finished run is marked by summary.json


def test_the_apps_run_config_defaults_are_its_settings():
    """flower-app/pyproject.toml repeats AppSettings' defaults for `flwr run`: one set of numbers."""
    import tomllib

    from incofl.deploy.server.serverapp import AppSettings

    app = tomllib.loads((Path(__file__).resolve().parents[1] / "flower-app" / "pyproject.toml").read_text())["tool"][
        "flwr"
    ]["app"]["config"]
    settings = AppSettings.of({**app, "out": "x", "insecure": True})
    assert (settings.round_timeout, settings.join_timeout, settings.allow_missing) == (
        AppSettings.round_timeout,
        AppSettings.join_timeout,
        AppSettings.allow_missing,
    )
    assert (app["round-timeout"], app["join-timeout"], app["allow-missing"]) == (
        AppSettings.round_timeout,
        AppSettings.join_timeout,
        AppSettings.allow_missing,
    )


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"bn_stats": "local"},
        {"method": "FedPer", "holdout": 0.2},
        {"method": "FedPer", "holdout": 0.2, "pool_test": True},
    ],
)
def test_the_clients_whose_sites_need_the_test_split_are_the_layouts(settings, tmp_path):
    """`incofl federation export --test` asks it of the clients whose models the layout scores on
    the test split where the client is (Layout.on_client): one rule, read two ways."""
    from incofl.fl.engine.simulator import simulator
    from incofl.fl.stages.layout import TEST, tested_on_clients

    cfg = RunConfig(
        **{"dataset": "digits", "progress": False, "clients": 4, "models": ["resnet10", "resnet14"], **settings},
        cache_dir=str(tmp_path),
    )
    data = dataset_for(cfg)
    layout = simulator(cfg, data, partition_for(cfg, data), torch.device("cpu")).server.layout
    there = [job.client for job in layout.client_evals() if job.split == TEST and layout.on_client(job)]
    assert tested_on_clients(cfg, cfg.pool_test) == there


def test_a_node_keeps_the_states_a_checkpoint_of_the_server_can_resume_from(tmp_path):
    """Saved after rounds 1, 2, 4, 5 with checkpoints every 2 rounds: the state after round 2
    (the checkpoint at 4 resumes from it for a client that did not train in 3 or 4) is kept
    until one at or before a later checkpoint replaces it; a resumed round reads the last state before it."""
    from incofl.deploy.site.client import SavedStores

    states = SavedStores(tmp_path / "client0", every=2)
    for round_ in (1, 2, 4, 5):
        states.save(round_, {"round": torch.tensor(round_)})
    assert states.rounds() == [4, 5]  # the checkpoint before round 5 is round 4's
    states = SavedStores(tmp_path / "client1", every=2)
    for round_ in (1, 2, 3):
        states.save(round_, {"round": torch.tensor(round_)})
    assert states.rounds() == [2, 3]  # round 3's checkpoint to resume from is round 2's
    assert int(states.at(2)["round"]) == 2 and int(states.at(7)["round"]) == 3 and states.at(1) is None


def test_a_nodes_disk_holds_what_a_resume_needs_and_no_more(tmp_path):
    """Of a client's stores, only the last one and the one the server's last checkpoint resumes
    from are kept (before: every round's since that checkpoint, every round's of a run that never
    checkpoints); a resumed run drops the stores its stop left after the round it trains again.
    Of the run folders in a node's state-dir, only the current run's and the one used before it
    (which may still resume) are kept; what is not a run's folder is left alone."""
    import os

    from incofl.deploy.site.client import SavedStores, SiteClient
    from incofl.deploy.wire.schedule import Schedule, run_key, schedule_of

    every5 = SavedStores(tmp_path / "client0", every=5)
    for round_ in range(1, 10):
        every5.save(round_, {"round": torch.tensor(round_)})
    assert every5.rounds() == [5, 9]  # a stop in round 10 resumes from round 5's checkpoint
    every5.save(7, {"round": torch.tensor(7)})  # resumed from 5: round 9's store is a stopped run's
    assert every5.rounds() == [5, 7] and int(every5.at(8)["round"]) == 7
    never = SavedStores(tmp_path / "client1", every=100)
    for round_ in range(1, 7):
        never.save(round_, {"round": torch.tensor(round_)})
    assert never.rounds() == [6]

    cfg = load_run_config(write_config(tmp_path))
    nodes = export_sites(cfg, tmp_path)
    state_dir = tmp_path / "state"
    (state_dir / "notes").mkdir(parents=True)
    (state_dir / ("0" * 16)).write_text("a file of the site's, named like a run's folder")
    runs = [cfg.model_copy(update={"lr": lr}) for lr in (0.1, 0.2, 0.3)]
    for age, run in enumerate(runs):
        SiteClient(Schedule.read(schedule_of(run)), 0, nodes[0]["data-path"], state_dir)
        os.utime(state_dir / run_key(run), (age, age))  # used in this order, whatever the clock's resolution
    kept = {"notes", "0" * 16, run_key(runs[1]), run_key(runs[2])}
    assert {p.name for p in state_dir.iterdir()} == kept
    SiteClient(Schedule.read(schedule_of(runs[1])), 0, nodes[0]["data-path"], state_dir)  # resumed: nothing goes
    assert {p.name for p in state_dir.iterdir()} == kept


@pytest.mark.slow
@pytest.mark.parametrize(
    "change,why",
    [
        (_nan, "holds NaN or Inf"),
        (_reshaped, "expected float32"),
        (_impostor, "reply for client"),
        (_inf_samples, "num_samples: of type float"),
    ],
)
def test_a_malformed_reply_is_refused_and_logged_by_node(tmp_path, caplog, change, why):
    """A reply with a NaN, a wrong shape or another client's id is never averaged in: logged by
    node and client; with allow-missing the run goes on without it and rounds.csv names it."""

    from federation_helpers import direct_grid

    from incofl.deploy.server.serverapp import AppSettings, serve

    bad = scheduled(0)[0]
    config = write_config(tmp_path, rounds=1)
    nodes = export_sites(load_run_config(config), tmp_path)
    settings = AppSettings(
        str(config), {}, tmp_path / "federation", join_timeout=5.0, allow_missing=True, server_key=_server(tmp_path)
    )
    serve(direct_grid(nodes, apps={_node_of(bad): _corrupting(change)}), settings)
    assert f"node {_node_of(bad)}, client {bad}: refused: " in caplog.text and why in caplog.text
    rounds = pd.read_csv(tmp_path / "federation" / "rounds.csv", dtype={"missing": str})
    assert rounds["missing"].tolist() == [str(bad)]
    assert rounds["samples"].iloc[0] > 0  # the other client's update was averaged


def test_export_writes_one_clients_samples_and_refuses_a_client_out_of_range(tmp_path, capsys):
    from incofl.cli import run

    config = write_config(tmp_path)
    out = tmp_path / "site1.npz"
    assert run(["federation", "export", "--config", str(config), "--client", "1", "--out", str(out)]) == 0
    data, part = read_site(out, load_run_config(config), 1)  # client 1's samples only: none of another's
    assert len(part) == len(data.y_train) == len(set(part.tolist())) and data.num_classes == 10
    argv = ["federation", "export", "--config", str(config), "--client", "4", "--out", str(tmp_path / "x.npz")]
    assert run(argv) == 2 and "--client 4: the config has clients 0..3" in capsys.readouterr().err


def test_export_without_client_writes_every_clients_file_with_the_test_split_where_the_run_needs_it(tmp_path):
    from incofl.cli import run
    from incofl.fl.stages.layout import tested_on_clients as tested_on_nodes

    config = write_config(tmp_path, methods=["FedPer"], holdout=0.2)
    assert run(["federation", "export", "--config", str(config), "--out", str(tmp_path / "sites")]) == 0
    cfg = load_run_config(config)
    tests = [len(read_site(tmp_path / "sites" / f"site{c}.npz", cfg, c)[0].y_test) for c in range(cfg.clients)]
    first = tested_on_nodes(cfg, cfg.pool_test)  # each model group's first client's model: scored on the test split
    assert len(first) == len(cfg.models) == 2
    assert tests == [len(dataset_for(cfg).y_test) if c in first else 0 for c in range(cfg.clients)]


def test_ups_superlink_keeps_its_state_in_memory_or_on_disk_in_a_fresh_private_database(tmp_path):
    """`up`'s SuperLink: Flower's in-memory state by default (no --database); `--link-state disk`:
    SQLite in SITES/superlink/state.db, in a folder of its owner's only, what an earlier up left there
    removed (the end-to-end deployment, test_federation_deploy.py, runs up's default)."""
    from incofl.deploy.up import LocalFederation, link_args

    sites = tmp_path / "sites"
    (sites / "superlink").mkdir(parents=True, mode=0o700)
    for old in ("state.db", "state.db-wal"):
        (sites / "superlink" / old).write_text("an earlier up's")
    assert link_args(LocalFederation(sites)) == []
    assert len(list((sites / "superlink").iterdir())) == 2  # memory: nothing on disk touched
    assert link_args(LocalFederation(sites, link_state="disk")) == [
        "--database",
        str(sites.resolve() / "superlink" / "state.db"),
    ]
    assert not list((sites / "superlink").iterdir()) and (sites / "superlink").stat().st_mode & 0o077 == 0


def test_federation_up_refuses_bad_input_in_one_line_before_starting_anything(tmp_path, monkeypatch, capsys):
    from incofl.cli import run
    from incofl.deploy.up import add_connection

    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    (tmp_path / "empty").mkdir()
    assert run(["federation", "up", "--sites", str(tmp_path / "empty")]) == 2
    assert "no site data files (*.npz)" in capsys.readouterr().err
    nodes = export_sites(load_run_config(write_config(tmp_path)), tmp_path)
    (tmp_path / "copy.npz").write_bytes(Path(nodes[0]["data-path"]).read_bytes())
    (tmp_path / "copy.npz").chmod(0o600)  # a site file others may read is refused before anything else
    assert run(["federation", "up", "--sites", str(tmp_path)]) == 2
    assert "both hold client 0's data" in capsys.readouterr().err
    argv = ["federation", "up", "--sites", str(tmp_path / "sites"), "--certificates", str(tmp_path)]
    (tmp_path / "sites").mkdir()
    (tmp_path / "sites" / "site1.npz").write_bytes(Path(nodes[1]["data-path"]).read_bytes())
    (tmp_path / "sites" / "site1.npz").chmod(0o600)
    assert run(argv) == 2 and "no ca.pem, server.pem, server.key" in capsys.readouterr().err
    import socket

    with socket.socket() as held:  # a port of the federation's taken
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert run(["federation", "up", "--sites", str(tmp_path / "sites"), "--port", str(port)]) == 2
    assert f"127.0.0.1:{port} is in use" in capsys.readouterr().err
    # the connection: appended once, kept as written, another entry of that name never overwritten
    config = add_connection("mine", "127.0.0.1:9092", None)
    assert add_connection("mine", "127.0.0.1:9092", None) == config
    assert config.read_text().count("[superlink.mine]") == 1
    assert "[superlink.local]" in config.read_text()  # Flower's own defaults kept (the file was new)
    with pytest.raises(ConfigError, match="connection mine exists with other settings"):
        add_connection("mine", "127.0.0.1:9999", None)


def _site_keys(count: int):
    """`count` P-384 key pairs as a site makes them: (OpenSSH public key, PEM public key as a SuperLink holds it)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    keys = [ec.generate_private_key(ec.SECP384R1()).public_key() for _ in range(count)]
    ssh = serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    pem = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    return [(k.public_bytes(*ssh), k.public_bytes(*pem)) for k in keys]


def test_a_node_claiming_another_sites_client_is_refused_and_the_run_goes_on(tmp_path, caplog):
    """With node-keys, a node whose key is not client 0's site's claims client 0 before the
    rightful node, and a node with no site's key fails at identify: both are refused and logged,
    and client 0 trains on its own site's node; without node-keys the start-up line says any
    node may claim any client."""
    import json

    from federation_helpers import direct_grid

    from incofl.deploy.flower.directgrid import FIRST_NODE
    from incofl.deploy.server.serverapp import AppSettings, serve
    from incofl.deploy.server.transport import Identity
    from incofl.deploy.wire.credentials import node_key

    config = write_config(tmp_path, rounds=1)
    sites, pems = signed_sites(load_run_config(config), tmp_path)
    own = node_key(tmp_path / "impostor", 0)[0]  # a key pair of its own, signing as client 0
    nodes = [{**sites[0], "node-key": str(own)}, *sites, sites[1]]  # first: the impostor; last: the stranger
    impostor, stranger = FIRST_NODE, FIRST_NODE + len(sites) + 1
    pem = _site_keys(2)
    keys = {impostor: pem[0][1], stranger: pem[1][1]} | {node + 1: key for node, key in pems.items()}

    def failing(message, context):
        raise RuntimeError("no data here")

    grid = direct_grid(nodes, apps={stranger: failing}, keys=keys)
    settings = AppSettings(str(config), {}, tmp_path / "federation", join_timeout=5.0, node_keys=tmp_path / "keys")
    serve(grid, settings)
    assert f"identify: node {impostor}: refused: node {impostor}'s key is no site's" in caplog.text
    assert f"identify: node {stranger}: the node's ClientApp failed: RuntimeError: no data here" in caplog.text
    assert json.loads((tmp_path / "federation" / "federation.json").read_text())["nodes"]["0"] == impostor + 1
    Identity.load(grid, None, tmp_path / "keys" / "server", len(sites), 1)
    assert "no node-keys: any node may claim any client" in caplog.text


def test_the_codec_maps_every_field_of_the_plan_and_the_update_by_its_type():
    """A new field of a type the codec knows travels without a change to it; one of another type
    fails loudly at its first message (never silently left behind)."""
    from dataclasses import dataclass, fields

    from flwr.app import RecordDict

    from incofl.deploy.wire.codec import CodecError, decode_fields, encode_fields, update_metrics

    @dataclass(frozen=True)
    class Planned(ClientPlan):
        epochs: int = 0

    @dataclass(frozen=True)
    class Odd(ClientPlan):
        rate: complex = 0j

    plan = Planned(3, 1, 0, 4, trainable=frozenset({"w"}), keep=frozenset({"n"}), last_grad=True, epochs=7)
    assert decode_fields(Planned, RecordDict(encode_fields(plan, "plan")), "plan", "cpu") == plan
    with pytest.raises(CodecError, match="Odd.rate: no encoding for its type complex"):
        encode_fields(Odd(3, 1, 0, 4), "plan")

    @dataclass
    class Counted(ClientUpdate):
        batches: int = 0

    @dataclass
    class Weighted(ClientUpdate):
        weights: dict[str, float] = None

    sent = set(update_metrics(Counted))
    assert "batches" in sent and sent | {"delta", "extra", "classes", "kept", "view"} == {
        f.name for f in fields(Counted)
    }
    with pytest.raises(CodecError, match="Weighted.weights: no encoding"):
        update_metrics(Weighted)


def test_the_server_runs_its_rounds_with_its_heap_frozen_and_hands_it_back():
    """A full collection walks none of what the ServerApp holds when its rounds start (about 0.25 s a
    collection, inside a round: docs/performance.md); a process that serves in-process runs gets it back."""
    import gc

    from incofl.deploy.server.serverapp import frozen_heap

    before = gc.get_freeze_count()
    with frozen_heap():
        assert gc.get_freeze_count() > before
    assert gc.get_freeze_count() == 0
