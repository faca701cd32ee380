"""A node's warm executor loop (Flower RELEASE's SuperExec and `flwr-clientapp`, rebuilt).

One long-lived process that asks its node for work as Flower's SuperExec does (AcquireTask,
signed with the secret, every FLWR_SUPEREXEC_TASK_POLL_INTERVAL seconds) and runs each ClientApp
task in-process as `flwr-clientapp` would (pull the message and context, reply, push the
context), with the ClientApp it is given: Flower's SuperExec starts a fresh `flwr-clientapp`
process for each message, which pays a torch import and an engine build each time
(docs/performance.md, Flower). Written against `supercore/superexec/run_superexec.py` and
`supernode/runtime/run_clientapp.py`, whose helpers it calls (`pull_task_input`, `push_message`,
`push_task_output`, `_get_task_poll_interval`).

Its node hands out a message's task before it has pulled the message's objects from the
SuperLink, so the executor's first asks for them find none; Flower asks again after 1 s, 2 s, 4 s
... (its `pull_objects`, which `run_clientapp.pull_and_inflate_object_from_tree` calls), and a
round's message waited 1-2 s after its node had it. `pull_quickly` has it ask again with
QUICK_PULL's backoff (plain HTTP on 127.0.0.1), within Flower's own time bound for a message.

A task that fails in any way (its app raising, even SystemExit; a reply that cannot be pushed,
even when Flower's HTTP retry turns the refusal into its RunNotRunningException, a BaseException)
fails that task only, logged, and the next is served; a reply the node refused is replaced by an
error reply (Flower's node makes one only for a task whose token expired, not for a failed one: it
would wait for a reply, and take no other message, for ever), and where that fails too the task is
left to expire; its heartbeat and connection are released whatever happens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from logging import ERROR

import httpx
from flwr.app import Context, Message
from flwr.app.error import Error
from flwr.common.constant import ErrorCode, SubStatus
from flwr.proto.runtime_pb2 import AcquireTaskRequest
from flwr.supercore import log
from flwr.supercore.app_utils import start_parent_process_monitor
from flwr.supercore.auth import load_superexec_auth_secret
from flwr.supercore.constant import TaskType
from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
from flwr.supercore.interceptors import (
    RuntimeTokenHttpInterceptor,
    RuntimeVersionHttpInterceptor,
    SuperExecAuthHttpInterceptor,
)
from flwr.supercore.retry import make_simple_http_retry_invoker
from flwr.supercore.run import RunNotRunningException
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.superexec.run_superexec import _get_task_poll_interval
from flwr.supernode.runtime import run_clientapp
from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

from incofl.deploy.flower import QUICK, QUICK_PULL

ACQUIRE = frozenset({"/flwr.proto.Runtime/AcquireTask"})  # the method the secret signs (Flower's SuperExec's)
# What fails a task, never this process: Flower's helpers exit through SystemExit, and its HTTP retry
# raises RunNotRunningException (a BaseException) on a 403, e.g. a reply the node refuses.
FAILURES = (Exception, SystemExit, RunNotRunningException)
ClientAppFn = Callable[..., Message]
# for ACTIVE seconds after a task, the next is asked for every QUICK seconds (a run's next message
# comes within a round: about a tenth of a second sooner on average), then every `poll` again
ACTIVE = 10.0


def poll_interval() -> float:
    """FLWR_SUPEREXEC_TASK_POLL_INTERVAL as Flower's SuperExec reads it (a ValueError outside 0.01..60 s)."""
    return _get_task_poll_interval()


def auth_secret(path: str) -> bytes:
    """The SuperExec's secret in the file `path`, as Flower reads it (b'' if empty)."""
    return load_superexec_auth_secret(path) or b""


def watch_parent(pid: int) -> None:
    """SIGINT to this process once the process `pid` (the node) is gone, as Flower's SuperExec does."""
    start_parent_process_monitor(pid)


def pull_quickly() -> None:
    """`pull_task_input`'s pull of a message's objects from the node, with QUICK_PULL's backoff."""
    pull = run_clientapp.pull_and_inflate_object_from_tree
    run_clientapp.pull_and_inflate_object_from_tree = partial(pull, **QUICK_PULL)


def runtime_client(address: str, *interceptors: object) -> RuntimeHttpClient:
    """A client of the node's Runtime API (plain HTTP on 127.0.0.1, as `up` starts it)."""
    chain = [RuntimeVersionHttpInterceptor(component_name="incofl-executor"), *interceptors]
    return RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=True,
        root_certificates=None,
        interceptors=chain,
        retry_invoker=make_simple_http_retry_invoker(),
    )


def run_task(address: str, token: str, client_app: ClientAppFn) -> None:
    """One ClientApp task, in this process: its message through incofl's ClientApp, the reply and
    the context pushed back, the task's status last; the heartbeat and the client are released
    whatever happens (a task that raised leaves no thread or connection behind)."""
    client = runtime_client(address, RuntimeTokenHttpInterceptor(token))
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    try:
        heartbeat.start()
        context, status, details = run_message(client, client_app)
        if status:
            push_task_output(client=client, context=context, sub_status=status, details=details)  # logs HTTP errors
        else:  # no reply reached the node: its token expires once the heartbeat stops, and the node answers
            log(ERROR, "No reply reached the node; the task is left to expire: %s", details)
    finally:
        heartbeat.stop()
        client.close()


def run_message(client: RuntimeHttpClient, client_app: ClientAppFn) -> tuple[Context | None, str, str]:
    """Pull the task's message, run incofl's ClientApp on it, push the reply: (context, status,
    details). An exception becomes an error reply and a failed task, as in flwr-clientapp; a reply
    that cannot be pushed fails the task, never this process, and an error reply goes in its place
    (the node's loop waits for a reply to its message: Flower's node makes none for a failed
    ClientApp task, only for one whose token expired); if that cannot be pushed either, status is
    '' (the task is left to expire)."""
    message = context = reply = None
    status, details = SubStatus.FAILED, "ClientApp task failed"
    try:
        message, context, _run, _fab = pull_task_input(client)  # the app bundle is not used: see the docstring
        reply = client_app(message=message, context=context)
        status, details = SubStatus.COMPLETED, ""
    except FAILURES as ex:  # noqa: BLE001 (the server gets the error, the node goes on)
        log(ERROR, "ClientApp raised an exception", exc_info=ex)
        details = f"{type(ex)}:<'{ex}'>"
        if message is not None:
            reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details), reply_to=message)
    if message is None or reply is None or context is None:
        return context, status, details
    try:
        push_message(client, reply, context)
    except FAILURES as ex:  # noqa: BLE001
        log(ERROR, "Failed to push the reply", exc_info=ex)
        status, details = SubStatus.FAILED, f"pushing the reply: {type(ex)}:<'{ex}'>"
        try:  # a fresh one, answering the message as Flower makes it: the node forwards it, then takes the next
            error = Error(code=ErrorCode.REPLY_MESSAGE_UNAVAILABLE, reason=details)
            push_message(client, Message(error, reply_to=message), context)
        except FAILURES as again:  # noqa: BLE001
            log(ERROR, "Failed to push an error reply in its place", exc_info=again)
            status = ""
    return context, status, details


def serve(address: str, secret: bytes, poll: float, client_app: ClientAppFn) -> None:
    """Ask the node for ClientApp tasks until interrupted (every `poll` seconds, QUICK for ACTIVE
    seconds after a task); run each as it comes. A task that fails in any way is logged and the
    next one served (FAILURES: SystemExit and RunNotRunningException included); only
    KeyboardInterrupt, the node gone (`--parent-pid`), ends this loop."""
    client = runtime_client(address, SuperExecAuthHttpInterceptor(master_secret=secret, protected_methods=ACQUIRE))
    request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP.value])
    last = -ACTIVE
    try:
        while True:
            try:
                res = client.AcquireTask(request)
            except httpx.TransportError as err:  # the node restarting: ask again (its end ends this process)
                log(ERROR, "Asking the node for a task: %s", err)
                time.sleep(poll)
                continue
            if res.HasField("task") and res.token:
                try:
                    run_task(address, res.token, client_app)
                except FAILURES as ex:  # noqa: BLE001
                    log(ERROR, "ClientApp task %d failed; serving the next", res.task.task_id, exc_info=ex)
                last = time.monotonic()
                continue  # the next message may be waiting already
            time.sleep(QUICK if time.monotonic() - last < ACTIVE else poll)
    finally:
        client.close()
