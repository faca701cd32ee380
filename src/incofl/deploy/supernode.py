"""`flower-supernode` with a client certificate and a shorter wait after an empty pull: what
`incofl federation up` starts for each node, and what a site elsewhere runs.

    python -m incofl.deploy.supernode [--client-certificate NODE.pem --client-key NODE.key]
        FLOWER_SUPERNODE_ARGS...

The sites' port of incofl's SuperLink (superlink.py) finishes a TLS handshake only with a peer
that shows a certificate its CA issued (`incofl federation export` makes one a site,
`certificates/node<K>.pem` and `.key`), which Flower's node cannot show by itself. This checks
the flags (both or neither; the key private) and runs Flower's own node through the Flower
adapter (flower/node.py: the certificate shown, its waits after an empty pull and between looks
at its ClientApp's reply cut short); it refuses any Flower but the adapter's (one line, exit 2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from incofl.deploy.flower import require
from incofl.deploy.flower.node import run


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This wrapper's flags (both or neither; the key private, one line otherwise), and Flower's."""
    from incofl.config import ConfigError
    from incofl.deploy.wire.credentials import check_private

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
    require("python -m incofl.deploy.supernode")
    ours, flower = parse(sys.argv[1:])
    certified = ours.client_certificate is not None
    run(flower, (ours.client_certificate, ours.client_key) if certified else None)


if __name__ == "__main__":
    main()
