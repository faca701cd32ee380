"""The ClientApp that up's warm executor runs in test_federation_deploy.py's deployment
(INCOFL_EXECUTOR_TEST_APP, deploy/executor.py): incofl's own, untouched, except its reply to the
first message of each run whose `out` folder is named FAILING (identify), which claims another
run's id. Flower 1.42's SuperNode refuses that push (Runtime.PushMessages: "Run ID in message does not
match authenticated task's run ID", a 403, which Flower's HTTP retry raises as its
RunNotRunningException, a BaseException): a push that fails, deterministically, by Flower's own check.

And in a run whose `out` folder is named FORGED, it tells the test its train message's header
(`FORGED.asked` beside that folder: what a site that guessed the message's id would know) and
holds its reply until the test has answered that message in this node's name (`FORGED.forged`,
60 s at most): the forged reply reaches the SuperLink first, as a forger's that wins the race."""

from __future__ import annotations

import json
import time
from pathlib import Path

from flwr.app import Context, Message

from incofl.deploy.site.clientapp import app as incofl_app

FAILING = "push-fails"
FORGED = "forged"
failed: set[int] = set()  # the runs whose push already failed (the executor is one warm process)


def app(message: Message, context: Context) -> Message:
    reply = incofl_app(message=message, context=context)
    out = Path(str(context.run_config.get("out", "")))
    if out.name == FORGED and message.metadata.message_type == "train":
        tell_and_wait(message, out)
    run = message.metadata.run_id
    if Path(str(context.run_config.get("out", ""))).name == FAILING and run not in failed:
        failed.add(run)
        reply.metadata.__dict__["_run_id"] = run ^ 1  # what Flower's node compares with its task's run
    return reply


def tell_and_wait(message: Message, out: Path) -> None:
    """The message's header to `FORGED.asked` beside `out`; back once `FORGED.forged` is there (60 s at most)."""
    meta = message.metadata
    asked = {"message": meta.message_id, "node": meta.dst_node_id, "run": meta.run_id, "round": int(meta.group_id)}
    tmp = out.with_name(f"{FORGED}.tmp")
    tmp.write_text(json.dumps(asked | {"created_at": meta.created_at, "ttl": meta.ttl}))
    tmp.rename(out.with_name(f"{FORGED}.asked"))
    deadline = time.monotonic() + 60
    while not out.with_name(f"{FORGED}.forged").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
