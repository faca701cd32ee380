"""`flower-supernode` with a site's certificate shown and shorter waits (Flower RELEASE's node).

Flower's node builds its HTTP client from root certificates alone (`FleetHttpClient` in
`flwr/supernode/fleet_http_connection.py`), so that no site can show the certificate that the
sites' port asks of it: `shown_certificate` hands that client the site's certificate and key.

Flower's node sleeps 3 s whenever it asks the SuperLink for a message and finds none, and 0.5 s
between looks for its ClientApp's reply (`time.sleep(3)` and `time.sleep(0.5)` in
`flwr/supernode/start_client_internal.py`; no flag or environment variable sets them): a node that
has just replied asks again at once, finds nothing (the server is still averaging) and so takes the
next round's message up to 3 s late. And it takes a message as soon as the SuperLink announces it,
while the server is still pushing its objects: Flower asks again for an object not there yet after 1
s doubling to 10 s (`pull_objects`), so each round's message waited about a second on each node.
`run` runs Flower's own `flower-supernode` with that module's `time` replaced by one whose sleeps
are cut short (WAIT after an empty pull; LOOK between its looks at its own state, where Flower sleeps
0.5 s), and its `pull_objects` asking again with QUICK_PULL's backoff (tries bounded by Flower's time
limit for a message, 2 hours, not by count).
"""

from __future__ import annotations

import ssl
import sys
import time
import types
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from incofl.deploy.flower import QUICK_PULL

WAIT = 0.2  # seconds the node's loop sleeps after an empty pull (an idle node asks the SuperLink 5 times a second)
LOOK = 0.02  # seconds between its looks at its own state for its ClientApp's reply (a lookup, no request)


def capped_time(wait: float, look: float) -> types.ModuleType:
    """`time`, but with Flower's 3 s sleep after an empty pull cut to `wait` and its 0.5 s sleeps
    between looks at the node's own state (for its ClientApp's reply, or the reply's objects) to
    `look`: the loop's only sleeps (module docstring)."""
    shim = types.ModuleType("time")
    shim.__dict__.update(time.__dict__)
    shim.sleep = lambda seconds: time.sleep(min(seconds, wait if seconds >= 1 else look))  # type: ignore[attr-defined]
    return shim


def shown_certificate(chosen: Callable[[], tuple[Path, Path]]) -> None:
    """Flower's Fleet client, from now on in this process, shows the certificate and key that
    `chosen()` names when a client is made (signed by the CA the sites' port trusts), and checks the
    server as Flower would."""
    import flwr.supernode.fleet_http_connection as connection

    class Certified(connection.FleetHttpClient):  # type: ignore[misc, valid-type]
        def __init__(self, base_url: str, *, verify: ssl.SSLContext | bool | str = True, **options: Any) -> None:
            context = verify if isinstance(verify, ssl.SSLContext) else ssl.create_default_context()
            if isinstance(verify, str):
                context.load_verify_locations(cafile=verify)
            context.load_cert_chain(*chosen())
            super().__init__(base_url, verify=context, **options)

    connection.FleetHttpClient = Certified


def run(flower_args: list[str], certificate: tuple[Path, Path] | None) -> None:
    """Flower's `flower-supernode` with `flower_args`, its waits shortened (module docstring), showing
    `certificate` (the site's certificate and key) where given."""
    import flwr.supernode.start_client_internal as loop
    from flwr.supernode.cli import flower_supernode

    if certificate is not None:
        shown_certificate(lambda: certificate)
    loop.time = capped_time(WAIT, LOOK)
    loop.pull_objects = partial(loop.pull_objects, **QUICK_PULL)
    sys.argv = ["flower-supernode", *flower_args]
    flower_supernode()
