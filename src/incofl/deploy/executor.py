"""A node's warm executor: what `incofl federation up` starts beside each SuperNode in place of
Flower's `flower-superexec`.

    python -m incofl.deploy.executor --runtime-api-address 127.0.0.1:PORT --superexec-auth-secret-file FILE
        --parent-pid PID

One long-lived process that asks its node for work as Flower's SuperExec does (AcquireTask,
signed with the secret, every FLWR_SUPEREXEC_TASK_POLL_INTERVAL seconds) and runs each ClientApp
task in-process as `flwr-clientapp` would (pull the message and context, reply, push the
context), with incofl's own ClientApp (`incofl.deploy.clientapp.app`): no app bundle is installed
or loaded, so this node runs incofl's code only, whatever app a `flwr run` names. Its imports and
the client built for a run (`clientapp._sites`) stay between messages: a message pays its
training, not a fresh process's torch import and engine build (docs/performance.md, Flower).
It exits when the node (`--parent-pid`) does. Written against Flower 1.42.0's SuperExec and
`flwr-clientapp` (supercore/superexec/run_superexec.py, supernode/runtime/run_clientapp.py).
"""

from __future__ import annotations

import argparse
import os
import time
from logging import ERROR

from flwr.app import Message
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
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

from incofl.deploy.clientapp import app

ACQUIRE = frozenset({"/flwr.proto.Runtime/AcquireTask"})  # the method the secret signs (Flower's SuperExec's)


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


def run_task(address: str, token: str) -> None:
    """One ClientApp task, in this process: its message through incofl's ClientApp, the reply and
    the context pushed back; an exception becomes an error reply and a failed task, as in flwr-clientapp."""
    client = runtime_client(address, RuntimeTokenHttpInterceptor(token))
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    heartbeat.start()
    message = context = reply = None
    status, details = SubStatus.FAILED, "ClientApp task failed"
    try:
        message, context, _run, _fab = pull_task_input(client)  # the app bundle is not used: see the docstring
        reply = app(message=message, context=context)
        status, details = SubStatus.COMPLETED, ""
    except Exception as ex:  # noqa: BLE001 (as flwr-clientapp: the server gets the error, the node goes on)
        log(ERROR, "ClientApp raised an exception", exc_info=ex)
        details = f"{type(ex)}:<'{ex}'>"
        if message is not None:
            reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details), reply_to=message)
    try:
        if reply is not None and context is not None:
            push_message(client, reply, context)
    except Exception as ex:  # noqa: BLE001 (the node then reports the task failed; this process serves the next)
        log(ERROR, "Failed to push the reply", exc_info=ex)
        status, details = SubStatus.FAILED, f"pushing the reply: {type(ex)}:<'{ex}'>"
    push_task_output(client=client, context=context, sub_status=status, details=details)  # logs its own errors
    heartbeat.stop()
    client.close()


def serve(address: str, secret: bytes, poll: float) -> None:
    """Ask the node for ClientApp tasks forever; run each as it comes."""
    client = runtime_client(address, SuperExecAuthHttpInterceptor(master_secret=secret, protected_methods=ACQUIRE))
    request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP.value])
    while True:
        res = client.AcquireTask(request)
        if res.HasField("task") and res.token:
            run_task(address, res.token)
            continue  # the next message may be waiting already
        time.sleep(poll)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m incofl.deploy.executor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime-api-address", required=True)
    parser.add_argument("--superexec-auth-secret-file", required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    secret = load_superexec_auth_secret(args.superexec_auth_secret_file)
    if secret is None:
        parser.error(f"--superexec-auth-secret-file {args.superexec_auth_secret_file}: empty")
    start_parent_process_monitor(args.parent_pid)  # SIGINT to this process once the node is gone
    poll = float(os.environ.get("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "1"))
    try:
        serve(args.runtime_api_address, secret, poll)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
