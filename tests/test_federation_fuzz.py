"""The federation server's checks of every reply (docs/federation.md): honest replies of tiny
in-process runs (SCAFFOLD's increments, sent after a local step, FedLAG's last gradients and held-out scores,
FedNova's steps, HeteroFL's width views), captured once, are accepted; each named lie, and
random changes of any part a server can know (every metric, record, array, .npy header, dtype,
hash and score), are refused without an exception escaping."""

from __future__ import annotations

import copy
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

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
    from incofl.deploy import serverapp, transport
    from incofl.deploy.inprocess import InProcessGrid

    train, scores = [], []
    accept_update, accept_scores = transport.accept_update, transport.accept_scores
    for method, extra in RUNS.items():
        tmp = tmp_path_factory.mktemp(method)
        config = write_config(tmp, methods=[method], **extra)
        grid = InProcessGrid(export_sites(load_run_config(config), tmp))

        def record_update(reply, expected, content=None, method=method):
            train.append((method, reply, expected))
            return accept_update(reply, expected, content)

        def record_scores(reply, job, expected, content=None, method=method):
            scores.append((method, reply, job, expected))
            return accept_scores(reply, job, expected, content)

        transport.accept_update, transport.accept_scores = record_update, record_scores
        try:
            serverapp.serve(grid, serverapp.AppSettings(str(config), {}, tmp / "federation", join_timeout=5.0))
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
    from incofl.deploy.transport import accept_scores, accept_update

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
    from incofl.deploy.transport import accept_update

    reply, expected = _first(honest[0], method)
    refused = accept_update(reply_with(reply, lie(reply.content)), expected)
    assert refused.update is None and why in refused.error


def test_an_unasked_extra_array_is_refused_before_it_is_decoded(honest):
    from incofl.deploy.transport import accept_update

    reply, expected = _first(honest[0], "SCAFFOLD")
    changed = clone(reply.content)
    changed["extra.junk"] = ArrayRecord({"x": Array(np.zeros(16 * 2**20, dtype=np.float32))})  # 64 MB
    refused = accept_update(reply_with(reply, changed), expected)
    assert "array records other than expected: 'extra.junk'" in refused.error


def test_a_float64_delta_where_the_plan_holds_float32_is_refused(honest):
    from incofl.deploy.transport import accept_update

    reply, expected = _first(honest[0], "SCAFFOLD")
    changed = clone(reply.content)
    name, array = next(iter(changed.array_records["delta"].items()))
    changed.array_records["delta"][name] = Array(array.numpy().astype(np.float64))
    refused = accept_update(reply_with(reply, changed), expected)
    assert f"delta {name}: float64" in refused.error and "expected float32" in refused.error


def test_scores_without_counts_and_a_negative_sample_count_are_refused(honest):
    from incofl.deploy.transport import accept_scores

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
        n = metrics[key.removesuffix(".correct") + ".n"]
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
    if kind == "array":
        content[name] = ArrayRecord({"w": Array(np.zeros(data.draw(st.integers(0, 4)), dtype=np.float32))})
    else:
        content[name] = MetricRecord({"x": 1}) if kind == "metric" else ConfigRecord({"x": "y"})
    return True


def _change_array(content: RecordDict, data) -> bool:
    """An array's entry removed, added or renamed, its dtype, shape, metadata or .npy bytes
    changed, or a NaN/Inf written into it; the classes a client holds changed."""
    if not content.array_records:
        return False
    record = content.array_records[data.draw(st.sampled_from(sorted(content.array_records)))]
    if not record:
        return False
    key = data.draw(st.sampled_from(sorted(record)))
    array = record[key]
    values = array.numpy()
    how = data.draw(st.sampled_from(["remove", "add", "rename", "dtype", "shape", "metadata", "bytes", "nonfinite"]))
    if how == "remove":
        del record[key]
    elif how == "add":
        record[data.draw(NAMES.filter(lambda k: k not in record))] = Array(values.copy())
    elif how == "rename":
        record[data.draw(NAMES.filter(lambda k: k not in record))] = record.pop(key)
    elif how == "dtype":
        dtype = data.draw(st.sampled_from([np.float64, np.float16, np.int64, np.int32, np.bool_, np.float32]))
        if np.dtype(dtype) == values.dtype:
            return False
        record[key] = Array(values.astype(dtype))
    elif how == "shape":
        if not values.size:
            return False
        shape = data.draw(st.sampled_from([(values.size,), (1, values.size), (values.size + 1,), (0,), ()]))
        if shape == values.shape:
            return False
        record[key] = Array(np.resize(values, shape))
    elif how == "metadata":
        shape = data.draw(st.sampled_from([(1,), (2**31,), tuple(values.shape) + (1,)]))
        dtype = data.draw(st.sampled_from(["float32", "float64", "int64", "object"]))
        if shape == values.shape and dtype == str(values.dtype):
            return False
        record[key] = Array(dtype, tuple(shape), array.stype, array.data)
    elif how == "bytes":
        at = data.draw(st.integers(0, len(array.data)))
        cut = data.draw(st.sampled_from(["truncate", "extend", "header"]))
        if cut == "header" and at >= 128:
            return False
        if cut == "truncate" and at == len(array.data):
            return False
        raw = array.data[:at] if cut == "truncate" else array.data + b"\0" * 4 if cut == "extend" else None
        if raw is None:
            flipped = array.data[at] ^ data.draw(st.integers(1, 255))
            raw = array.data[:at] + bytes([flipped]) + array.data[at + 1 :]
            if _same_npy(raw, array.data):
                return False
        record[key] = Array(array.dtype, array.shape, array.stype, raw)
    elif values.dtype.kind == "f" and values.size:  # nonfinite
        changed = values.copy()
        changed.flat[data.draw(st.integers(0, values.size - 1))] = data.draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        record[key] = Array(changed)
    elif key == "classes" and values.size:  # classes: values change
        record[key] = Array(values + 1)
    else:
        return False
    return True


def _same_npy(raw: bytes, original: bytes) -> bool:
    """Whether changed .npy bytes still hold the same array (a header's padding or spacing changed)."""
    import io

    try:
        a, b = np.load(io.BytesIO(raw), allow_pickle=False), np.load(io.BytesIO(original), allow_pickle=False)
    except Exception:  # noqa: BLE001 (any failure: not the same array)
        return False
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes() and raw[:8] == original[:8]


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
    from incofl.deploy.transport import accept_scores, accept_update

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
