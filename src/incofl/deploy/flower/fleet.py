"""Flower RELEASE's Fleet API as the sites' port serves it: its routes, the request each carries
(the name of its protobuf message under `flwr.proto`) and the most bytes its body may take, its
headers and content type, read without importing Flower (the edge proxy's configuration, edge.py);
and the protobuf messages of a route's request and of the answer to a push, which the gate (server/gate.py)
parses. `test_federation_gate.py` checks the routes against Flower's own router.
"""

from __future__ import annotations

import functools
import importlib

FLEET = "/v1/fleet/"  # the prefix of Flower 1.42's Fleet router (superlink/routers/fleet/router.py)
PUSH_MESSAGES, PUSH_OBJECT = FLEET + "push-messages", FLEET + "push-object"
AUTH_HEADERS = (b"flwr-public-key", b"flwr-signature", b"flwr-timestamp")  # Flower's, each read once (the first)
MEDIA_TYPE = b"application/protobuf"  # Flower's PROTOBUF_MEDIA_TYPE (supercore/protobuf/constants.py)
MAX_OBJECTS = 4096  # objects one reply may declare (a packed reply: tens; 512 MiB in 5 MiB chunks: about 110)
PUSH_CAP = 64 * 1024 + 80 * MAX_OBJECTS  # a push's message header, and its tree: an id of 64 hex digits an object
MIB = 1 << 20
SMALL = 4096  # a request naming a node, a run, an object or a key (a node's PEM key: 215 bytes)
CHUNK = 5 * MIB  # Flower's FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE (its default): a node's largest object
ROUTES: dict[str, tuple[str, int]] = {  # Flower 1.42's Fleet router: path -> (its request, under flwr.proto; cap)
    FLEET + "register-node": ("fleet_pb2.RegisterNodeFleetRequest", SMALL),
    FLEET + "activate-node": ("fleet_pb2.ActivateNodeRequest", SMALL),
    FLEET + "deactivate-node": ("fleet_pb2.DeactivateNodeRequest", SMALL),
    FLEET + "unregister-node": ("fleet_pb2.UnregisterNodeFleetRequest", SMALL),
    FLEET + "send-node-heartbeat": ("heartbeat_pb2.SendNodeHeartbeatRequest", SMALL),
    FLEET + "pull-messages": ("fleet_pb2.PullMessagesRequest", SMALL),  # a SuperNode names no message
    PUSH_MESSAGES: ("fleet_pb2.PushMessagesRequest", PUSH_CAP),
    FLEET + "get-run": ("run_pb2.GetRunRequest", SMALL),
    FLEET + "get-fab": ("fab_pb2.GetFabRequest", SMALL),
    PUSH_OBJECT: ("message_pb2.PushObjectRequest", CHUNK + 64 * 1024),  # a chunk, its header, the ids
    FLEET + "pull-object": ("message_pb2.PullObjectRequest", SMALL),
    FLEET + "confirm-message-received": ("message_pb2.ConfirmMessageReceivedRequest", SMALL),
}
KEY_HEADER = AUTH_HEADERS[0].decode()  # the node key a request is signed with (Flower's FLEET_HTTP_PUBLIC_KEY_HEADER)


ANSWERS = {  # Flower's answer to a push, under flwr.proto
    PUSH_MESSAGES: "fleet_pb2.PushMessagesResponse",
    PUSH_OBJECT: "message_pb2.PushObjectResponse",
}


@functools.cache
def protobuf(name: str) -> type:
    """The protobuf message `name` (`module.Message`) under `flwr.proto`, imported when first asked
    for: the edge proxy's configuration reads this module without Flower."""
    module, _, message = name.rpartition(".")
    return getattr(importlib.import_module(f"flwr.proto.{module}"), message)


def request_of(path: str) -> type:
    """The protobuf message a Fleet route's body is (ROUTES)."""
    return protobuf(ROUTES[path][0])


def answer_of(path: str) -> type:
    """The protobuf message Flower answers a push with (PUSH_MESSAGES or PUSH_OBJECT)."""
    return protobuf(ANSWERS[path])


def route_caps() -> dict[str, int]:
    """Each Fleet route's cap on a request body, in bytes (the edge proxy's and the gate's)."""
    return {path: cap for path, (_, cap) in ROUTES.items()}
