"""The Fleet gate of incofl's SuperLink (deploy/superlink.py) in front of Flower's own SuperLink
app, in this process: its real FastAPI app and in-memory state (a run, a registered node, a
message the server sent it), a node that speaks Flower's Fleet API itself with Flower's own
client (FleetHttpClient, its requests signed with the node's key). Fast: nothing is started."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest

if not os.environ.get("CI"):
    pytest.importorskip("flwr", reason="the flower extra is not installed (pip install -e '.[flower]')")

MIB = 1 << 20


@dataclass
class Node:
    """A registered node of a running run, and the message the server sent it."""

    app: Any
    state: Any
    key: Any
    node_id: int
    run_id: int
    instruction: Any

    def client(self, gate: Any) -> Any:
        """Flower's Fleet client, signed with the node's key, talking to `gate` in this process."""
        from flwr.supernode.fleet_http_client import FleetHttpClient
        from flwr.supernode.node_auth_http_interceptor import NodeAuthHttpInterceptor
        from starlette.testclient import TestClient

        fleet = FleetHttpClient(
            "http://testserver", interceptors=[NodeAuthHttpInterceptor(self.key, self.key.public_key())]
        )
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


def push_reply(node: Node, fleet: Any, megabytes: int) -> tuple[list[int], int]:
    """A reply to the node's message holding `megabytes` of float32 arrays, pushed as a SuperNode
    pushes one (the message, then each object Flower asks for): each object's HTTP status, and
    the bytes of the reply that Flower stored."""
    import numpy as np
    from flwr.app import Array, ArrayRecord, Message, RecordDict
    from flwr.app.message import remove_content_from_message
    from flwr.common.serde import message_to_proto
    from flwr.proto.fleet_pb2 import PushMessagesRequest
    from flwr.proto.message_pb2 import PushObjectRequest
    from flwr.proto.node_pb2 import Node as NodeProto
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree

    arrays = {f"w{i}": Array(np.full(2 * MIB, i, dtype=np.float32)) for i in range(megabytes // 8)}  # 8 MiB each
    reply = Message(RecordDict({"update": ArrayRecord(arrays)}), reply_to=node.instruction)
    reply.metadata.__dict__["_message_id"] = reply.object_id
    me = NodeProto(node_id=node.node_id)
    request = PushMessagesRequest(node=me, messages_list=[message_to_proto(remove_content_from_message(reply))])
    request.message_object_trees.append(get_object_tree(reply))
    asked = fleet.PushMessages(request)
    objects, statuses = get_all_nested_objects(reply), []
    for oid in asked.objects_to_push:
        push = PushObjectRequest(node=me, run_id=node.run_id, session_id=asked.session_id, object_id=oid)
        push.object_content = objects[oid].deflate()
        try:
            fleet.PushObject(push)
            statuses.append(200)
        except Exception as err:  # noqa: BLE001 (httpx's or httpx2's HTTPStatusError, as the transport raises it)
            statuses.append(err.response.status_code)  # type: ignore[attr-defined]
    stored = sum(len(node.state.object_store.get(oid) or b"") for oid in asked.objects_to_push)
    return statuses, stored


def test_a_reply_is_refused_past_the_message_cap_and_flower_stores_no_more(node):
    """40 MiB of arrays answering the server's message, through a gate capped at 16 MiB a reply:
    the objects that would take it past 16 MiB are refused (413) and Flower stores at most 16 MiB;
    straight to Flower's app (no gate: Flower 1.42 as it is), it stores all 40."""
    from incofl.deploy.superlink import FleetGate

    statuses, stored = push_reply(node, node.client(FleetGate(node.app, 8 * MIB, 16 * MIB)), 40)
    assert statuses[:4] == [200] * 4 and 413 in statuses and stored <= 16 * MIB
    assert set(statuses[statuses.index(413) :]) == {413}  # the rest, once over


def test_without_the_gate_flower_stores_the_whole_reply(node):
    statuses, stored = push_reply(node, node.client(node.app), 40)
    assert set(statuses) == {200} and stored > 40 * MIB


def test_the_gate_serves_the_fleet_routes_only_and_refuses_a_body_over_its_cap_unread(node):
    from starlette.testclient import TestClient

    from incofl.deploy.superlink import FleetGate

    gate = TestClient(FleetGate(node.app, 8 * MIB, 16 * MIB))
    for path in ("/v1/control/list-runs", "/v1/runtime/acquire-task", "/docs", "/v1/fleet/../control/start-run"):
        assert gate.post(path, content=b"").status_code == 404, path
    assert gate.get("/v1/fleet/pull-messages").status_code == 404  # POST only
    big = gate.post("/v1/fleet/push-object", content=bytes(8 * MIB + 1))
    assert (big.status_code, big.json()) == (413, {"detail": "request body over 8 MiB"})
