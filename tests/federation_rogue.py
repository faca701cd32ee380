"""A node that speaks Flower's protocol itself, with a key the operator registered: Flower 1.42's
own Fleet connection (`flwr.supernode.fleet_http_connection.http_request_response`, what
`flower-supernode` runs), driven by hand instead of by a SuperNode's loop, to send what no
incofl node would: a reply whose bytes Flower cannot decode but whose hash, header and length
the SuperLink accepts, a reply announced but never uploaded, and a message to the SuperLink itself
that answers nothing (its Runtime API hands those to the ServerApp on every pull), never uploaded."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from flwr.app import ConfigRecord, Message, Metadata, RecordDict
from flwr.app.message import make_message
from flwr.supercore.inflatable.inflatable_object import (
    add_header_to_object_body,
    get_all_nested_objects,
    get_object_id,
    get_object_tree,
)
from flwr.supernode.fleet_http_connection import http_request_response


@dataclass
class Rogue:
    """One registered node in a thread: once it is asked identify, it answers with `kind`
    (`undecodable` or `stalled`; `unasked`: it sends the SuperLink a message of its own instead),
    then holds its connection (heartbeats) until `stop`."""

    address: str
    ca: bytes
    key: Path
    kind: str
    node: int = 0
    answered: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    error: list[BaseException] = field(default_factory=list)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        try:
            private = serialization.load_ssh_private_key(self.key.read_bytes(), password=None)
            keys: Any = (private, private.public_key())
            with http_request_response(self.address, False, self.ca, keys) as (node, receive, send, *rest):
                self.node = node
                push_object = rest[3]
                asked = self._asked(receive)
                if asked is not None:
                    self._answer(asked, send, push_object)
                self.stop.wait()
        except BaseException as err:  # noqa: BLE001 (the test reports it)
            self.error.append(err)

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
        reply = Message(RecordDict({"node": ConfigRecord({"client": 0, "test_sha256": ""})}), reply_to=asked)
        contents = {i: o.deflate() for i, o in get_all_nested_objects(reply).items()}
        tree, message_id = get_object_tree(reply), reply.object_id
        if self.kind == "undecodable":  # a valid head and length, a body that is no protobuf
            bad = add_header_to_object_body(object_body=b"\xff" * 16, obj=reply)
            contents.pop(message_id)
            message_id = tree.object_id = get_object_id(bad)
            contents[message_id] = bad
        reply.metadata.__dict__["_message_id"] = message_id
        wanted, session = send(reply, tree, 0.0)
        if self.kind == "undecodable":
            for object_id in wanted:
                push_object(asked.metadata.run_id, session, object_id, contents[object_id])
        self.answered.set()  # "stalled": announced, and not one of its objects ever pushed
