"""Between incofl's round contracts and Flower's records: states (name -> tensor) as an
`ArrayRecord` (bit-exact: numpy's .npy bytes of the tensor, dtype and shape kept), a
`ClientPlan` as a `ConfigRecord` (its width view's index tensors in an `ArrayRecord`), and a
`ClientUpdate` as a `RecordDict` (its deltas, what it leaves for the server in `extra`, the
classes it holds and its counts as metrics). The round's messages: `train_content` (server to
client) and `update_content` (client to server), read back by `read_train` and `read_update`;
an evaluation's: `evaluate_content` and `scores_content` (`read_evaluate`, `read_scores`).
"""

from __future__ import annotations

from typing import Any

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from incofl.federation.server import EvalJob, TrainJob
from incofl.fl.contracts import ClientPlan, ClientUpdate, Index, State, View
from incofl.fl.stages.evaluation import Scores

EXTRA = "extra."  # record names of an update's `extra` states


class CodecError(ValueError):
    """A record that does not decode to what it should (a malformed message)."""


def to_arrays(state: State) -> ArrayRecord:
    return ArrayRecord({name: Array(t.detach().cpu().numpy()) for name, t in state.items()})


def from_arrays(record: ArrayRecord, device: torch.device | str = "cpu") -> State:
    return {name: torch.from_numpy(array.numpy().copy()).to(device) for name, array in record.items()}


def _names(names: frozenset[str] | None) -> list[str]:
    return sorted(names) if names is not None else []


def plan_records(plan: ClientPlan) -> tuple[ConfigRecord, ArrayRecord]:
    """A plan's fields, and its view's index tensors keyed `name#dim` (dims that take all: none)."""
    config: dict[str, Any] = {
        "client": plan.client,
        "group": plan.group,
        "federation": plan.federation,
        "federation_size": plan.federation_size,
        "trainable": _names(plan.trainable),
        "all_trainable": plan.trainable is None,
        "upload": _names(plan.upload),
        "all_upload": plan.upload is None,
        "keep": _names(plan.keep),
        "last_grad": plan.last_grad,
        "view": plan.view is not None,
    }
    arrays = ArrayRecord()
    if plan.view is not None:
        view = plan.view
        config |= {
            "view_group": view.group,
            "cost": float(view.cost),
            "view_names": list(view.index),
            "view_dims": [len(index) for index in view.index.values()],
        }
        for name, index in view.index.items():
            for dim, positions in enumerate(index):
                if positions is not None:
                    arrays[f"{name}#{dim}"] = Array(positions.cpu().numpy())
    return ConfigRecord(config), arrays


def read_plan(config: ConfigRecord, arrays: ArrayRecord) -> ClientPlan:
    def names(key: str, everything: str) -> frozenset[str] | None:
        return None if config[everything] else frozenset(config[key])

    view = None
    if config["view"]:
        index: dict[str, Index] = {}
        for name, dims in zip(config["view_names"], config["view_dims"], strict=True):
            index[name] = tuple(
                torch.from_numpy(arrays[f"{name}#{d}"].numpy().copy()) if f"{name}#{d}" in arrays else None
                for d in range(int(dims))
            )
        view = View(int(config["view_group"]), index, float(config["cost"]))
    return ClientPlan(
        int(config["client"]),
        int(config["group"]),
        int(config["federation"]),
        int(config["federation_size"]),
        trainable=names("trainable", "all_trainable"),
        upload=names("upload", "all_upload"),
        keep=frozenset(config["keep"]),
        last_grad=bool(config["last_grad"]),
        view=view,
    )


def train_content(round_: int, job: TrainJob) -> RecordDict:
    """A planned client's instructions: the round, its plan, its start weights, what the
    server's objective sends (SCAFFOLD's c) and the hash of the state it should resume from."""
    config, view = plan_records(job.plan)
    return RecordDict(
        {
            "round": ConfigRecord({"round": round_, "state_sha256": job.state_sha256}),
            "plan": config,
            "view": view,
            "start": to_arrays(job.start),
            "broadcast": to_arrays(job.broadcast),
        }
    )


def read_train(content: RecordDict, device: torch.device) -> tuple[int, TrainJob]:
    try:
        plan = read_plan(content.config_records["plan"], content.array_records["view"])
        arrays, head = content.array_records, content.config_records["round"]
        start, broadcast = from_arrays(arrays["start"], device), from_arrays(arrays["broadcast"], device)
        return int(head["round"]), TrainJob(plan, start, broadcast, str(head["state_sha256"]))
    except (KeyError, TypeError, ValueError) as err:
        raise CodecError(f"malformed train message: {err!r}") from err


def update_content(update: ClientUpdate, kept_sha256: str, state_sha256: str) -> RecordDict:
    """A trained client's reply: its deltas, its `extra` states, the classes it holds, its
    counts, and the hashes of what it keeps and of its whole state (which never leave it)."""
    metrics = MetricRecord(
        {
            "client": update.client,
            "group": update.group,
            "federation": update.federation,
            "num_samples": update.num_samples,
            "steps": update.steps,
            "loss": float(update.loss),
            "full": int(update.full),
            "upload_params": update.upload_params,
        }
    )
    records: dict[str, Any] = {
        "delta": to_arrays(update.delta),
        "metrics": metrics,
        "kept": ConfigRecord({"sha256": kept_sha256, "state_sha256": state_sha256}),
    }
    for key, value in update.extra.items():
        if not isinstance(value, dict):
            raise CodecError(f"extra[{key!r}] of client {update.client}'s update is not a state (name -> tensor)")
        records[EXTRA + key] = to_arrays(value)
    if update.classes is not None:
        records["classes"] = to_arrays({"classes": update.classes})
    return RecordDict(records)


def read_update(content: RecordDict, device: torch.device) -> tuple[ClientUpdate, str, str]:
    """A reply's update (view: none; the server sets its own plan's), its kept entries' hash and its state's."""
    try:
        m = content.metric_records["metrics"]
        extra = {
            name[len(EXTRA) :]: from_arrays(r, device)
            for name, r in content.array_records.items()
            if name.startswith(EXTRA)
        }
        classes = from_arrays(content.array_records["classes"], device)["classes"] if "classes" in content else None
        update = ClientUpdate(
            int(m["client"]),
            int(m["group"]),
            from_arrays(content.array_records["delta"], device),
            int(m["num_samples"]),
            int(m["steps"]),
            federation=int(m["federation"]),
            extra=extra,
            loss=float(m["loss"]),
            full=bool(m["full"]),
            upload_params=int(m["upload_params"]),
            classes=classes,
        )
        hashes = content.config_records["kept"]
        return update, str(hashes["sha256"]), str(hashes["state_sha256"])
    except (KeyError, TypeError, ValueError) as err:
        raise CodecError(f"malformed update: {err!r}") from err


def message_bytes(content: RecordDict) -> int:
    """The bytes of a message's arrays (what travels, less the small config and metric records)."""
    return sum(record.count_bytes() for record in content.array_records.values())


def evaluate_content(round_: int, job: EvalJob) -> RecordDict:
    """A client's models to score: the round, the client, its group, the splits and its group's global weights."""
    config = {
        "round": round_,
        "client": job.client,
        "group": job.group,
        "splits": list(job.splits),
        "state_sha256": job.state_sha256,
    }
    return RecordDict({"job": ConfigRecord(config), "start": to_arrays(job.start)})


def read_evaluate(content: RecordDict, device: torch.device) -> tuple[int, EvalJob]:
    try:
        job = content.config_records["job"]
        start = from_arrays(content.array_records["start"], device)
        client, group, splits = int(job["client"]), int(job["group"]), tuple(map(str, job["splits"]))
        return int(job["round"]), EvalJob(client, group, splits, start, str(job["state_sha256"]))
    except (KeyError, TypeError, ValueError) as err:
        raise CodecError(f"malformed evaluate message: {err!r}") from err


def scores_content(client: int, splits: tuple[str, ...], scores: list[Scores]) -> RecordDict:
    """A node's scores of its client's models, by split: correct predictions and summed loss per exit, samples."""
    metrics: dict[str, Any] = {"client": client}
    for split, s in zip(splits, scores, strict=True):
        metrics |= {f"{split}.correct": list(s.correct), f"{split}.loss": list(s.loss), f"{split}.n": s.n}
    return RecordDict({"scores": MetricRecord(metrics)})


def read_scores(content: RecordDict, splits: tuple[str, ...]) -> tuple[int, list[Scores]]:
    """The client a reply names and its scores on `splits` (the splits asked)."""
    try:
        m = content.metric_records["scores"]
        scores = [
            Scores(
                [int(c) for c in m[f"{split}.correct"]], [float(x) for x in m[f"{split}.loss"]], int(m[f"{split}.n"])
            )
            for split in splits
        ]
        return int(m["client"]), scores
    except (KeyError, TypeError, ValueError) as err:
        raise CodecError(f"malformed scores: {err!r}") from err
