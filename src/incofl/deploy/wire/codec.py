"""Between incofl's exchange (fl/engine/exchange.py) and Flower's records: states (name ->
tensor) as packed `ArrayRecord`s, a job (`TrainJob`, `EvalJob`, with the `ClientPlan` a TrainJob
carries) as records derived from its fields (`job_content`, read back by `read_job`), a
`ClientUpdate` as a `RecordDict` (its deltas, what it leaves for the server in `extra`, the
classes it holds and its counts as metrics: `update_content`, `read_update`), and a client's
`Scores` by split (`scores_content`, `read_scores`).

A packed state is one record of two byte arrays, whatever its number of tensors: `data`, every
tensor's raw little-endian bytes back to back in the state's order, and `index`, its entries'
names, dtypes and shapes in that order (compact JSON: `[[name, dtype, shape], ...]`); both
`Array`s of stype PACKED, dtype uint8, shape (length,). Flower moves every `Array` as its own
object (one request each, at most two at a time): a state as one array per tensor cost two
objects per tensor each way (the array and its data), packed it is five (the record, its two
arrays and their data), one more per 5 MiB of data (docs/performance.md, Flower). Bit-exact for
every dtype of DTYPES (bfloat16 included). A width view's index tensors travel packed the same
way. As a message travels, all its packed states are bundled (`bundled`, `unbundled`) into one
record of one byte array: three objects, whatever its number of states.

Every dataclass is mapped field by field from its declarations (`dataclasses.fields`), by each
field's type, through one table (`FIELDS`; an update's metrics: `WIRE`): a new field of a known
type travels without a change here, one of another type fails loudly at its first message. What
a node sends is read against what the server expects (`ExpectedUpdate`, `ExpectedScores`) before
any tensor is decoded: exactly the expected records, the message within the byte budget its
states take packed (their data and indexes), each state exactly its two arrays, each of stype
PACKED, uint8 and its length; its index no longer than the expected entries' (before it is
parsed), well-formed (a JSON list of [string, known dtype, list of ints >= 0], no name twice),
exactly the expected names, each of its expected dtype and shape; its data exactly the bytes
they take; each metric of its field's type. A reply that is not so is refused (`CodecError`, one
line); an instruction a node reads (`from_arrays`) is held to the same form, less the expected
entries it cannot know.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import sys
from collections.abc import Callable
from dataclasses import Field, fields
from typing import Any, TypeVar

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from incofl.deploy import REPLY_OVERHEAD
from incofl.deploy.wire.signing import SignatureError, digest, sign, statement, verify
from incofl.fl.contracts import ClientPlan, ClientUpdate, Round, State, View
from incofl.fl.engine.exchange import EvalJob, ExpectedScores, ExpectedUpdate, TrainJob
from incofl.fl.stages.component import Expected
from incofl.fl.stages.evaluation import Scores

EXTRA = "extra."  # record names of an update's `extra` states
UPDATE_ARRAYS = {"delta": "delta", "classes": "classes"}  # ClientUpdate's tensor fields -> their records
UPDATE_KEPT_ON_NODE = ("kept", "view")  # never sent: what the client keeps; the server's own plan's view
PACK = ("index", "data")  # a packed state's two arrays: its index (JSON) and its tensors' bytes back to back
PACKED = "incofl.packed"  # their Array stype: raw bytes (no .npy header), dtype uint8, shape (length,)
BUNDLE = "incofl.bundle"  # the one array record a message's packed states travel in (`bundled`)
HEAD, MAX_TABLE, MAX_STATES = 8, 1 << 16, 256  # a bundle's table: its length's bytes, its largest size and entries
DTYPES = {  # the dtypes a state may hold, by the name its index gives them
    str(dtype).removeprefix("torch."): dtype
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16)
    + (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
}
MAX_DIMS = 64  # the most dimensions an index entry may have (a model's states have at most 5)
WIRE = {"int": int, "float": float, "bool": int}  # a metric field's declared type -> the type it travels as
SIGNATURE = "incofl.signature"  # the config record of a message's signature (signing.py)
SIGNED_LINE = " [signed "  # ends a node's failure line its site signed: the signature in base64, then "]"
J = TypeVar("J", TrainJob, EvalJob)


class CodecError(ValueError):
    """A record that does not decode to what it should (a malformed message)."""


def short(names: Any) -> str:
    """A few of a node's names, each cut short, for a one-line refusal."""
    names = sorted(map(str, names))
    return ", ".join(repr(n[:40]) for n in names[:3]) + (" ..." if len(names) > 3 else "")


# A state (name -> tensor) packed: one record of two byte arrays (module docstring)
def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def entry_bytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * dtype.itemsize


def index_bytes(entries: Expected) -> bytes:
    """A state's index as it travels: [[name, dtype, shape], ...] in compact JSON (ASCII), in the state's order."""
    index = [[name, dtype_name(dtype), list(shape)] for name, (shape, dtype) in entries.items()]
    return json.dumps(index, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def packed_array(data: bytes) -> Array:
    return Array(dtype="uint8", shape=(len(data),), stype=PACKED, data=data)


def to_arrays(state: State) -> ArrayRecord:
    """A state packed: its index and its tensors' bytes back to back, little-endian, in its order."""
    if sys.byteorder != "little":
        raise CodecError("packed states are little-endian: this machine is not")
    tensors = {name: t.detach().cpu().contiguous() for name, t in state.items()}
    for name, t in tensors.items():
        if dtype_name(t.dtype) not in DTYPES:
            raise CodecError(f"{name}: no encoding for dtype {t.dtype}")
    index = index_bytes({name: (tuple(t.shape), t.dtype) for name, t in tensors.items()})
    data = b"".join(t.reshape(-1).view(torch.uint8).numpy().data for t in tensors.values() if t.numel())
    return ArrayRecord({"index": packed_array(index), "data": packed_array(data)})


def byte_array(array: Array, what: str) -> bytes:
    """The bytes of a byte array as the codec makes them (`packed_array`): of stype PACKED, uint8, its length."""
    data = array.data
    shape = tuple(array.shape) if isinstance(array.shape, (tuple, list)) else None
    if type(data) is not bytes or array.stype != PACKED or array.dtype != "uint8" or shape != (len(data),):
        got = f"{str(array.stype)[:20]} {str(array.dtype)[:20]} {str(array.shape)[:40]}"
        raise CodecError(f"{what}: {got}, expected {PACKED} uint8 of its length")
    return data


def packed(record: ArrayRecord, what: str) -> tuple[bytes, bytes]:
    """A packed state's index and data bytes, if the record is exactly its two byte arrays."""
    if set(record) != set(PACK):
        raise CodecError(f"{what}: arrays {short(record)}, expected a packed state ({', '.join(PACK)})")
    index, data = (byte_array(record[key], f"{what} {key}") for key in PACK)
    return index, data


# A message's packed states bundled: one record of one byte array as they travel (`bundled`)
def bundled(content: RecordDict) -> RecordDict:
    """`content` as it travels: its array records (packed states) in the one record BUNDLE of one
    byte array, [table's length, 8 bytes little-endian][table][each state's index and data in
    turn], the table a compact JSON list of [record, index bytes, data bytes] in that order; its
    other records as they are. Flower moves every Array as two objects or more, one request each,
    on every hop: k packed states are 5k objects, bundled 3 (docs/performance.md, Flower)."""
    arrays = content.array_records
    if not arrays:
        return content
    table, parts = [], []
    for name, record in arrays.items():
        index, data = packed(record, name)
        table.append([name, len(index), len(data)])
        parts += [index, data]
    head = json.dumps(table, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    blob = b"".join([len(head).to_bytes(HEAD, "little"), head, *parts])
    others = {name: record for name, record in content.items() if name not in arrays}
    return RecordDict({BUNDLE: ArrayRecord({"data": packed_array(blob)}), **others})


def bundle_table(blob: bytes, taken: set[str]) -> tuple[int, list[tuple[str, int, int]]]:
    """Where a bundle's states start, and its table, if well-formed: at most MAX_TABLE bytes
    (before it is parsed), at most MAX_STATES entries of [a record name no other record has, and
    twice none, two ints >= 0] whose lengths add up to the bytes after it."""
    size = int.from_bytes(blob[:HEAD], "little") if len(blob) >= HEAD else -1
    if not 0 <= size <= min(MAX_TABLE, len(blob) - HEAD):
        raise CodecError(f"{BUNDLE}: a table of {size} bytes in {len(blob)}")
    try:
        table = json.loads(blob[HEAD : HEAD + size].decode("ascii"))
    except (ValueError, RecursionError) as err:
        raise CodecError(f"{BUNDLE}: its table is not JSON ({str(err)[:80]})") from None
    if type(table) is not list or len(table) > MAX_STATES:
        raise CodecError(f"{BUNDLE}: its table is not a list of at most {MAX_STATES} entries")
    names: set[str] = set()
    for entry in table:
        if type(entry) is not list or [type(x) for x in entry] != [str, int, int] or min(entry[1:]) < 0:
            raise CodecError(f"{BUNDLE}: a table entry is not [str, int >= 0, int >= 0]")
        if entry[0] in names | taken | {BUNDLE}:
            raise CodecError(f"{BUNDLE}: {entry[0][:60]!r} twice")
        names.add(entry[0])
    if sum(entry[1] + entry[2] for entry in table) != len(blob) - HEAD - size:
        raise CodecError(f"{BUNDLE}: its table's lengths do not add up to its {len(blob)} bytes")
    return HEAD + size, [tuple(entry) for entry in table]


def unbundled(content: RecordDict) -> RecordDict:
    """`content` as it was before `bundled`, if its arrays are one well-formed bundle (bundle_table)
    or none; CodecError otherwise. No state is read here: each is checked where it is read."""
    arrays = content.array_records
    if not arrays:
        return content
    if set(arrays) != {BUNDLE} or set(arrays[BUNDLE]) != {"data"}:
        raise CodecError(f"arrays {short(arrays)}: a message's states travel in one record, {BUNDLE}")
    blob = byte_array(arrays[BUNDLE]["data"], BUNDLE)
    others = {name: record for name, record in content.items() if name != BUNDLE}
    at, table = bundle_table(blob, set(others))
    records = {}
    for name, index, data in table:
        records[name] = ArrayRecord(
            {"index": packed_array(blob[at : at + index]), "data": packed_array(blob[at + index : at + index + data])}
        )
        at += index + data
    return RecordDict({**records, **others})


def read_index(raw: bytes, what: str, limit: int | None = None) -> Expected:
    """A packed state's index (name -> shape and dtype, in its order), if it is well-formed: at most
    `limit` bytes (before it is parsed), a JSON list of [name, dtype, shape], each name a string
    and once only, each dtype one of DTYPES, each shape at most MAX_DIMS sizes >= 0."""
    if limit is not None and len(raw) > limit:
        raise CodecError(f"{what}: an index of {len(raw)} bytes, the expected entries' is {limit}")
    try:
        index = json.loads(raw.decode("ascii"))
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CodecError(f"{what}: its index is not JSON ({str(err)[:80]})") from None
    if type(index) is not list:
        raise CodecError(f"{what}: its index is a {type(index).__name__}, expected a list")
    entries: Expected = {}
    for entry in index:
        kinds = f"[{', '.join(type(x).__name__ for x in entry[:4])}]" if type(entry) is list else type(entry).__name__
        if type(entry) is not list or len(entry) != 3 or [type(x) for x in entry] != [str, str, list]:
            raise CodecError(f"{what}: an index entry {kinds[:60]}, expected [str, str, list] (name, dtype, shape)")
        name, dtype, shape = entry
        if dtype not in DTYPES:
            raise CodecError(f"{what} {name[:60]}: dtype {dtype[:20]!r}, expected one of {', '.join(DTYPES)}")
        if len(shape) > MAX_DIMS or not all(type(size) is int and size >= 0 for size in shape):
            raise CodecError(f"{what} {name[:60]}: its shape is not a list of at most {MAX_DIMS} ints >= 0")
        if name in entries:
            raise CodecError(f"{what}: {name[:60]!r} twice in its index")
        entries[name] = (tuple(shape), DTYPES[dtype])
    return entries


def check_length(data: bytes, entries: Expected, what: str) -> None:
    """A packed state's data exactly the bytes its (checked) index says."""
    size = sum(entry_bytes(dtype, shape) for shape, dtype in entries.values())
    if len(data) != size:
        raise CodecError(f"{what}: {len(data)} bytes of data, its index says {size}")


def unpack(data: bytes, entries: Expected, what: str, device: torch.device | str) -> State:
    """The tensors of a packed state's data, its index and length checked (check_length): each
    entry's bytes copied out (a bool entry: refused unless each byte is 0 or 1)."""
    if sys.byteorder != "little":
        raise CodecError("packed states are little-endian: this machine is not")
    raw, state, at = np.frombuffer(data, np.uint8), {}, 0
    for name, (shape, dtype) in entries.items():
        n = entry_bytes(dtype, shape)
        chunk = raw[at : at + n]
        if dtype == torch.bool and chunk.size and chunk.max() > 1:
            raise CodecError(f"{what} {name[:60]}: bool values other than 0 and 1")
        if n:
            tensor = torch.from_numpy(chunk.copy()).view(dtype).reshape(shape)
        else:
            tensor = torch.empty(shape, dtype=dtype)
        state[name] = tensor.to(device)
        at += n
    return state


def from_arrays(record: ArrayRecord, device: torch.device | str = "cpu", what: str = "state") -> State:
    """A packed state (the server's instructions, read on the node): refused unless well-formed (read_index)
    and its data exactly the bytes its index says."""
    index, data = packed(record, what)
    entries = read_index(index, what)
    check_length(data, entries, what)
    return unpack(data, entries, what, device)


def read_state(record: ArrayRecord, expected: Expected, what: str, device: torch.device | str) -> State:
    """A state of a node's message, if it holds exactly the expected entries (in the node's order),
    each of its expected dtype and shape, and its data exactly their bytes: all checked before a
    byte of its data is read (the index's length before it is parsed)."""
    index, data = packed(record, what)
    entries = read_index(index, what, len(index_bytes(expected)))
    if set(entries) != set(expected):
        raise CodecError(f"{what}: entries other than expected: {short(set(entries) ^ set(expected))}")
    for name, (shape, dtype) in entries.items():
        want_shape, want = expected[name]
        if (tuple(shape), dtype) != (tuple(want_shape), want):
            got, wanted = f"{dtype_name(dtype)} {tuple(shape)}"[:80], f"{dtype_name(want)} {tuple(want_shape)}"
            raise CodecError(f"{what} {name[:60]}: {got}, expected {wanted}")
    check_length(data, entries, what)
    return unpack(data, entries, what, device)


def check_records(content: RecordDict, arrays: set[str], metrics: set[str], configs: set[str]) -> None:
    """The message holds exactly these records."""
    for kind, got, want in (
        ("array", set(content.array_records), arrays),
        ("metric", set(content.metric_records), metrics),
        ("config", set(content.config_records), configs),
    ):
        extra = got - want
        if extra or want - got:
            raise CodecError(f"{kind} records other than expected: {short(extra | (want - got))}")


def packed_bytes(expected: list[Expected]) -> int:
    """The bytes the expected states take packed (their data and their indexes: an honest index is
    as long in any order)."""
    return sum(
        len(index_bytes(state)) + sum(entry_bytes(dtype, shape) for shape, dtype in state.values())
        for state in expected
    )


def reply_bytes(expected: list[Expected]) -> int:
    """The most a reply holding the expected states may be as Flower moves it (the ServerApp stops
    pulling one past it): their packed bytes, and REPLY_OVERHEAD for its other records and headers."""
    return packed_bytes(expected) + REPLY_OVERHEAD


def check_budget(content: RecordDict, expected: list[Expected]) -> None:
    """The message's arrays within the bytes the expected states take packed, summed from the arrays' lengths."""
    budget = packed_bytes(expected)
    size = sum(len(array.data) for record in content.array_records.values() for array in record.values())
    if size > budget:
        raise CodecError(f"{size} bytes of arrays, the plan allows {budget}")


def read_metric(record: MetricRecord | ConfigRecord, key: str, kind: type, what: str) -> Any:
    """A metric (or config value) of exactly type `kind` (a list: of one type of number)."""
    if key not in record:
        raise CodecError(f"{what}: no {key}")
    value = record[key]
    if type(value) is not kind:
        raise CodecError(f"{what} {key}: of type {type(value).__name__}, expected {kind.__name__}")
    return value


# Each field of a message's dataclass (TrainJob, EvalJob and the ClientPlan in a TrainJob) travels
# by its declared type, through one table that both encodes and decodes it: plain values in the
# dataclass's config record, a state (and a width view's index tensors) in an array record of its
# own, a nested dataclass in records of its own. A field of a type the table lacks fails at once.
class FieldCodec:
    """How a field travels: `encode` writes it into the config values and records of its message,
    `decode` reads it back (`key`: the name its own records take)."""

    def encode(self, name: str, value: Any, config: dict[str, Any], records: dict[str, Any], key: str) -> None:
        raise NotImplementedError

    def decode(self, name: str, config: ConfigRecord, content: RecordDict, key: str, device: Any) -> Any:
        raise NotImplementedError


class Value(FieldCodec):
    """A field held by one config value: `out` makes the value sent of it, `back` the field of that."""

    def __init__(self, out: Callable[[Any], Any], back: Callable[[Any], Any]):
        self.out, self.back = out, back

    def encode(self, name: str, value: Any, config: dict[str, Any], records: dict[str, Any], key: str) -> None:
        config[name] = self.out(value)

    def decode(self, name: str, config: ConfigRecord, content: RecordDict, key: str, device: Any) -> Any:
        return self.back(config[name])


class NamesOrAll(FieldCodec):
    """A set of names that may be None (all): its names and `name.all`."""

    def encode(self, name: str, value: Any, config: dict[str, Any], records: dict[str, Any], key: str) -> None:
        config |= {name: sorted(value) if value is not None else [], f"{name}.all": value is None}

    def decode(self, name: str, config: ConfigRecord, content: RecordDict, key: str, device: Any) -> Any:
        return None if config[f"{name}.all"] else frozenset(config[name])


class ViewField(FieldCodec):
    """A width view or None: whether there is one, its group, cost and shape in the config record,
    its index tensors in the array record `key` (keyed `entry#dim`; dims that take all: none)."""

    def encode(self, name: str, value: Any, config: dict[str, Any], records: dict[str, Any], key: str) -> None:
        config[name] = value is not None
        index = {} if value is None else value.index
        records[key] = to_arrays(
            {f"{e}#{d}": at for e, dims in index.items() for d, at in enumerate(dims) if at is not None}
        )
        if value is not None:
            config |= {
                f"{name}.group": value.group,
                f"{name}.cost": float(value.cost),
                f"{name}.names": list(value.index),
                f"{name}.dims": [len(dims) for dims in value.index.values()],
            }

    def decode(self, name: str, config: ConfigRecord, content: RecordDict, key: str, device: Any) -> Any:
        if not config[name]:
            return None
        positions = from_arrays(content.array_records[key], what=f"{name} index")
        index = {
            entry: tuple(positions.get(f"{entry}#{d}") for d in range(int(dims)))
            for entry, dims in zip(config[f"{name}.names"], config[f"{name}.dims"], strict=True)
        }
        return View(int(config[f"{name}.group"]), index, float(config[f"{name}.cost"]))


class StateField(FieldCodec):
    """A state (name -> tensor) in the array record `key`."""

    def encode(self, name: str, value: Any, config: dict[str, Any], records: dict[str, Any], key: str) -> None:
        records[key] = to_arrays(value)

    def decode(self, name: str, config: ConfigRecord, content: RecordDict, key: str, device: Any) -> Any:
        return from_arrays(content.array_records[key], device)


class Nested(FieldCodec):
    """A dataclass field in records of its own, named from `key`."""

    def __init__(self, cls: type) -> None:
        self.cls = cls

    def encode(self, name: str, value: Any, config: dict[str, Any], records: dict[str, Any], key: str) -> None:
        records |= encode_fields(value, key)

    def decode(self, name: str, config: ConfigRecord, content: RecordDict, key: str, device: Any) -> Any:
        return decode_fields(self.cls, content, key, device)


FIELDS: dict[str, FieldCodec] = {
    "int": Value(int, int),
    "bool": Value(bool, bool),
    "str": Value(str, str),
    "float": Value(float, float),
    "frozenset[str]": Value(sorted, frozenset),
    "tuple[str, ...]": Value(list, lambda v: tuple(map(str, v))),
    "frozenset[str] | None": NamesOrAll(),
    "View | None": ViewField(),
    "State": StateField(),
    "ClientPlan": Nested(ClientPlan),
    "Round": Value(lambda r: r.number, lambda number: Round(int(number))),
}


def field_codec(cls: type, f: Field) -> FieldCodec:
    if f.type not in FIELDS:
        raise CodecError(f"{cls.__name__}.{f.name}: no encoding for its type {f.type}")
    return FIELDS[str(f.type)]


def encode_fields(obj: Any, key: str) -> dict[str, Any]:
    """A dataclass's records: its plain fields in the config record `key`, the others in records
    named `key.field`."""
    config: dict[str, Any] = {}
    records: dict[str, Any] = {}
    for f in fields(obj):
        field_codec(type(obj), f).encode(f.name, getattr(obj, f.name), config, records, f"{key}.{f.name}")
    return {key: ConfigRecord(config), **records}


def decode_fields(cls: type, content: RecordDict, key: str, device: Any) -> Any:
    config = content.config_records[key]
    return cls(
        **{f.name: field_codec(cls, f).decode(f.name, config, content, f"{key}.{f.name}", device) for f in fields(cls)}
    )


def job_content(job: TrainJob | EvalJob) -> RecordDict:
    """A job's message (server to client): its fields (module docstring)."""
    return RecordDict(encode_fields(job, "job"))


def read_job(cls: type[J], content: RecordDict, device: torch.device | str) -> J:
    """A job of type `cls` from its message (from the server: its signature checked)."""
    try:
        return decode_fields(cls, content, "job", device)
    except (KeyError, TypeError, ValueError) as err:
        raise CodecError(f"malformed {cls.__name__} message: {err!r}") from err


def update_metrics(cls: type[ClientUpdate] = ClientUpdate) -> dict[str, str]:
    """ClientUpdate's fields sent as metrics, by their declared types (WIRE): every field but its
    tensors and what stays on the node; one of a type WIRE lacks cannot be sent."""
    metrics = {}
    for f in fields(cls):
        if f.name in UPDATE_ARRAYS or f.name in UPDATE_KEPT_ON_NODE or f.name == "extra":
            continue
        if f.type not in WIRE:
            raise CodecError(f"{cls.__name__}.{f.name}: no encoding for its type {f.type}")
        metrics[f.name] = str(f.type)
    return metrics


def update_content(update: ClientUpdate, kept_sha256: str, state_sha256: str) -> RecordDict:
    """A trained client's reply: its deltas, its `extra` states, the classes it holds, its
    counts, and the hashes of what it keeps and of its whole state (which never leave it)."""
    metrics = {name: WIRE[kind](getattr(update, name)) for name, kind in update_metrics(type(update)).items()}
    records: dict[str, Any] = {
        "delta": to_arrays(update.delta),
        "metrics": MetricRecord(metrics),
        "kept": ConfigRecord({"sha256": kept_sha256, "state_sha256": state_sha256}),
    }
    for key, value in update.extra.items():
        if not isinstance(value, dict):
            raise CodecError(f"extra[{key!r}] of client {update.client}'s update is not a state (name -> tensor)")
        records[EXTRA + key] = to_arrays(value)
    if update.classes is not None:
        records["classes"] = to_arrays({"classes": update.classes})
    return RecordDict(records)


def read_update(
    content: RecordDict, expected: ExpectedUpdate, device: torch.device | str
) -> tuple[ClientUpdate, str, str]:
    """A reply's update (view: none; the server sets its own plan's), its kept entries' hash and
    its state's, if its form is what `expected` allows (module docstring): its values are
    server.check_update's to check."""
    extras = {EXTRA + key: key for key in expected.extra}
    check_records(content, {*UPDATE_ARRAYS.values(), *extras}, {"metrics"}, {"kept"})
    check_budget(content, expected.states())
    m = content.metric_records["metrics"]
    kinds = update_metrics()
    if set(m) != set(kinds):
        raise CodecError(f"metrics other than expected: {short(set(m) ^ set(kinds))}")
    values = {name: read_metric(m, name, WIRE[kind], "metrics") for name, kind in kinds.items()}
    flags = [name for name, kind in kinds.items() if kind == "bool"]
    if any(values[name] not in (0, 1) for name in flags):
        raise CodecError(f"metrics {', '.join(flags)}: 0 or 1 expected")
    hashes = content.config_records["kept"]
    if set(hashes) != {"sha256", "state_sha256"}:
        raise CodecError(f"kept: entries other than expected: {short(set(hashes) ^ {'sha256', 'state_sha256'})}")
    kept, state = (read_metric(hashes, key, str, "kept") for key in ("sha256", "state_sha256"))
    arrays = content.array_records
    classes = read_state(arrays["classes"], expected.classes_entry(), "classes", device)["classes"]
    update = ClientUpdate(
        delta=read_state(arrays["delta"], expected.delta, "delta", device),
        extra={
            key: read_state(arrays[name], expected.extra[key], f"extra {key}", device) for name, key in extras.items()
        },
        classes=classes,
        **{name: bool(value) if name in flags else value for name, value in values.items()},
    )
    return update, kept, state


def message_bytes(content: RecordDict) -> int:
    """The bytes of a message's arrays (what travels, less the small config and metric records)."""
    return sum(record.count_bytes() for record in content.array_records.values())


SCORE_WIRE = {"list[int]": (list, int), "list[float]": (list, float), "int": (int, None)}  # Scores' field types


def scores_content(client: int, splits: tuple[str, ...], scores: list[Scores]) -> RecordDict:
    """A client's scores of its models, by split: each of Scores' fields as `split.field` (correct
    predictions and summed loss per exit, samples)."""
    metrics: dict[str, Any] = {"client": client}
    for split, s in zip(splits, scores, strict=True):
        metrics |= {f"{split}.{f.name}": getattr(s, f.name) for f in fields(Scores)}
    return RecordDict({"scores": MetricRecord(metrics)})


def read_scores(content: RecordDict, splits: tuple[str, ...], expected: ExpectedScores) -> tuple[int, list[Scores]]:
    """The client a reply names and its scores on `splits` (the splits asked), if its form is
    what `expected` allows: exactly these metrics, each of its field's type, one entry per exit
    (exchange.check_scores checks the values)."""
    check_records(content, set(), {"scores"}, set())
    m = content.metric_records["scores"]
    keys = {"client", *(f"{split}.{f.name}" for split in splits for f in fields(Scores))}
    if set(m) != keys:
        raise CodecError(f"scores other than expected: {short(set(m) ^ keys)}")
    scores = []
    for split in splits:
        values = {}
        for f in fields(Scores):
            kind, item = SCORE_WIRE[str(f.type)]
            value = read_metric(m, f"{split}.{f.name}", kind, "scores")
            if item is not None and not all(type(x) is item for x in value):
                raise CodecError(f"scores {split}.{f.name}: entries must be of type {item.__name__}")
            if item is not None and len(value) != expected.exits:
                raise CodecError(
                    f"scores {split}.{f.name}: {len(value)} entries, the model has {expected.exits} exit(s)"
                )
            values[f.name] = value
        scores.append(Scores(**values))
    return read_metric(m, "client", int, "scores"), scores


# Signatures (signing.py): the statement each side signs, the record that carries it
def instruction_statement(content: RecordDict, run: int, node: int, kind: str, round_: int) -> bytes:
    return statement("instruction", run=run, node=node, type=kind, round=round_, content=digest(content, SIGNATURE))


def reply_statement(content: RecordDict, run: int, round_: int, client: int, answers: str, kind: str) -> bytes:
    text = digest(content, SIGNATURE)
    return statement("reply", run=run, round=round_, client=client, answers=answers, type=kind, content=text)


def signed(content: RecordDict, signature: bytes, round_: int) -> RecordDict:
    """`content` with its signature (and the round it is signed for) in the SIGNATURE record."""
    content[SIGNATURE] = ConfigRecord({"round": round_, "signature": signature})
    return content


def unsigned(content: RecordDict) -> RecordDict:
    """`content` without its signature record."""
    return RecordDict({name: record for name, record in content.items() if name != SIGNATURE})


def signature_of(content: RecordDict) -> tuple[int, bytes]:
    """The round and signature a message's SIGNATURE record holds; SignatureError if none or malformed."""
    record = content.config_records.get(SIGNATURE)
    if record is None:
        raise SignatureError("it is not signed")
    round_, signature = record.get("round"), record.get("signature")
    if set(record) != {"round", "signature"} or type(round_) is not int or type(signature) is not bytes:
        raise SignatureError("its signature record is malformed")
    return round_, signature


def sign_instruction(content: RecordDict, key: Any, run: int, node: int, kind: str, round_: int) -> RecordDict:
    """An instruction for `node` signed with the server's key (its round in the signature record)."""
    return signed(content, sign(key, instruction_statement(content, run, node, kind, round_)), round_)


def open_instruction(content: RecordDict, public: Any, run: int, node: int, kind: str) -> tuple[RecordDict, int]:
    """An instruction's content without its signature and the round it is for, if the server
    signed it for this run, this node and this type; SignatureError otherwise."""
    round_, signature = signature_of(content)
    verify(public, instruction_statement(content, run, node, kind, round_), signature, "the server")
    return unsigned(content), round_


def sign_reply(
    content: RecordDict, key: Any, run: int, round_: int, client: int, answers: str, kind: str
) -> RecordDict:
    """A reply signed with its site's node key, bound to what it answers."""
    return signed(content, sign(key, reply_statement(content, run, round_, client, answers, kind)), round_)


def open_reply(
    content: RecordDict, public: Any, run: int, round_: int, client: int, answers: str, kind: str
) -> RecordDict:
    """A reply's content without its signature, if client `client`'s site signed it as the
    answer to the instruction `answers` (of type `kind`, round `round_`, this run); SignatureError otherwise."""
    signed_round, signature = signature_of(content)
    if signed_round != round_:
        raise SignatureError(f"it is signed for round {signed_round}, asked in round {round_}")
    verify(public, reply_statement(content, run, round_, client, answers, kind), signature, f"client {client}'s site")
    return unsigned(content)


def failure_statement(text: str, run: int, client: int, answers: str, kind: str) -> bytes:
    return statement("failure", run=run, client=client, answers=answers, type=kind, text=text)


def sign_failure(text: str, key: Any, run: int, client: int, answers: str, kind: str) -> str:
    """A node's one-line failure `text` with its site's signature at its end, bound to what it
    answers (an error reply holds that line only: no record to sign)."""
    signature = sign(key, failure_statement(text, run, client, answers, kind))
    return f"{text}{SIGNED_LINE}{base64.b64encode(signature).decode()}]"


def failure_text(line: str) -> tuple[str, str]:
    """A node's failure line: its text and its signature (base64; '' where it carries none)."""
    text, mark, rest = line.rpartition(SIGNED_LINE)
    return (text, rest[:-1]) if mark and rest.endswith("]") else (line, "")


def open_failure(line: str, public: Any, run: int, client: int, answers: str, kind: str) -> str:
    """A failure line's text, if client `client`'s site signed it as its answer to the instruction
    `answers` (of type `kind`, this run); SignatureError otherwise."""
    text, signature = failure_text(line)
    if not signature:
        raise SignatureError("it is not signed")
    try:
        raw = base64.b64decode(signature, validate=True)
    except binascii.Error:
        raise SignatureError("its signature is malformed") from None
    verify(public, failure_statement(text, run, client, answers, kind), raw, f"client {client}'s site")
    return text
