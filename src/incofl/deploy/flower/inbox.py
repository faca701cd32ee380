"""The ServerApp's pushes and pulls, guarded: no message a node sends can stop the server or
hold it past a deadline.

Flower 1.42's `HttpGrid.pull_messages` (superlink/grid/http_grid.py) takes every reply the
SuperLink holds for the ids asked, and with them every message any node addressed to the
SuperLink itself; then, one message after another, pulls each one's objects, retrying an object
not yet uploaded about 10 s apart until the node's upload session expires (180 s after its last
object pushed, so a node that pushes one now and then holds it up to `pull_objects`' 7200 s), and
decodes it, raising out of the call on the first it cannot decode. The SuperLink forgets the messages it
hands out, so a raise loses the whole batch. Here, on an `HttpGrid`, the same Runtime API calls
are made message by message (`Inbox.pull`):

- a message that answers none of the ids the caller waits for (one a node sent unasked, or a
  late reply) is ignored without pulling its objects (logged; its objects let go);
- each awaited reply's objects are pulled in a thread of its own, with `pull_objects`' own bounds
  set to the caller's deadline (`max_time`) and a backoff of at most 1 s, so the caller never
  waits on one reply: a node that announces a reply and never uploads it (or uploads it slowly)
  has it counted missing at the deadline, whatever the other replies do, and however many nodes
  stall, no honest reply waits behind theirs (a thread per message the server sent and awaits:
  as many as a round's clients, or at identify the nodes);
- a reply that does not decode is dropped, as its node's fault (`Pulled.why`).

Any other grid (the in-process one of the tests) is pulled through its own `pull_messages`,
an id at a time once a batch raises. Pushes are guarded too: a push that raises, or a message
the SuperLink does not take, is logged and left unanswered (its client counts as missing).
Written against Flower RELEASE's HttpGrid (its `_runtime_client`, `node` and `_run`); another
version is refused before the run starts (`Inbox`, in one line).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from flwr.app import Message
from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest  # pylint: disable=E0611
from flwr.proto.runtime_pb2 import PullAppMessagesRequest  # pylint: disable=E0611
from flwr.serverapp import Grid
from flwr.supercore.inflatable.inflatable_object import iterate_object_tree
from flwr.supercore.inflatable.inflatable_protobuf_utils import make_pull_object_fn_protobuf
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents, pull_objects
from flwr.superlink.grid.http_grid import HttpGrid

from incofl.config import ConfigError
from incofl.deploy.flower import QUICK, QUICK_CAP, mismatch

log = logging.getLogger("incofl.deploy")
BACKOFF = 1.0  # seconds: the longest wait between two tries of an object not yet uploaded (Flower's: 10)


@dataclass(frozen=True)
class Pulled:
    """A reply to the message `answers`, from the node its header names: the message, or why there is none."""

    answers: str
    node: int
    message: Message | None = None
    why: str = ""


def one_line(err: BaseException, typed: bool = True) -> str:
    """An exception in one short line: its message's first line, after its type's name (`typed`)."""
    text = str(err).strip().splitlines()
    what = text[0][:300] if text else ""
    return f"{type(err).__name__}: {what}" if typed else what


class ReplyTooLarge(Exception):
    """A reply past the bytes its plan allows: not pulled further."""


def capped(pull: Callable[[str], bytes], cap: int) -> Callable[[str], bytes]:
    """`pull` (an object's bytes by its id), raising ReplyTooLarge once the objects pulled through
    it add up to more than `cap` bytes (pull_objects then stops every pull of the reply)."""
    lock, pulled = threading.Lock(), [0]

    def pull_within(object_id: str) -> bytes:
        content = pull(object_id)
        with lock:
            pulled[0] += len(content)
            if pulled[0] > cap:
                raise ReplyTooLarge(f"its reply passed the {cap} bytes its plan allows: not pulled further")
        return content

    return pull_within


class Inbox:
    """Guarded pushes and pulls on `grid` (module docstring); a reply pulled no further than
    `small` bytes unless its caller gives it a cap of its own. An HttpGrid of another Flower than
    the adapter's is refused in one line (a ConfigError)."""

    def __init__(self, grid: Grid, small: int):
        self.grid, self.small, self.http = grid, small, isinstance(grid, HttpGrid)
        if self.http and (why := mismatch()):
            raise ConfigError(f"incofl's ServerApp: {why}")
        self.fetching: dict[str, Future[Pulled]] = {}  # awaited id -> its reply's objects being pulled

    def push(self, messages: list[Message]) -> dict[str, int]:
        """message id -> index in `messages`, of those the SuperLink took (module docstring)."""
        if not messages:
            return {}
        try:
            ids = list(self.grid.push_messages(messages))
        except Exception as err:  # noqa: BLE001 (a failed push leaves its clients missing, never stops the run)
            log.warning("%d message(s) could not be sent: %s", len(messages), one_line(err))
            return {}
        taken = {message_id: i for i, message_id in enumerate(ids) if message_id}
        for i in set(range(len(messages))) - set(taken.values()):
            log.warning("the SuperLink did not take the message to node %d", messages[i].metadata.dst_node_id)
        return taken

    def pull(self, awaited: Collection[str], deadline: float, caps: Mapping[str, int] | None = None) -> list[Pulled]:
        """The replies to `awaited` ids that are in (decoded, or why not), none of any other id; each
        pulled no further than its cap in bytes (`caps`, else `small`)."""
        if not awaited:
            return []
        if not self.http:
            return self._pull_other(set(awaited))
        caps = {i: (caps or {}).get(i, self.small) for i in awaited}
        self._announce({i for i in awaited if i not in self.fetching}, caps, deadline)
        done = [i for i, future in self.fetching.items() if future.done()]
        return [self.fetching.pop(i).result() for i in done]

    def arrivals(
        self,
        waiting: Iterable[str],
        deadline: float,
        caps: Mapping[str, int] | None = None,
        more: Callable[[], Iterable[str]] | None = None,
        until: Callable[[], bool] | None = None,
    ) -> Iterator[Pulled]:
        """The replies to the messages `waiting` (their ids), each as it arrives (or why it cannot be
        read), each pulled no further than its cap (`pull`), until every one came or `deadline`
        passed, however long a reply takes to upload; with `more`, the ids it returns are awaited too
        (asked before each pull: identify's newly joined nodes); with `until`, it ends once that holds
        after a pull's replies were all yielded (never within one pull's batch). Pulled
        after QUICK seconds doubling to QUICK_CAP, QUICK again after each reply (the others are
        likely close behind): each pull is a request to the SuperLink, whose CPU a round's nodes
        share (docs/performance.md, Flower). The ids still awaited at the end are forgotten."""
        waiting, wait = set(waiting), QUICK
        try:
            while True:
                waiting |= set(more()) if more is not None else set()
                for got in self.pull(waiting, deadline, caps):
                    waiting.discard(got.answers)
                    wait = QUICK
                    yield got
                if (not waiting and more is None) or (until and until()) or time.monotonic() >= deadline:
                    return
                time.sleep(wait)
                wait = min(2 * wait, QUICK_CAP)
        finally:
            self.forget(waiting)

    def forget(self, awaited: Collection[str]) -> None:
        """Stop waiting for these ids (their deadline passed): a pull still running ends by its own bound."""
        for message_id in awaited:
            self.fetching.pop(message_id, None)

    def _announce(self, ask: set[str], awaited: Mapping[str, int], deadline: float) -> None:
        """Ask the SuperLink for the replies to `ask`; start pulling the objects of each awaited one."""
        grid: Any = self.grid
        try:
            res = grid._runtime_client.PullMessages(PullAppMessagesRequest(message_ids=sorted(ask)))
        except Exception as err:  # noqa: BLE001 (the SuperLink unreachable for a moment: asked again next time)
            log.warning("pulling replies failed (asked again): %s", one_line(err))
            return
        for proto, tree in zip(res.messages_list, res.message_object_trees, strict=False):
            answers, node = proto.metadata.reply_to_message_id, proto.metadata.src_node_id
            if answers not in awaited or answers in self.fetching:
                log.warning("node %d: a message that answers nothing the server waits for: ignored", node)
                self._confirm(proto.metadata.message_id)
                continue
            self.fetching[answers] = self._start(proto, tree, deadline, awaited[answers])

    def _start(self, proto: Any, tree: Any, deadline: float, cap: int) -> Future[Pulled]:
        """A reply's objects pulled in a thread of its own (module docstring), ended by the deadline
        (daemon: a ServerApp that ends does not wait for a stalled node's)."""
        future: Future[Pulled] = Future()
        work = threading.Thread(
            target=lambda: future.set_result(self._fetch(proto, tree, deadline, cap)), name="incofl-pull", daemon=True
        )
        work.start()
        return future

    def _fetch(self, proto: Any, tree: Any, deadline: float, cap: int) -> Pulled:
        """One reply's objects, pulled within the deadline and its cap, and decoded (never raises)."""
        grid: Any = self.grid
        message_id = proto.metadata.message_id
        answers, node = proto.metadata.reply_to_message_id, proto.metadata.src_node_id
        pull = capped(make_pull_object_fn_protobuf(grid._runtime_client.PullObject, grid.node, grid._run.run_id), cap)
        try:
            ids = [t.object_id for t in iterate_object_tree(tree)]
            left = max(deadline - time.monotonic(), 0.1)
            contents = pull_objects(ids, pull, max_time=left, initial_backoff=0.2, backoff_cap=BACKOFF)
        except ReplyTooLarge as err:
            self._confirm(message_id)
            return Pulled(answers, node, why=str(err))
        except Exception as err:  # noqa: BLE001 (not uploaded by the deadline, or not there)
            self._confirm(message_id)
            return Pulled(answers, node, why=f"its reply was not uploaded in time ({one_line(err)})")
        self._confirm(message_id)
        try:
            message = inflate_object_from_contents(message_id, contents)
            if not isinstance(message, Message):
                raise TypeError(f"a {type(message).__name__}, not a message")
            meta = message.metadata  # its own bytes: they must say what the SuperLink checked it against
            if (meta.reply_to_message_id, meta.src_node_id) != (answers, node):
                raise ValueError("its header is not the one it was announced with")
        except Exception as err:  # noqa: BLE001 (bytes Flower cannot decode: the node's fault)
            return Pulled(answers, node, why=f"its reply does not decode ({one_line(err)})")
        message.metadata.__dict__["_message_id"] = message_id  # as HttpGrid.pull_messages sets it
        return Pulled(answers, node, message)

    def _confirm(self, message_id: str) -> None:
        """Let the SuperLink drop a message's objects (best effort)."""
        grid: Any = self.grid
        request = ConfirmMessageReceivedRequest(node=grid.node, run_id=grid._run.run_id, message_object_id=message_id)
        try:
            grid._runtime_client.ConfirmMessageReceived(request)
        except Exception as err:  # noqa: BLE001
            log.debug("confirming message %s failed: %s", message_id[:12], one_line(err))

    def _pull_other(self, awaited: set[str]) -> list[Pulled]:
        """Another grid's pull_messages, an id at a time once a batch raises."""
        try:
            messages = list(self.grid.pull_messages(sorted(awaited)))
        except Exception:  # noqa: BLE001 (one reply that does not decode must not take the others with it)
            messages = []
            for message_id in sorted(awaited):
                try:
                    messages += list(self.grid.pull_messages([message_id]))
                except Exception as err:  # noqa: BLE001
                    messages.append(Pulled(message_id, -1, why=f"its reply does not decode ({one_line(err)})"))
        return [m if isinstance(m, Pulled) else self._of(m) for m in messages if self._answers(m) in awaited]

    @staticmethod
    def _answers(m: Message | Pulled) -> str:
        return m.answers if isinstance(m, Pulled) else m.metadata.reply_to_message_id

    @staticmethod
    def _of(message: Message) -> Pulled:
        return Pulled(message.metadata.reply_to_message_id, message.metadata.src_node_id, message)
