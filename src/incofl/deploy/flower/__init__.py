"""The Flower adapter: every place where incofl relies on Flower past its public API, in this package.

incofl's deployment is written against Flower RELEASE (pyproject.toml pins it). Flower's public API
(`flwr.app`, `flwr.serverapp`, `flwr.clientapp`; the `flwr`, `flower-superlink` and
`flower-supernode` commands) is used wherever it serves, anywhere in `incofl.deploy`. What it does
not serve is here. Each module says what of Flower's it reaches into, what it replaces and why, and
`tests/test_flower_adapter.py` pins each behaviour relied on with a test named after it: a Flower
release that changes one fails that test by name. An import-linter contract (pyproject.toml) keeps
every other module of incofl off Flower's internals (`flwr.common`, `flwr.proto`, `flwr.supercore`,
`flwr.superlink`, `flwr.supernode`). This package imports no other module of incofl's deployment:
what it runs (the gate, incofl's ClientApp) is handed to it by the entry points that start processes
(`incofl.deploy.superlink`, `.supernode`, `.executor`).

- `fleet`: the routes, headers and protobuf messages of Flower's Fleet API: what the gate (server/gate.py)
  and the edge proxy (edge.py) enforce.
- `inbox`: the ServerApp's pulls of replies, message by message through the Runtime API calls of
  Flower's HttpGrid (its private client, node and run), in place of `HttpGrid.pull_messages`, which
  one slow or undecodable reply stalls or breaks for all.
- `node`: `flower-supernode` with its sleeps cut short, its pulls quicker, a site's certificate shown.
- `superexec`: a node's warm executor loop, in place of Flower's SuperExec and `flwr-clientapp`.
- `link`: `flower-superlink`'s one app served twice (whole on loopback; the Fleet API through a
  wrapper on a unix socket), and Flower's clean-up of finished runs made periodic.
- `directgrid`: a Grid whose nodes are ClientApps called directly in one process: the test
  transport (the equality tests, docs/performance.md's timings of the Flower path).
- here: the release checked (`require`, `mismatch`), the quick backoff, and Flower's log.
"""

from __future__ import annotations

import sys

RELEASE = "1.42.0"  # the Flower whose internals this package was written against
# How incofl's processes ask again for what is not there yet (a reply, a message's objects, the next
# task): after QUICK seconds, doubling to QUICK_CAP. Flower's own: 1 s doubling to 10 s
# (`pull_objects`), 3 s after a SuperNode's empty pull, 3 s between a ServerApp's pulls
# (`Grid.send_and_receive`). Each is a request on loopback or on the sites' port: cheap beside a
# round's second of waiting.
QUICK, QUICK_CAP = 0.05, 0.2
QUICK_PULL = {"initial_backoff": QUICK, "backoff_cap": QUICK_CAP, "max_tries_per_object": None}


def mismatch() -> str:
    """'' where the installed Flower is RELEASE, else a line saying which one was found."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("flwr")
    except PackageNotFoundError:
        found = "none"
    return "" if found == RELEASE else f"written for flwr {RELEASE}, found flwr {found}"


def require(prog: str) -> None:
    """Exit in one line (code 2) unless Flower is RELEASE: `prog` reaches into its internals."""
    if why := mismatch():
        print(f"{prog}: {why}", file=sys.stderr)
        sys.exit(2)


def log_error(line: str) -> None:
    """`line` through Flower's logger: what `flwr run --stream` and `flwr log` show of a ServerApp."""
    import logging

    from flwr.common import log

    log(logging.ERROR, "%s", line)
