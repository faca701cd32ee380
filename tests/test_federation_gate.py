"""The Fleet gate of incofl's SuperLink (deploy/superlink.py) in front of Flower's own SuperLink
app, in this process: its real FastAPI app and in-memory state (a run, a registered node, a
message the server sent it), a node that speaks Flower's Fleet API itself with Flower's own
client (FleetHttpClient, its requests signed with the node's key). Fast: nothing is started."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

if not os.environ.get("CI"):
    pytest.importorskip("flwr", reason="the flower extra is not installed (pip install -e '.[flower]')")

MIB = 1 << 20
Edit = Callable[[list[tuple[str, str]]], list[tuple[str, str]]]  # a request's headers, as sent -> as edited
KEY = "flwr-public-key"


@dataclass
class Edited:
    """An interceptor of Flower's Fleet client after its signing one: the headers as `edit` makes them."""

    edit: Edit

    def intercept(self, context: Any, call_next: Any) -> Any:
        headers = context.request.headers
        context.request.headers = type(headers)(self.edit(list(headers.multi_items())))
        return call_next(context)


def gate_of(app: Any, max_message: int = 16 * MIB) -> Any:
    """The gate in front of `app`, a reply of a node capped at `max_message`."""
    from incofl.deploy.server.gate import FleetGate

    return FleetGate(app, max_message)


def spied(app: Any, seen: list[str]) -> Any:
    """`app`, with the path of each request it sees appended to `seen`."""

    async def spy(scope: dict, receive: Any, send: Any) -> None:
        seen.append(scope["path"])
        await app(scope, receive, send)

    return spy


@dataclass
class Node:
    """A registered node of a running run, and the message the server sent it."""

    app: Any
    state: Any
    key: Any
    node_id: int
    run_id: int
    instruction: Any

    def client(self, gate: Any, claims: Any = None, edit: Edit | None = None) -> Any:
        """Flower's Fleet client, signed with the node's key (claiming `claims`' public key, by
        default its own), talking to `gate` in this process; each request's headers, once signed,
        as `edit` makes them."""
        from flwr.supernode.fleet_http_client import FleetHttpClient
        from flwr.supernode.node_auth_http_interceptor import NodeAuthHttpInterceptor
        from starlette.testclient import TestClient

        interceptors = [NodeAuthHttpInterceptor(self.key, (claims or self.key).public_key())]
        fleet = FleetHttpClient("http://testserver", interceptors=[*interceptors, *([Edited(edit)] if edit else [])])
        fleet._client.close()
        fleet._client = TestClient(gate)  # its transport: the ASGI app in this process, not a socket
        return fleet


@pytest.fixture
def node() -> Node:
    from cryptography.hazmat.primitives.asymmetric import ec
    from flwr.app import ConfigRecord, Message, RecordDict
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.superlink.federation.noop_federation_manager import NOOP_FEDERATION_ID
    from flwr.superlink.main import create_app

    app = create_app()  # Flower's SuperLink app: Fleet, Control and Runtime routes, in-memory state
    state = app.state.linkstate_factory.state()
    key = ec.generate_private_key(ec.SECP384R1())
    node_id = state.create_node("operator", "site", public_key_to_bytes(key.public_key()), 60)
    assert state.activate_node(node_id, 60)
    run_id = state.create_run(None, None, None, {}, NOOP_FEDERATION_ID, None, None, "flwr-serverapp")
    task = state.get_run_info(run_ids=[run_id])[0].primary_task_id
    assert state.claim_task(task) and state.activate_task(task)  # the run's ServerApp started: the run runs
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, 1, task  # the ServerApp's message
    instruction = Message(RecordDict({"c": ConfigRecord({"lr": 0.1})}), dst_node_id=node_id, message_type="train")
    instruction.metadata.__dict__["_message_id"] = instruction.object_id
    assert state.store_message_ins(instruction)
    TaskIdentity.node_id = node_id
    return Node(app, state, key, node_id, run_id, instruction)


@dataclass
class Pushed:
    """A reply to the node's message, announced: what Flower asked for and the objects' bytes."""

    asked: Any
    objects: dict[str, bytes]
    status: int = 200


def reply_of(node: Node, megabytes: int, fill: int = 0) -> Any:
    """A reply to the node's message holding `megabytes` of float32 arrays (8 MiB each, of `fill` + i)."""
    import numpy as np
    from flwr.app import Array, ArrayRecord, Message, RecordDict

    arrays = {f"w{i}": Array(np.full(2 * MIB, fill + i, dtype=np.float32)) for i in range(megabytes // 8)}
    reply = Message(RecordDict({"update": ArrayRecord(arrays)}), reply_to=node.instruction)
    reply.metadata.__dict__["_message_id"] = reply.object_id
    return reply


def announce(node: Node, fleet: Any, reply: Any) -> Pushed:
    """The reply pushed as a SuperNode pushes one (its message and tree first): what Flower asked for."""
    from flwr.app.message import remove_content_from_message
    from flwr.common.serde import message_to_proto
    from flwr.proto.fleet_pb2 import PushMessagesRequest
    from flwr.proto.node_pb2 import Node as NodeProto
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree

    proto = message_to_proto(remove_content_from_message(reply))
    request = PushMessagesRequest(node=NodeProto(node_id=node.node_id), messages_list=[proto])
    request.message_object_trees.append(get_object_tree(reply))
    objects = {oid: obj.deflate() for oid, obj in get_all_nested_objects(reply).items()}
    try:
        return Pushed(fleet.PushMessages(request), objects)
    except Exception as err:  # noqa: BLE001 (httpx's or httpx2's HTTPStatusError, as the transport raises it)
        return Pushed(None, objects, err.response.status_code)  # type: ignore[attr-defined]


def push_objects(node: Node, fleet: Any, pushed: Pushed, content: Any = None) -> list[int]:
    """Each object Flower asked for, pushed (its bytes, or `content(oid)`): each one's HTTP status."""
    from flwr.proto.message_pb2 import PushObjectRequest
    from flwr.proto.node_pb2 import Node as NodeProto

    statuses = []
    for oid in pushed.asked.objects_to_push:
        push = PushObjectRequest(node=NodeProto(node_id=node.node_id), run_id=node.run_id, object_id=oid)
        push.session_id = pushed.asked.session_id
        push.object_content = pushed.objects[oid] if content is None else content(oid)
        statuses.append(status_of(fleet.PushObject, push))
    return statuses


def status_of(call: Any, request: Any) -> int:
    try:
        call(request)
    except Exception as err:  # noqa: BLE001 (httpx's or httpx2's HTTPStatusError)
        return err.response.status_code  # type: ignore[attr-defined]
    return 200


def stored(node: Node, *pushes: Pushed) -> int:
    """The bytes Flower holds of the objects these pushes were asked for."""
    ids = {oid for pushed in pushes for oid in pushed.asked.objects_to_push}
    return sum(len(node.state.object_store.get(oid) or b"") for oid in ids)


def push_reply(node: Node, fleet: Any, megabytes: int) -> tuple[list[int], int]:
    """A reply of `megabytes` pushed whole: each object's HTTP status, and the bytes Flower stored."""
    pushed = announce(node, fleet, reply_of(node, megabytes))
    return push_objects(node, fleet, pushed), stored(node, pushed)


def test_a_reply_is_refused_past_the_message_cap_and_flower_stores_no_more(node):
    """40 MiB of arrays answering the server's message, through a gate capped at 16 MiB a reply:
    the objects that would take it past 16 MiB are refused (413) and Flower stores at most 16 MiB;
    straight to Flower's app (no gate: Flower 1.42 as it is), it stores all 40."""
    statuses, held = push_reply(node, node.client(gate_of(node.app, 16 * MIB)), 40)
    assert statuses[:2] == [200] * 2 and statuses.count(413) >= 3 and held <= 16 * MIB


def test_a_reply_is_budgeted_once_whatever_the_node_pushes_again(node):
    """Issue 57: the budget was re-armed on every 200 to a push, so that a re-push of the node's own
    reply (a retry to Flower) or of another reply to the same message stored 40 MiB through a gate
    capped at 16. Now (issue 64) a re-push of its own reply once objects of it are stored is 403, as
    is another tree answering the same message (and Flower never sees them: no rows for their objects)."""
    fleet = node.client(gate_of(node.app, 16 * MIB))
    reply = reply_of(node, 40)
    first = announce(node, fleet, reply)
    assert push_objects(node, fleet, first).count(413) >= 3
    again = announce(node, fleet, reply)  # Flower would take it as a retry and ask for what it lacks
    assert again.status == 403 and again.asked is None
    other = announce(node, fleet, reply_of(node, 16, fill=100))
    assert other.status == 403 and other.asked is None
    assert stored(node, first) <= 16 * MIB


def test_a_peer_without_a_key_changes_no_budget(node):
    """Issue 57: objects were charged before Flower authenticated them and without checking their
    bytes, so that junk pushed under a reply's object ids by a peer Flower answers 401 emptied that
    reply's budget. Now a content that is not what its id hashes is 403 unread by Flower, a push by a
    key Flower refuses (401: not the key of the node the request names) is charged nothing, and the
    honest node pushes its whole reply."""
    from cryptography.hazmat.primitives.asymmetric import ec

    gate = gate_of(node.app, 9 * MIB)  # room for the reply's 8 MiB, not for junk beside it
    pushed = announce(node, node.client(gate), reply_of(node, 8))
    stranger = Node(**{**node.__dict__, "key": ec.generate_private_key(ec.SECP384R1())})  # registered nowhere
    assert set(push_objects(stranger, stranger.client(gate), pushed, content=lambda oid: bytes(MIB))) == {403}
    assert set(push_objects(stranger, stranger.client(gate), pushed)) == {401}  # the right bytes: not its key
    impostor = stranger.client(gate, claims=node.key)  # the node's public key claimed, signed with another
    assert set(push_objects(stranger, impostor, pushed)) == {401}  # Flower's refusal: nothing charged
    assert set(push_objects(node, node.client(gate), pushed)) == {200} and stored(node, pushed) > 8 * MIB


def test_pushes_flower_refuses_leave_no_entry_and_evict_nothing(node):
    """Issue 57: every 200 to a push made a budget entry, Flower's refusals too (it answers 200 and
    asks for nothing), and 4,097 of them evicted an honest reply still uploading. Now only a reply
    Flower stored has an entry; a node's refused pushes, more than the replies it may hold, leave its
    honest reply's objects accepted."""
    from flwr.app import ConfigRecord, Message, RecordDict

    from incofl.deploy.server.gate import REPLIES_PER_NODE

    gate = gate_of(node.app, 16 * MIB)
    fleet = node.client(gate)
    honest = announce(node, fleet, reply_of(node, 8))
    for i in range(REPLIES_PER_NODE + 1):  # replies to messages the server never sent this node
        stray = Message(RecordDict({"c": ConfigRecord({"i": i})}), dst_node_id=node.node_id, message_type="train")
        stray.metadata.__dict__["_message_id"] = stray.object_id
        answer = Message(RecordDict({"c": ConfigRecord({"i": i})}), reply_to=stray)
        answer.metadata.__dict__["_message_id"] = answer.object_id
        refused = announce(node, fleet, answer)
        assert refused.status != 200 or not refused.asked.objects_to_push  # Flower stored nothing
    assert sum(len(replies) for replies in gate.ledger.replies.values()) == 1
    assert set(push_objects(node, fleet, honest)) == {200}


def test_bodies_past_the_caps_are_refused_as_they_arrive_chunked_or_not(node):
    """A push of messages may hold what a tree of MAX_OBJECTS objects takes, no more (a million empty
    children, 1.9 MiB, held the loop 3.3 s when counted to the end), any route's body its route's cap;
    a body sent in chunks, without a Content-Length, is cut off at the cap as one with it is."""
    from starlette.testclient import TestClient

    from incofl.deploy.flower.fleet import PUSH_CAP, route_caps

    gate = TestClient(gate_of(node.app, 16 * MIB))
    protobuf = {"content-type": "application/protobuf"}
    assert route_caps()["/v1/fleet/push-messages"] == PUSH_CAP
    for path, cap in route_caps().items():
        step = min(cap, 1 << 16)
        sized = gate.post(path, content=bytes(cap + 1), headers=protobuf)
        chunked = gate.post(path, content=(bytes(step) for _ in range(cap // step + 1)), headers=protobuf)
        assert sized.status_code == chunked.status_code == 413, path
        assert "transfer-encoding" not in sized.request.headers and chunked.request.headers["transfer-encoding"]


def test_a_reply_tree_is_counted_no_further_than_its_cap(node):
    """A tree of more objects than MAX_OBJECTS, within the body cap, is 413; its count stops at the cap + 1."""
    from flwr.proto.message_pb2 import ObjectTree

    from incofl.deploy.flower.fleet import MAX_OBJECTS
    from incofl.deploy.server.gate import count, read

    wide = ObjectTree(object_id="a" * 64)
    wide.children.extend(ObjectTree() for _ in range(3 * MAX_OBJECTS))
    assert count(wide, MAX_OBJECTS + 1) == MAX_OBJECTS + 1 and count(wide, 10**9) == 3 * MAX_OBJECTS + 1
    reply = reply_of(node, 8)
    from flwr.app.message import remove_content_from_message
    from flwr.common.serde import message_to_proto
    from flwr.proto.fleet_pb2 import PushMessagesRequest
    from flwr.proto.node_pb2 import Node as NodeProto

    proto = message_to_proto(remove_content_from_message(reply))
    request = PushMessagesRequest(node=NodeProto(node_id=node.node_id), messages_list=[proto])
    request.message_object_trees.append(wide)
    assert read("/v1/fleet/push-messages", request.SerializeToString()) == (
        413,
        f"a reply of over {MAX_OBJECTS} objects",
    )


def test_without_the_gate_flower_stores_the_whole_reply(node):
    statuses, stored = push_reply(node, node.client(node.app), 40)
    assert set(statuses) == {200} and stored > 40 * MIB


def test_the_gate_serves_the_fleet_routes_only_and_refuses_a_body_over_its_cap_unread(node):
    from starlette.testclient import TestClient

    from incofl.deploy.flower.fleet import route_caps

    gate = TestClient(gate_of(node.app, 16 * MIB))
    for path in ("/v1/control/list-runs", "/v1/runtime/acquire-task", "/docs", "/v1/fleet/../control/start-run"):
        assert gate.post(path, content=b"").status_code == 404, path
    assert gate.get("/v1/fleet/pull-messages").status_code == 404  # POST only
    cap = route_caps()["/v1/fleet/push-object"]
    big = gate.post("/v1/fleet/push-object", content=bytes(cap + 1), headers={"content-type": "application/protobuf"})
    assert (big.status_code, big.json()) == (413, {"detail": f"a request body over {cap} bytes"})


def test_a_finished_runs_messages_and_objects_are_pruned(node):
    """Issue 57: Flower 1.42 cleans a finished run up only when a later request names it, so that a
    reply never pulled stayed in the SuperLink's database. `prune_finished` (every 30 s in
    superlink.py) cleans every finished run; a running one is left as it is."""
    from flwr.common.constant import SubStatus

    from incofl.deploy.flower.link import prune_finished

    pushed = announce(node, node.client(gate_of(node.app, 16 * MIB)), reply_of(node, 8))
    push_objects(node, node.client(node.app), pushed)
    assert prune_finished(node.app) == [] and stored(node, pushed) > 8 * MIB  # running: kept
    task = node.state.get_run_info(run_ids=[node.run_id])[0].primary_task_id
    assert node.state.finish_task(task, SubStatus.COMPLETED, "")
    assert prune_finished(node.app) == [node.run_id]
    assert stored(node, pushed) == 0 and node.state.num_message_ins() == node.state.num_message_res() == 0


def test_a_reply_in_another_nodes_name_is_refused_at_the_gate(node):
    """Flower binds a request to the node its key is registered for, but not the message's `src_node_id`
    (the sender's own bytes): the gate refuses a reply whose header names another node than the request."""
    from flwr.app.message import remove_content_from_message
    from flwr.common.serde import message_to_proto
    from flwr.proto.fleet_pb2 import PushMessagesRequest
    from flwr.proto.node_pb2 import Node as NodeProto
    from flwr.supercore.inflatable.inflatable_object import get_object_tree

    reply = reply_of(node, 8)
    proto = message_to_proto(remove_content_from_message(reply))
    proto.metadata.src_node_id = node.node_id + 1  # another site's node
    request = PushMessagesRequest(node=NodeProto(node_id=node.node_id), messages_list=[proto])
    request.message_object_trees.append(get_object_tree(reply))
    assert status_of(node.client(gate_of(node.app, 16 * MIB)).PushMessages, request) == 403


def test_the_serverapp_stops_pulling_a_reply_past_its_cap():
    """The ServerApp's pull of a reply's objects (Flower's own pull_objects, two at a time) through
    `inbox.capped`: past the cap it raises, and pulls no object after the one that passed it."""
    from flwr.supercore.inflatable.inflatable_utils import pull_objects

    from incofl.deploy.flower.inbox import ReplyTooLarge, capped

    store = {f"{i:064x}": bytes(MIB) for i in range(10)}  # a reply of 10 MiB, 1 MiB an object
    asked: list[str] = []

    def pull(object_id: str) -> bytes:
        asked.append(object_id)
        return store[object_id]

    assert pull_objects(list(store), capped(pull, 10 * MIB)) == store
    asked.clear()
    with pytest.raises(ReplyTooLarge, match=f"passed the {3 * MIB} bytes"):
        pull_objects(list(store), capped(pull, 3 * MIB), max_concurrent_pulls=2)
    assert len(asked) <= 5  # the fourth passed the cap; a fifth may have been asked at the same time


def aliased(b64: str) -> str:
    """The same bytes in another base64 (the unused low bit of its last digit set), which Python's
    `b64decode(validate=True)`, Flower's, takes as it takes the canonical one."""
    import base64
    import string

    digits = string.ascii_uppercase + string.ascii_lowercase + string.digits + "+/"
    body, pad = b64.rstrip("="), b64[len(b64.rstrip("=")) :]
    assert pad, "a length that is a multiple of 3 has one base64 only"
    aliased = body[:-1] + digits[digits.index(body[-1]) ^ 1] + pad
    assert aliased != b64 and base64.b64decode(aliased, validate=True) == base64.b64decode(b64, validate=True)
    return aliased


def heartbeat(node: Node, fleet: Any) -> int:
    from flwr.proto.heartbeat_pb2 import SendNodeHeartbeatRequest
    from flwr.proto.node_pb2 import Node as NodeProto

    return status_of(
        fleet.SendNodeHeartbeat, SendNodeHeartbeatRequest(node=NodeProto(node_id=node.node_id), heartbeat_interval=60)
    )


def test_a_request_with_an_auth_header_twice_is_refused_unread(node):
    """Issue 64: Flower authenticates a request by the first of repeated headers, the gate named its
    node by the last: a registered node re-announced its reply under a second `flwr-public-key`, a
    fresh budget each (1,200 MiB stored against a 512 MiB cap). Now a request with any of Flower's
    three auth headers twice is 400, and Flower never sees it."""
    import base64

    from cryptography.hazmat.primitives.asymmetric import ec
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    seen: list[str] = []
    gate = gate_of(spied(node.app, seen))
    reply = reply_of(node, 40)
    first = announce(node, node.client(gate), reply)
    push_objects(node, node.client(gate), first)  # 16 MiB stored, the rest refused
    another = base64.b64encode(public_key_to_bytes(ec.generate_private_key(ec.SECP384R1()).public_key())).decode()
    twice = node.client(gate, edit=lambda headers: [*headers, (KEY, another)])
    seen.clear()
    again = announce(node, twice, reply)
    assert again.status == 400 and again.asked is None
    assert push_objects(node, twice, first).count(400) == len(first.asked.objects_to_push)
    assert stored(node, first) <= 16 * MIB
    for name in ("flwr-public-key", "flwr-signature", "flwr-timestamp"):
        doubled = node.client(gate, edit=lambda headers, name=name: [*headers, (name.upper(), dict(headers)[name])])
        assert heartbeat(node, doubled) == 400, name
    assert seen == [] and heartbeat(node, node.client(gate)) == 200 and seen


def test_a_node_has_one_budget_whatever_base64_spells_its_key(node):
    """Issue 64: the gate kept a node's replies under its key header as sent, Flower authenticates the
    key that header decodes to: the same key in another base64 was another ledger entry, a budget of
    its own. Now the ledger is keyed by the node Flower authenticates (the request's node id)."""
    gate = gate_of(node.app)
    reply = reply_of(node, 40)
    alias = node.client(gate, edit=lambda headers: [(k, aliased(v) if k == KEY else v) for k, v in headers])
    first = announce(node, node.client(gate), reply)
    again = announce(node, alias, reply)  # before any object of it is stored: a retry
    assert first.status == again.status == 200
    push_objects(node, node.client(gate), again)  # under the session of the last push (Flower's)
    push_objects(node, alias, again)
    assert stored(node, first) <= 16 * MIB


def test_a_reply_once_stored_is_never_stored_again(node):
    """Issue 64: a reply's budget was never re-armed, but a re-push of the same tree passed as a retry
    whenever it came: once the reply's objects were deleted (as the server's confirm that it received
    the reply deletes them), Flower stored them all again. Now a re-push is a retry only while no
    object of the reply is stored (the node lost Flower's answer); after that, a push answering the
    same message is 403 unread."""
    seen: list[str] = []
    gate = gate_of(spied(node.app, seen))
    fleet = node.client(gate)
    reply = reply_of(node, 8)
    first = announce(node, fleet, reply)
    again = announce(node, fleet, reply)  # no object of it stored yet: a retry
    assert first.status == again.status == 200 and again.asked.objects_to_push
    assert set(push_objects(node, fleet, again)) == {200} and stored(node, again) > 8 * MIB
    node.state.object_store.delete(reply.object_id)  # what the server's confirm-message-received does
    assert stored(node, again) == 0
    seen.clear()
    third = announce(node, fleet, reply)
    assert third.status == 403 and third.asked is None and seen == []
    assert announce(node, node.client(node.app), reply).asked.objects_to_push  # Flower itself: stored again


def test_the_gates_routes_are_flowers_fleet_routes_each_with_its_request_and_cap():
    """ROUTES holds each route of Flower 1.42's Fleet router, with the message Flower parses its body
    as; route_caps() (what the edge proxy's configuration is made from) the cap of each."""
    from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE
    from flwr.supercore.protobuf.translation import PROTOBUF_REQUEST_TYPES
    from flwr.superlink.routers.fleet.router import router

    from incofl.deploy.flower.fleet import PUSH_CAP, ROUTES, route_caps
    from incofl.deploy.server.gate import request_of

    paths = {route.path for route in router.routes}
    assert set(ROUTES) == paths == {path for _, path in PROTOBUF_REQUEST_TYPES if path.startswith("/v1/fleet/")}
    assert all(request_of(path) is PROTOBUF_REQUEST_TYPES["POST", path] for path in paths)
    caps = route_caps()
    assert caps == {path: cap for path, (_, cap) in ROUTES.items()} and caps["/v1/fleet/push-messages"] == PUSH_CAP
    assert FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE < caps["/v1/fleet/push-object"] < FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE + MIB
    assert max(cap for path, cap in caps.items() if "push" not in path) <= 4096


def test_a_body_past_its_routes_cap_or_not_its_message_or_a_path_of_no_route_is_refused_unread(node):
    """Issue 64: only the two pushes were parsed by the gate and capped to fit; the other routes took
    any body up to the gate's 8 MiB, which Flower parsed on its event loop (a pull of messages of 8 MiB
    from a peer with no key cost 5 GB). Now a body over its route's cap is 413, one that does not
    parse as its route's message 400, a path of no route 404; Flower sees none of them."""
    from starlette.testclient import TestClient

    from incofl.deploy.flower.fleet import route_caps

    seen: list[str] = []
    gate = TestClient(gate_of(spied(node.app, seen)))
    protobuf = {"content-type": "application/protobuf"}
    for path, cap in route_caps().items():
        assert gate.post(path, content=bytes(cap + 1), headers=protobuf).status_code == 413, path
        assert gate.post(path, content=b"\xff", headers=protobuf).status_code == 400, path
    for path in ("/v1/fleet/", "/v1/fleet/push-object/", "/v1/fleet/pull-messages2", "/v1/fleet/x"):
        assert gate.post(path, content=b"", headers=protobuf).status_code == 404, path
    assert seen == []


def test_what_a_supernode_sends_passes_and_is_parsed_off_the_loop(node, monkeypatch):
    """Each of a SuperNode's calls, as it makes them, reaches Flower through the gate (its cap fits);
    the gate parses every request, and Flower's answers to the two pushes, in a worker thread."""
    import asyncio

    from flwr.proto.fab_pb2 import GetFabRequest
    from flwr.proto.fleet_pb2 import (
        ActivateNodeRequest,
        DeactivateNodeRequest,
        PullMessagesRequest,
        RegisterNodeFleetRequest,
        UnregisterNodeFleetRequest,
    )
    from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest, PullObjectRequest
    from flwr.proto.node_pb2 import Node as NodeProto
    from flwr.proto.run_pb2 import GetRunRequest
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    import incofl.deploy.server.gate as module

    where: list[tuple[str, bool]] = []  # each parse: the message, whether on an event loop

    def parsed(kind: type, body: bytes) -> Any:
        try:
            asyncio.get_running_loop()
            where.append((kind.__name__, True))
        except RuntimeError:
            where.append((kind.__name__, False))
        return real(kind, body)

    real = module.parsed
    monkeypatch.setattr(module, "parsed", parsed)
    seen: list[str] = []
    fleet = node.client(gate_of(spied(node.app, seen)))
    me, key = NodeProto(node_id=node.node_id), public_key_to_bytes(node.key.public_key())
    oid = node.instruction.object_id
    calls = [
        (fleet.RegisterNode, RegisterNodeFleetRequest(public_key=key)),
        (fleet.ActivateNode, ActivateNodeRequest(public_key=key, heartbeat_interval=60)),
        (fleet.PullMessages, PullMessagesRequest(node=me)),
        (fleet.GetRun, GetRunRequest(node=me, run_id=node.run_id)),
        (fleet.GetFab, GetFabRequest(node=me, hash_str="0" * 64, run_id=node.run_id)),
        (fleet.PullObject, PullObjectRequest(node=me, run_id=node.run_id, object_id=oid)),
        (
            fleet.ConfirmMessageReceived,
            ConfirmMessageReceivedRequest(node=me, run_id=node.run_id, message_object_id=oid),
        ),
    ]
    assert heartbeat(node, fleet) == 200
    assert set(push_objects(node, fleet, announce(node, fleet, reply_of(node, 8)))) == {200}  # 5 MiB chunks
    for call, request in calls:  # (the fixture's message has no objects: Flower's pull of it deletes it)
        status_of(call, request)
    status_of(fleet.DeactivateNode, DeactivateNodeRequest(node_id=node.node_id))
    status_of(fleet.UnregisterNode, UnregisterNodeFleetRequest(node_id=node.node_id))
    assert set(seen) == set(module.ROUTES)
    kinds = {module.request_of(path).__name__ for path in module.ROUTES} | {
        "PushMessagesResponse",
        "PushObjectResponse",
    }
    assert {kind for kind, _ in where} == kinds and not any(on_loop for _, on_loop in where)


def test_a_request_not_of_flowers_content_type_is_refused_unread(node):
    """Issue 64: Flower answers a Content-Type other than its protobuf one with an ERROR line a request.
    Now the gate refuses it (415) unless it is exactly Flower's PROTOBUF_MEDIA_TYPE, once; Flower
    never sees it."""
    from flwr.supercore.protobuf.constants import PROTOBUF_MEDIA_TYPE

    from incofl.deploy.flower.fleet import MEDIA_TYPE

    assert MEDIA_TYPE == PROTOBUF_MEDIA_TYPE.encode()
    seen: list[str] = []
    gate = gate_of(spied(node.app, seen))
    others = [
        "application/json",
        "application/x-protobuf",
        f"{PROTOBUF_MEDIA_TYPE}; charset=utf-8",
        "Application/Protobuf",
    ]
    for other in [*others, None, "twice"]:

        def typed(headers: list[tuple[str, str]], other: str | None = other) -> list[tuple[str, str]]:
            kept = [(k, v) for k, v in headers if k != "content-type"]
            if other == "twice":
                return [*headers, ("content-type", PROTOBUF_MEDIA_TYPE)]
            return kept if other is None else [*kept, ("content-type", other)]

        assert heartbeat(node, node.client(gate, edit=typed)) == 415, other
    assert seen == [] and heartbeat(node, node.client(gate)) == 200 and seen


def test_a_push_is_answered_only_once_the_gate_holds_its_budget(node):
    """Flower's app answers through Starlette's BaseHTTPMiddleware, which sends the body in one part
    and then an empty last one: a node has the whole answer to its push from the first part and
    pushes the reply's objects at once. Every byte of an answer to a push (messages or object) must
    therefore reach the node only once the gate has entered what the answer says in its ledger.
    Before, it did so at the last part: under load a node's first object came first and was
    refused (403, "an object of no reply pushed here"), Flower's node dropped its reply, and the
    ServerApp waited for it until its deadline (the stalled identify that edge tests saw in CI)."""
    from incofl.deploy.flower.fleet import PUSH_MESSAGES, PUSH_OBJECT

    gate = gate_of(node.app)
    answers = node.instruction.metadata.message_id
    seen: list[tuple[str, bool, bool]] = []  # (route, a reply's budget entered, an object of it charged)

    async def watching(scope: dict, receive: Any, send: Any) -> None:
        async def watched(message: dict) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                reply = gate.ledger.reply(node.node_id, answers)
                seen.append((scope["path"], reply is not None, reply is not None and reply.stored))
            await send(message)

        await gate(scope, receive, watched)

    fleet = node.client(watching)
    pushed = announce(node, fleet, reply_of(node, 8))
    assert pushed.status == 200 and set(push_objects(node, fleet, pushed)) == {200}
    pushes = [entry for entry in seen if entry[0] in (PUSH_MESSAGES, PUSH_OBJECT)]
    assert pushes[0] == (PUSH_MESSAGES, True, False), seen  # the budget in place before the node has the answer
    assert all(stored for path, _, stored in pushes if path == PUSH_OBJECT), seen  # each object charged first
