"""`flower-supernode` with a client certificate and a shorter wait after an empty pull: what
`incofl federation up` starts for each node, and what a site elsewhere runs.

    python -m incofl.deploy.supernode [--client-certificate NODE.pem --client-key NODE.key]
        FLOWER_SUPERNODE_ARGS...

The sites' port of incofl's SuperLink (superlink.py) finishes a TLS handshake only with a peer
that shows a certificate its CA issued (`incofl federation export` makes one a site,
`certificates/node<K>.pem` and `.key`); Flower 1.42's node builds its HTTP client from root
certificates alone (`supercore/protobuf/client.py`), so this hands that client the site's
certificate and key (`client_certificate`).

Flower 1.42.0's SuperNode sleeps 3 s whenever it asks the SuperLink for a message and finds none,
and 0.5 s between looks for its ClientApp's reply (`time.sleep(3)` and `time.sleep(0.5)` in
`flwr/supernode/start_client_internal.py`, no flag or environment variable sets them): a node
that has just replied asks again at once, finds nothing (the server is still averaging) and so
takes the next round's message up to 3 s late. And a node takes a message as soon as the
SuperLink announces it, while the server is still pushing its objects: Flower asks again for an
object not there yet after 1 s doubling to 10 s (`pull_objects`), so each round's message waited
about a second on each node. This runs Flower's own `flower-supernode` with that module's `time`
replaced by one whose sleeps are cut short (WAIT after an empty pull; LOOK, 0.02 s, between its
looks at its own state for its ClientApp's reply, where Flower sleeps 0.5 s), and its
`pull_objects` asking again after 0.05 s doubling to 0.2 s (QUICK_PULL: tries bounded by Flower's
time limit for a message, 2 hours, not by count); it refuses any other Flower version, whose code
it has not been checked against.
"""

from __future__ import annotations

import argparse
import ssl
import sys
import time
import types
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

WAIT = 0.2  # seconds the node's loop sleeps after an empty pull (an idle node asks the SuperLink 5 times a second)
LOOK = 0.02  # seconds between its looks at its own state for its ClientApp's reply (a lookup, no request)
FLOWER = "1.42.0"
# how a node asks the SuperLink, and an executor its node, again for a message's objects not there yet: after
# 0.05 s doubling to 0.2 s, tries bounded by Flower's time limit for a message only (PULL_MAX_TIME, 7200 s)
QUICK_PULL = {"initial_backoff": 0.05, "backoff_cap": 0.2, "max_tries_per_object": None}


def capped_time(wait: float, look: float) -> types.ModuleType:
    """`time`, but with Flower's 3 s sleep after an empty pull cut to `wait` and its 0.5 s sleeps
    between looks at the node's own state (for its ClientApp's reply, or the reply's objects) to
    `look`: the loop's only sleeps (module docstring)."""
    shim = types.ModuleType("time")
    shim.__dict__.update(time.__dict__)
    shim.sleep = lambda seconds: time.sleep(min(seconds, wait if seconds >= 1 else look))  # type: ignore[attr-defined]
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


def client_certificate(certificate: Path, key: Path) -> None:
    """Flower's Fleet client, from now on in this process, shows `certificate` (signed by the CA the
    SuperLink trusts) in every TLS handshake, and checks the server as Flower would."""
    shown_certificate(lambda: (certificate, key))


def shown_certificate(chosen: Callable[[], tuple[Path, Path]]) -> None:
    """As `client_certificate`, the certificate and key `chosen()` names when a client is made."""
    import flwr.supernode.fleet_http_connection as connection

    class Certified(connection.FleetHttpClient):  # type: ignore[misc, valid-type]
        def __init__(self, base_url: str, *, verify: ssl.SSLContext | bool | str = True, **options: Any) -> None:
            context = verify if isinstance(verify, ssl.SSLContext) else ssl.create_default_context()
            if isinstance(verify, str):
                context.load_verify_locations(cafile=verify)
            context.load_cert_chain(*chosen())
            super().__init__(base_url, verify=context, **options)

    connection.FleetHttpClient = Certified


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This wrapper's flags (both or neither; the key private, one line otherwise), and Flower's."""
    from incofl.config import ConfigError
    from incofl.deploy.credentials import check_private

    parser = argparse.ArgumentParser(prog="python -m incofl.deploy.supernode", description=__doc__.split("\n\n")[0])
    parser.add_argument("--client-certificate", type=Path, help="the site's TLS certificate (nodeK.pem)")
    parser.add_argument("--client-key", type=Path, help="its private key (nodeK.key)")
    ours, flower = parser.parse_known_args(argv)
    if (ours.client_certificate is None) != (ours.client_key is None):
        parser.error("--client-certificate and --client-key go together")
    if ours.client_key is not None:
        try:
            check_private(ours.client_key)
            ours.client_certificate.stat()
        except (OSError, ConfigError) as err:
            parser.error(str(err))
    return ours, flower


def main() -> None:
    require_flower("python -m incofl.deploy.supernode")
    ours, flower = parse(sys.argv[1:])
    import flwr.supernode.start_client_internal as loop
    from flwr.supernode.cli import flower_supernode

    if ours.client_certificate is not None:
        client_certificate(ours.client_certificate, ours.client_key)
    loop.time = capped_time(WAIT, LOOK)
    loop.pull_objects = partial(loop.pull_objects, **QUICK_PULL)
    sys.argv = ["flower-supernode", *flower]
    flower_supernode()


if __name__ == "__main__":
    main()
