"""A node that speaks Flower's protocol itself, with a key the operator registered: Flower 1.42's
own Fleet connection (`flwr.supernode.fleet_http_connection.http_request_response`, what
`flower-supernode` runs), driven by hand instead of by a SuperNode's loop, to send what no
incofl node would: a reply whose bytes Flower cannot decode but whose hash, header and length
the SuperLink accepts, a reply announced but never uploaded, and a message to the SuperLink itself
that answers nothing (its Runtime API hands those to the ServerApp on every pull), never uploaded;
and a site that answers another site's message in that site's name (`Forger`)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from flwr.app import ConfigRecord, Message, Metadata, MetricRecord, RecordDict
from flwr.app.message import make_message
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.inflatable.inflatable_object import (
    add_header_to_object_body,
    get_all_nested_objects,
    get_object_id,
    get_object_tree,
)
from flwr.supernode.fleet_http_connection import http_request_response

from incofl.deploy.wire.codec import sign_reply

SHOWN = threading.local()  # the site certificate this thread's Fleet clients show (`per_thread_certificates`)


def per_thread_certificates(default: tuple[Path, Path]) -> None:
    """Flower's Fleet client, from now on in this process, shows the certificate of the thread that
    makes it (a Peer's own), else `default`."""
    from incofl.deploy.flower.node import shown_certificate

    shown_certificate(lambda: getattr(SHOWN, "certificate", None) or default)


@dataclass
class Peer:
    """A node that speaks Flower's Fleet protocol itself, in a thread, on a connection of its own
    (`key`, registered): `act` on the connection, then hold it (heartbeats) until `stop`."""

    address: str
    ca: bytes
    key: Path
    certificate: tuple[Path, Path] | None = field(default=None, kw_only=True)  # its site's (the sites' port asks)
    stop: threading.Event = field(default_factory=threading.Event, kw_only=True)
    error: list[BaseException] = field(default_factory=list, kw_only=True)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        try:
            SHOWN.certificate = self.certificate
            private = serialization.load_ssh_private_key(self.key.read_bytes(), password=None)
            keys: Any = (private, private.public_key())
            with http_request_response(self.address, False, self.ca, keys) as (node, receive, send, *rest):
                self.act(node, receive, send, rest[3])
                self.stop.wait()
        except BaseException as err:  # noqa: BLE001 (the test reports it)
            self.error.append(err)

    def act(self, node: int, receive: Any, send: Any, push_object: Any) -> None:
        raise NotImplementedError


@dataclass
class Rogue(Peer):
    """Once it is asked identify, it answers with `kind` (`undecodable`, `oversized` or `stalled`;
    `unasked`: it sends the SuperLink a message of its own instead)."""

    kind: str
    node: int = 0
    answered: threading.Event = field(default_factory=threading.Event)

    def act(self, node: int, receive: Any, send: Any, push_object: Any) -> None:
        self.node = node
        asked = self._asked(receive)
        if asked is not None:
            self._answer(asked, send, push_object)

    def _asked(self, receive: Any) -> Message | None:
        """The server's identify, once it comes."""
        while not self.stop.is_set():
            got = receive()
            if got is not None:
                return got[0]
            time.sleep(0.2)
        return None

    def _answer(self, asked: Message, send: Any, push_object: Any) -> None:
        if self.kind == "unasked":
            meta = asked.metadata
            own = Metadata(meta.run_id, "", 1, 1, "", "", time.time(), 3600.0, "query.hello")  # src 1: Flower's rule
            message = make_message(metadata=own, content=RecordDict({"x": ConfigRecord({"x": 1})}))
            message.metadata.__dict__["_message_id"] = message.object_id
            send(message, get_object_tree(message), 0.0)  # and not one of its objects pushed
            self.answered.set()
            return
        claim = {"client": 0, "test_sha256": ""}
        if (
            self.kind == "oversized"
        ):  # past what an identify reply may be (incofl.deploy.REPLY_OVERHEAD), within the gate's caps
            claim["pad"] = bytes(2 << 20)
        reply = Message(RecordDict({"node": ConfigRecord(claim)}), reply_to=asked)
        contents = {i: o.deflate() for i, o in get_all_nested_objects(reply).items()}
        tree, message_id = get_object_tree(reply), reply.object_id
        if self.kind == "undecodable":  # a valid head and length, a body that is no protobuf
            bad = add_header_to_object_body(object_body=b"\xff" * 16, obj=reply)
            contents.pop(message_id)
            message_id = tree.object_id = get_object_id(bad)
            contents[message_id] = bad
        reply.metadata.__dict__["_message_id"] = message_id
        wanted, session = send(reply, tree, 0.0)
        if self.kind in ("undecodable", "oversized"):
            for object_id in wanted:
                push_object(asked.metadata.run_id, session, object_id, contents[object_id])
        self.answered.set()  # "stalled": announced, and not one of its objects ever pushed


@dataclass
class Forger(Peer):
    """Site A: once it knows the header of site B's train message (`asked`, JSON: its id, B's node,
    the run, the round, when it was made and its ttl), it answers that message in B's name (B's
    node as its source), signed with A's site key (`site_key`) as B's client (`client`), and writes
    `forged`. Its update is no update: the server must refuse it before reading any."""

    site_key: Path
    client: int
    asked: Path
    forged: Path

    def act(self, node: int, receive: Any, send: Any, push_object: Any) -> None:
        while not self.asked.exists() and not self.stop.wait(0.1):
            pass
        if self.asked.exists():
            self._forge(json.loads(self.asked.read_text()), send, push_object)

    def _forge(self, asked: dict[str, Any], send: Any, push_object: Any) -> None:
        site = serialization.load_ssh_private_key(self.site_key.read_bytes(), password=None)
        run, round_, answers = asked["run"], asked["round"], asked["message"]
        content = RecordDict({"metrics": MetricRecord({"num_samples": 1})})
        content = sign_reply(content, site, run, round_, self.client, answers, "train")
        now = time.time()
        ttl = asked["created_at"] + asked["ttl"] - now - 1  # within the message's: Flower checks it
        meta = Metadata(run, "", asked["node"], SUPERLINK_NODE_ID, answers, str(round_), now, ttl, "train")
        reply = make_message(metadata=meta, content=content)
        reply.metadata.__dict__["_message_id"] = reply.object_id
        contents = {i: o.deflate() for i, o in get_all_nested_objects(reply).items()}
        wanted, session = send(reply, get_object_tree(reply), 0.0)
        for object_id in wanted:
            push_object(run, session, object_id, contents[object_id])
        self.forged.write_text(reply.object_id)
