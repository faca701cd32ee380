"""The test transport: a federation in one process, a Flower `Grid` whose nodes are ClientApps
called directly, one `Context` per node (its node config and state, as a SuperNode keeps them), no
Ray, no network. It drives the real ServerApp and ClientApp: the equality tests and the
`docs/performance.md` timings of the Flower path use it. Flower's messages read the identity of the
process's task (`TaskIdentity`), which a ServerApp process is given by Flower: here it is set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from uuid import uuid4

from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.proto.node_pb2 import NodeInfo  # pylint: disable=E0611
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

NodeApp = Callable[[Message, Context], Message]
FIRST_NODE = 101  # node ids (1 is the SuperLink's)


class DirectGrid(Grid):
    """Nodes FIRST_NODE + i holding `node_configs[i]`, each answering with `app` (incofl's
    ClientApp, in the tests); `apps` may replace a node's ClientApp
    (a test's faulty node), `keys` give a node its public key (PEM, as a SuperLink with node
    authentication holds it: `get_nodes`). A ClientApp that raises answers with an error reply,
    as a SuperNode does, in Flower's words (`<class 'T'>:<'text'>`). The process takes the
    identity of a ServerApp task of run `run_id` (Flower's messages read it)."""

    def __init__(
        self,
        node_configs: list[dict[str, int | str]],
        app: NodeApp,
        apps: dict[int, NodeApp] | None = None,
        run_id: int = 1,
        keys: dict[int, bytes] | None = None,
    ):
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run_id, SUPERLINK_NODE_ID
        self.contexts = {
            FIRST_NODE + i: Context(run_id, FIRST_NODE + i, dict(config), RecordDict(), {})
            for i, config in enumerate(node_configs)
        }
        self.app, self.apps, self.keys = app, apps or {}, keys or {}
        self.replies: dict[str, Message] = {}
        self._run = Run.create_empty(run_id)

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def get_nodes(self) -> Iterable[NodeInfo]:
        return [NodeInfo(node_id=node, public_key=self.keys.get(node, b"")) for node in self.contexts]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = str(uuid4())  # the SuperLink's part
            node = message.metadata.dst_node_id
            answer = self.apps.get(node, self.app)
            try:
                reply = answer(message, self.contexts[node])
            except Exception as err:  # noqa: BLE001 (the node reports any failure of its app, as Flower's says it)
                reason = f"{type(err)}:<'{err}'>"  # flwr-clientapp's (run_clientapp.py)
                reply = Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason), reply_to=message)
            if reply is not None:  # None: a test's node that never answers
                reply.metadata.__dict__["_message_id"] = str(uuid4())
                self.replies[message.metadata.message_id] = reply
            ids.append(message.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self.replies.pop(i) for i in message_ids if i in self.replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Every reply at once (the apps are called in turn); a node app that returns None never
        replies. (Grid's; the ServerApp pushes and pulls itself.)"""
        return list(self.pull_messages(self.push_messages(messages)))
