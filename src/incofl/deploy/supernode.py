"""`flower-supernode` with a shorter wait after an empty pull: what `incofl federation up` starts
for each node.

    python -m incofl.deploy.supernode FLOWER_SUPERNODE_ARGS...

Flower 1.42.0's SuperNode sleeps 3 s whenever it asks the SuperLink for a message and finds none,
and 0.5 s between looks for its ClientApp's reply (`time.sleep(3)` and `time.sleep(0.5)` in
`flwr/supernode/start_client_internal.py`, no flag or environment variable sets them): a node
that has just replied asks again at once, finds nothing (the server is still averaging) and so
takes the next round's message up to 3 s late. This runs Flower's own `flower-supernode` with that
module's `time` replaced by one whose sleep is capped at WAIT; it refuses any other Flower version,
whose code it has not been checked against.
"""

from __future__ import annotations

import sys
import time
import types

WAIT = 0.2  # seconds: the longest the node's loop sleeps (an idle node asks the SuperLink 5 times a second)
FLOWER = "1.42.0"


def capped_time(cap: float) -> types.ModuleType:
    """`time`, but with sleep(s) sleeping min(s, cap)."""
    shim = types.ModuleType("time")
    shim.__dict__.update(time.__dict__)
    shim.sleep = lambda seconds: time.sleep(min(seconds, cap))  # type: ignore[attr-defined]
    return shim


def require_flower(prog: str) -> None:
    """Exit in one line (code 2) unless Flower is the version these wrappers were checked against:
    they reach into its internals, which change between releases."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("flwr")
    except PackageNotFoundError:
        found = "none"
    if found != FLOWER:
        print(f"{prog}: written for flwr {FLOWER}, found {found}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    require_flower("python -m incofl.deploy.supernode")
    import flwr.supernode.start_client_internal as loop
    from flwr.supernode.cli import flower_supernode

    loop.time = capped_time(WAIT)
    flower_supernode()


if __name__ == "__main__":
    main()
