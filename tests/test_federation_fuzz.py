"""The federation server's checks of every reply (docs/federation.md): honest replies of tiny
in-process runs (SCAFFOLD's increments, sent after a local step, FedLAG's last gradients and held-out scores,
FedNova's steps, HeteroFL's width views), captured once, are accepted; each named lie, and
random changes of any part a server can know (every metric, record, packed state's entries,
index and arrays, dtype, hash and score), are refused without an exception escaping."""

from __future__ import annotations

import copy
import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

if not os.environ.get("CI"):  # CI installs the extra: there a missing flwr fails
    pytest.importorskip("flwr", reason="the flower extra is not installed (pip install -e '.[flower]')")

from federation_helpers import WIDTH, export_sites, write_config  # noqa: E402
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict  # noqa: E402
from hypothesis.configuration import set_hypothesis_home_dir  # noqa: E402

# hypothesis's files (a cache of the constants it finds in the code, read at collection) outside the repository
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "incofl-hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from incofl.config import load_run_config  # noqa: E402

RUNS = {"SCAFFOLD": {}, "FedLAG": {"holdout": 0.2}, "FedNova": {"rounds": 1}, "HeteroFL": {**WIDTH, "rounds": 1}}
# every test reads `honest` (four runs, 11 s on CI): on one worker, one after another, it is made
# once (as single tests, xdist spread them over both workers, and each made it)
pytestmark = pytest.mark.xdist_group("fuzz")


@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    """Every training and evaluation reply of a 2-round in-process run of each of RUNS, with what
    the server expected of it: (method, reply, expected) and (method, reply, job, expected)."""
    from federation_helpers import direct_grid

    from incofl.deploy.server import serverapp, transport

    train, scores = [], []
    accept_update, accept_scores = transport.accept_update, transport.accept_scores
    for method, extra in RUNS.items():
        tmp = tmp_path_factory.mktemp(method)
        config = write_config(tmp, methods=[method], **extra)
        grid = direct_grid(export_sites(load_run_config(config), tmp))

        def record_update(reply, expected, content=None, method=method):  # the reply as opened: unbundled
            train.append((method, reply_with(reply, content), expected))
            return accept_update(reply, expected, content)

        def record_scores(reply, job, expected, content=None, method=method):
            scores.append((method, reply_with(reply, content), job, expected))
            return accept_scores(reply, job, expected, content)

        transport.accept_update, transport.accept_scores = record_update, record_scores
        try:
            key = tmp / "keys" / "server"
            serverapp.serve(grid, serverapp.AppSettings(str(config), {}, tmp / "federation", 600, 5.0, server_key=key))
        finally:
            transport.accept_update, transport.accept_scores = accept_update, accept_scores
    return Captured(train, scores)


class Captured(tuple):
    """(training replies, evaluation replies), with a short repr (hypothesis prints its arguments)."""

    def __new__(cls, train: list, scores: list):
        return super().__new__(cls, (train, scores))

    def __repr__(self) -> str:
        return f"<{len(self[0])} training and {len(self[1])} evaluation replies>"


def clone(content: RecordDict) -> RecordDict:
    """A copy of a message's content whose records can be changed without touching the original."""
    records = {}
    for name, record in content.items():
        if isinstance(record, ArrayRecord):
            records[name] = ArrayRecord({k: Array(a.dtype, a.shape, a.stype, a.data) for k, a in record.items()})
        else:
            records[name] = type(record)(copy.deepcopy(dict(record)))
    return RecordDict(records)


def reply_with(original: Message, content: RecordDict) -> Message:
    """A reply from the same node to the same message, with `content`."""
    return Message(content, reply_to=Message(RecordDict(), original.metadata.src_node_id, "train"))


def test_every_honest_reply_is_accepted(honest):
    from incofl.deploy.server.transport import accept_scores, accept_update

    train, scores = honest
    assert {m for m, *_ in train} == set(RUNS) and {m for m, *_ in scores} == {"FedLAG"}
    assert all(set(e.extra) == {"scaffold_increment"} for m, _, e in train if m == "SCAFFOLD")
    assert all(set(e.extra) == {"last_grad"} for m, _, e in train if m == "FedLAG")
    assert all(not accept_update(reply, expected).error for _, reply, expected in train)
    assert all(not accept_scores(reply, job, expected).error for _, reply, job, expected in scores)


# ---- each lie of the issue, on an honest reply; each was accepted or crashed the server before


def _metric(content: RecordDict, key: str, value) -> RecordDict:
    changed = clone(content)
    changed.metric_records["metrics"][key] = value
    return changed


def _first(train, method):
    return next((reply, expected) for m, reply, expected in train if m == method and expected.steps)


@pytest.mark.parametrize(
    "method,lie,why",
    [
        ("SCAFFOLD", lambda c: _metric(c, "num_samples", math.inf), "num_samples: of type float, expected int"),
        (
            "SCAFFOLD",
            lambda c: _metric(c, "num_samples", c.metric_records["metrics"]["num_samples"] * 1000),
            "samples, steps, uploaded parameters",
        ),
        ("FedNova", lambda c: _metric(c, "steps", c.metric_records["metrics"]["steps"] * 1000), "the client's share"),
    ],
)
def test_a_lie_about_the_counts_is_refused(honest, method, lie, why):
    from incofl.deploy.server.transport import accept_update

    reply, expected = _first(honest[0], method)
    refused = accept_update(reply_with(reply, lie(reply.content)), expected)
    assert refused.update is None and why in refused.error


def test_an_unasked_extra_array_is_refused_before_it_is_decoded(honest):
    from incofl.deploy.server.transport import accept_update
    from incofl.deploy.wire.codec import to_arrays

    reply, expected = _first(honest[0], "SCAFFOLD")
    changed = clone(reply.content)
    changed["extra.junk"] = to_arrays({"x": torch.zeros(16 * 2**20)})  # 64 MB
    refused = accept_update(reply_with(reply, changed), expected)
    assert "array records other than expected: 'extra.junk'" in refused.error


def test_a_float64_delta_where_the_plan_holds_float32_is_refused(honest):
    """Refused by the message's byte budget before any index is read (the budget is exact: the
    expected states' bytes and indexes); an index that reads an entry's float32 bytes as half as
    many float64 values (the data as long as expected): by that entry's dtype and shape."""
    from incofl.deploy.server.transport import accept_update
    from incofl.deploy.wire.codec import from_arrays, index_bytes, packed_array, to_arrays

    reply, expected = _first(honest[0], "SCAFFOLD")
    delta = from_arrays(reply.content.array_records["delta"])
    name = next(iter(delta))
    changed = clone(reply.content)
    changed["delta"] = to_arrays({**delta, name: delta[name].double()})
    refused = accept_update(reply_with(reply, changed), expected)
    assert refused.update is None and "bytes of arrays, the plan allows" in refused.error

    name = next(k for k, t in delta.items() if t.numel() % 2 == 0)
    entries = {k: (tuple(t.shape), t.dtype) for k, t in delta.items()}
    entries[name] = (half := (delta[name].numel() // 2,), torch.float64)
    changed = clone(reply.content)
    changed["delta"]["index"] = packed_array(index_bytes(entries))
    refused = accept_update(reply_with(reply, changed), expected)
    assert refused.update is None and f"delta {name}: float64 {half}" in refused.error
    assert f"expected float32 {tuple(delta[name].shape)}" in refused.error


def test_scores_without_counts_and_a_negative_sample_count_are_refused(honest):
    from incofl.deploy.server.transport import accept_scores

    _, reply, job, expected = honest[1][0]
    changed = clone(reply.content)
    split = job.splits[0]
    for part, value in (("n", -1), ("correct", []), ("loss", [])):
        changed.metric_records["scores"][f"{split}.{part}"] = value
    refused = accept_scores(reply_with(reply, changed), job, expected)
    assert (
        refused.error and f"scores {split}.correct: 0 entries, the model has {expected.exits} exit(s)" in refused.error
    )


# ---- random changes


def _same(a, b) -> bool:
    """Equal values of the same type (NaN equals NaN): a change to it is none."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


NUMBERS = st.one_of(
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.lists(st.integers(-5, 5), max_size=3),
    st.lists(st.floats(allow_nan=True), max_size=3),
)
NAMES = st.text("abcdefghijklmnopqrstuvwxyz._#0123456789", min_size=1, max_size=12)


def _change_metric(content: RecordDict, data) -> bool:
    """A metric (or score) changed to another value or type, removed, or one added."""
    if not content.metric_records:
        return False
    name = data.draw(st.sampled_from(sorted(content.metric_records)))
    metrics = content.metric_records[name]
    how = data.draw(st.sampled_from(["value", "remove", "add"]))
    if how == "add":
        metrics[data.draw(NAMES.filter(lambda k: k not in metrics))] = data.draw(NUMBERS)
        return True
    if not metrics:
        return False
    key = data.draw(st.sampled_from(sorted(metrics)))
    if how == "remove":
        del metrics[key]
        return True
    value = data.draw(NUMBERS)
    if _same(value, metrics[key]) or _a_value_lie(metrics, key, value):
        return False
    metrics[key] = value
    return True


def _a_value_lie(metrics: MetricRecord, key: str, value) -> bool:
    """A change no server can tell from the truth (a node's word on how well it did, out of scope):
    the mean training loss to another finite number, scores to other counts in range and other
    finite non-negative losses, one per exit."""
    old = metrics[key]
    if key == "loss":
        return type(value) is float and math.isfinite(value) and math.isfinite(old)
    if key.endswith(".correct"):
        n = metrics.get(key.removesuffix(".correct") + ".n")  # removed by an earlier change: refused for that
        if type(n) is not int:
            return False
        return isinstance(value, list) and len(value) == len(old) and all(type(c) is int and 0 <= c <= n for c in value)
    if key.endswith(".loss"):
        valid = (
            all(type(x) is float and math.isfinite(x) and x >= 0 for x in value) if isinstance(value, list) else False
        )
        return valid and len(value) == len(old)
    return False


def _change_record(content: RecordDict, data) -> bool:
    """A record removed, or one added (an array, metric or config record; an extra's name too)."""
    if data.draw(st.booleans()) and len(content):
        name = data.draw(st.sampled_from(sorted(content)))
        del content[name]
        return True
    names = NAMES | st.sampled_from(["extra.last_grad", "extra.scaffold_increment", "delta", "classes", "kept"])
    name = data.draw(names.filter(lambda n: n not in content))
    kind = data.draw(st.sampled_from(["array", "metric", "config"]))
    if kind == "array":  # packed, or one array per tensor as before
        from incofl.deploy.wire.codec import to_arrays

        zeros = np.zeros(data.draw(st.integers(0, 4)), dtype=np.float32)
        packed = data.draw(st.booleans())
        content[name] = to_arrays({"w": torch.from_numpy(zeros)}) if packed else ArrayRecord({"w": Array(zeros)})
    else:
        content[name] = MetricRecord({"x": 1}) if kind == "metric" else ConfigRecord({"x": "y"})
    return True


DTYPES = [torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool, torch.float32]


def _change_array(content: RecordDict, data) -> bool:
    """A packed state changed: its entries (one removed, added or renamed, its dtype or shape
    changed, a NaN/Inf written into it, the classes a client holds changed; packed again, so
    well-formed) or its form (its index's bytes, a name twice, an entry of the wrong types, the
    data's length, the record's arrays, their metadata)."""
    if not content.array_records:
        return False
    name = data.draw(st.sampled_from(sorted(content.array_records)))
    record = content.array_records[name]
    how = data.draw(st.sampled_from(["entry", "index", "twice", "types", "length", "arrays", "metadata"]))
    if how == "entry":
        return _change_entry(content, name, data)
    if how == "arrays":
        if record and data.draw(st.booleans()):
            key = data.draw(st.sampled_from(sorted(record)))
            if data.draw(st.booleans()):
                del record[key]
            else:
                record[data.draw(NAMES.filter(lambda k: k not in record))] = record.pop(key)
        else:
            record[data.draw(NAMES.filter(lambda k: k not in record))] = Array(np.zeros(3, dtype=np.uint8))
        return True
    if set(record) != {"index", "data"}:
        return False
    index, raw = record["index"], record["data"]
    if how == "metadata":
        array = data.draw(st.sampled_from([index, raw]))
        stype = data.draw(st.sampled_from([array.stype, "numpy.ndarray", ""]))
        dtype = data.draw(st.sampled_from([array.dtype, "float32", "int8", "object"]))
        shape = data.draw(st.sampled_from([tuple(array.shape), (len(array.data) + 1,), (1, len(array.data)), (2**31,)]))
        if (stype, dtype, shape) == (array.stype, array.dtype, tuple(array.shape)):
            return False
        key = "index" if array is index else "data"
        record[key] = Array(dtype, shape, stype, array.data)
    elif how == "length":
        cut = data.draw(st.integers(1, 8))
        changed = raw.data + b"\0" * cut if data.draw(st.booleans()) or len(raw.data) < cut else raw.data[:-cut]
        record["data"] = Array(raw.dtype, (len(changed),), raw.stype, changed)
    elif how == "index":
        text = index.data
        at = data.draw(st.integers(0, len(text)))
        cut = data.draw(st.sampled_from(["truncate", "extend", "flip"]))
        if cut == "truncate" and at == len(text) or cut == "flip" and at == len(text):
            return False
        if cut == "flip":
            changed = text[:at] + bytes([text[at] ^ data.draw(st.integers(1, 255))]) + text[at + 1 :]
        else:
            changed = text[:at] if cut == "truncate" else text + data.draw(st.sampled_from([b" ", b"[]", b"\0"]))
        if _same_index(changed, text):
            return False
        record["index"] = Array(index.dtype, (len(changed),), index.stype, changed)
    else:  # an entry named twice, or one of the wrong types (JSON the node could send)
        try:
            entries = _index(index.data)
        except (ValueError, RecursionError):  # broken by an earlier change
            return False
        if (
            not isinstance(entries, list)
            or not entries
            or not all(isinstance(e, list) and len(e) == 3 for e in entries)
        ):
            return False
        at = data.draw(st.integers(0, len(entries) - 1))
        if how == "twice":
            entries.insert(data.draw(st.integers(0, len(entries))), list(entries[at]))
        else:
            part = data.draw(st.integers(0, 2))
            entries[at][part] = data.draw(st.sampled_from([7, 1.5, None, "x", [], {}, True, [-1], [0.5], ["2"]]))
            if entries[at][part] == _index(index.data)[at][part]:
                return False
        text = json.dumps(entries, separators=(",", ":")).encode()
        record["index"] = Array(index.dtype, (len(text),), index.stype, text)
    return True


def _index(text: bytes) -> list:
    return json.loads(text.decode())


def _same_index(changed: bytes, original: bytes) -> bool:
    """Whether changed index bytes still read as the same index, at the same length (a change no check needs to see)."""
    try:
        return len(changed) == len(original) and _index(changed) == _index(original)
    except (ValueError, RecursionError):
        return False


def _change_entry(content: RecordDict, name: str, data) -> bool:
    """An entry of a packed state removed, added, renamed, of another dtype or shape, NaN or Inf
    written into it; the classes changed: the state packed again."""
    from incofl.deploy.wire.codec import CodecError, from_arrays, to_arrays

    try:
        state = from_arrays(content.array_records[name])
    except CodecError:  # broken by an earlier change
        return False
    if not state:
        return False
    key = data.draw(st.sampled_from(sorted(state)))
    values = state[key]
    how = data.draw(st.sampled_from(["remove", "add", "rename", "dtype", "shape", "nonfinite", "values"]))
    if how == "remove":
        del state[key]
    elif how == "add":
        state[data.draw(NAMES.filter(lambda k: k not in state))] = values.clone()
    elif how == "rename":
        state[data.draw(NAMES.filter(lambda k: k not in state))] = state.pop(key)
    elif how == "dtype":
        dtype = data.draw(st.sampled_from(DTYPES))
        if dtype == values.dtype:
            return False
        state[key] = values.to(dtype)
    elif how == "shape":
        if not values.numel():
            return False
        size = values.numel()
        shape = data.draw(st.sampled_from([(size,), (1, size), (size + 1,), (0,), ()]))
        if shape == tuple(values.shape):
            return False
        count = math.prod(shape)  # its values repeated or cut to the new shape (np.resize, in any dtype)
        state[key] = values.reshape(-1).repeat(count // size + 1)[:count].reshape(shape)
    elif how == "nonfinite" and values.is_floating_point() and values.numel():
        changed = values.clone()
        changed.view(-1)[data.draw(st.integers(0, values.numel() - 1))] = data.draw(
            st.sampled_from([math.nan, math.inf, -math.inf])
        )
        state[key] = changed
    elif how == "values" and name == "classes" and values.numel():  # a delta's values: a lie no server can see
        state[key] = values + 1
    else:
        return False
    content[name] = to_arrays(state)
    return True


def _change_hash(content: RecordDict, data) -> bool:
    """A reported hash that is no SHA-256 hex digest, or the record's keys changed."""
    if "kept" not in content.config_records:
        return False
    kept = content.config_records["kept"]
    key = data.draw(st.sampled_from(sorted(kept) + ["other"]))
    if key == "other" or key not in kept:
        kept[key] = "x"
        return True
    value = data.draw(st.one_of(st.text(max_size=70), st.integers(), st.just("A" * 64)))
    if isinstance(value, str) and (
        value == kept[key] or (len(value) in (0, 64) and set(value) <= set("0123456789abcdef"))
    ):
        return False  # another well-formed hash: a node may report any (its own state's), the node checks it
    kept[key] = value
    return True


CHANGES = [_change_metric, _change_record, _change_array, _change_hash]


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_randomly_changed_reply_is_refused_and_never_raises(honest, data):
    from incofl.deploy.server.transport import accept_scores, accept_update

    train, scores = honest
    if data.draw(st.booleans(), label="scores"):
        method, reply, job, expected = scores[data.draw(st.integers(0, len(scores) - 1), label="reply")]
        accept = lambda r: accept_scores(r, job, expected)  # noqa: E731
    else:
        method, reply, expected = train[data.draw(st.integers(0, len(train) - 1), label="reply")]
        accept = lambda r: accept_update(r, expected)  # noqa: E731
    content = clone(reply.content)
    for _ in range(data.draw(st.integers(1, 3))):
        data.draw(st.sampled_from(CHANGES))(content, data)
    got = accept(reply_with(reply, content))
    assert got.error or not _differs(reply.content, content), f"a changed reply of {method} was accepted"


def _differs(original: RecordDict, changed: RecordDict) -> bool:
    """Whether two messages' contents differ (records, entries, arrays' bytes and metadata, values and types)."""
    if {k: type(r) for k, r in original.items()} != {k: type(r) for k, r in changed.items()}:
        return True
    for name, record in original.items():
        other = changed[name]
        if set(record) != set(other):
            return True
        if isinstance(record, ArrayRecord):
            meta = lambda a: (a.dtype, tuple(a.shape), a.stype, a.data)  # noqa: E731
            if any(meta(a) != meta(other[k]) for k, a in record.items()):
                return True
        elif any(not _same(v, other[k]) for k, v in record.items()):
            return True
    return False


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_randomly_changed_bundle_is_refused_and_never_raises(honest, data):
    """A reply's states as they travel (one bundle: codec.bundled) with bytes of its head, table or
    states changed: unbundling refuses it (CodecError) or the reply's checks do, unless nothing
    the server reads changed."""
    from incofl.deploy.server.transport import accept_update
    from incofl.deploy.wire.codec import BUNDLE, CodecError, bundled, packed_array, unbundled

    train, _ = honest
    method, reply, expected = train[data.draw(st.integers(0, len(train) - 1), label="reply")]
    travels = bundled(clone(reply.content))
    blob = bytearray(travels.array_records[BUNDLE]["data"].data)
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, min(len(blob) - 1, 400)), label="at")  # the head, the table, the first bytes
        if data.draw(st.booleans(), label="insert"):
            blob[at:at] = data.draw(st.binary(min_size=1, max_size=4))
        else:
            blob[at] = data.draw(st.integers(0, 255))
    travels[BUNDLE]["data"] = packed_array(bytes(blob))
    try:
        content = unbundled(travels)
    except CodecError:
        return
    got = accept_update(reply_with(reply, content), expected)
    assert got.error or not _differs(reply.content, content), f"a changed bundle of {method} was accepted"
