"""A node's warm executor: what `incofl federation up` starts beside each SuperNode in place of
Flower's `flower-superexec`.

    python -m incofl.deploy.executor --runtime-api-address 127.0.0.1:PORT --superexec-auth-secret-file FILE
        --parent-pid PID

One long-lived process that asks its node for work as Flower's SuperExec does and runs each
ClientApp task in-process as `flwr-clientapp` would (the Flower adapter's loop: flower/superexec.py),
with incofl's own ClientApp (`incofl.deploy.site.clientapp.app`): no app bundle is installed
or loaded, so this node runs incofl's code only, whatever app a `flwr run` names. Its imports and
the client built for a run (`clientapp._sites`) stay between messages: a message pays its
training, not a fresh process's torch import and engine build (docs/performance.md, Flower).
It exits when the node (`--parent-pid`) does. It refuses, in one line (exit 2), any Flower but
the adapter's, a loose secret file and an FLWR_SUPEREXEC_TASK_POLL_INTERVAL outside Flower's own
bounds.

Tests only: where this process's own environment sets INCOFL_EXECUTOR_TEST_APP to `FILE.py:NAME`,
that ClientApp runs in place of incofl's (tests/federation_executor_app.py wraps incofl's to make
one reply's push fail: tests/test_federation_deploy.py). The environment is the operator's, which
`up` passes on: nothing a site's data, a message or a run's config holds can set it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path

from incofl.deploy.flower import require

require("python -m incofl.deploy.executor")  # before the adapter imports Flower's internals

from incofl.deploy.flower import superexec  # noqa: E402
from incofl.deploy.flower.superexec import ClientAppFn  # noqa: E402
from incofl.deploy.site.clientapp import app  # noqa: E402
from incofl.deploy.wire.credentials import check_private  # noqa: E402

TEST_APP = "INCOFL_EXECUTOR_TEST_APP"  # tests only: the module docstring


def load_app(ref: str | None) -> ClientAppFn:
    """incofl's ClientApp, or the test's one that `ref` (`FILE.py:NAME`, TEST_APP) names."""
    if not ref:
        return app
    path, _, name = ref.rpartition(":")
    spec = importlib.util.spec_from_file_location("incofl_executor_test_app", path)
    if spec is None or spec.loader is None or not name:
        raise ValueError(f"{TEST_APP}={ref}: not FILE.py:NAME")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m incofl.deploy.executor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime-api-address", required=True)
    parser.add_argument("--superexec-auth-secret-file", required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    try:  # Flower's own reading of it: a finite number of seconds in 0.01..60, else one line, exit 2
        poll = superexec.poll_interval()
    except ValueError as err:
        parser.error(str(err))
    try:
        secret = superexec.auth_secret(str(check_private(Path(args.superexec_auth_secret_file))))
    except (OSError, ValueError) as err:  # missing, unreadable, empty or readable by others: one line
        parser.error(f"--superexec-auth-secret-file: {err}")
    client_app = load_app(os.environ.get(TEST_APP))
    superexec.pull_quickly()
    superexec.watch_parent(args.parent_pid)
    try:
        superexec.serve(args.runtime_api_address, secret, poll, client_app)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
