"""The ClientApp that up's warm executor runs in test_federation_deploy.py's deployment
(INCOFL_EXECUTOR_TEST_APP, deploy/executor.py): incofl's own, untouched, except its reply to the
first message of each run whose `out` folder is named FAILING (identify), which claims another
run's id. Flower 1.42's SuperNode refuses that push (Runtime.PushMessages: "Run ID in message does not
match authenticated task's run ID", a 403, which Flower's HTTP retry raises as its
RunNotRunningException, a BaseException): a push that fails, deterministically, by Flower's own check."""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context, Message

from incofl.deploy.clientapp import app as incofl_app

FAILING = "push-fails"
failed: set[int] = set()  # the runs whose push already failed (the executor is one warm process)


def app(message: Message, context: Context) -> Message:
    reply = incofl_app(message=message, context=context)
    run = message.metadata.run_id
    if Path(str(context.run_config.get("out", ""))).name == FAILING and run not in failed:
        failed.add(run)
        reply.metadata.__dict__["_run_id"] = run ^ 1  # what Flower's node compares with its task's run
    return reply
