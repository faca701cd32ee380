"""A peer on the network that tries to freeze, block or fill the sites' port of `incofl federation
up` (issue 57), from addresses of its own (idle connections from 127.0.0.2, requests from
127.0.0.3: the honest nodes dial from 127.0.0.1), each attack in a thread until `stop`:

- `idle_tcp`: TCP connections that never start a TLS handshake (a peer without a certificate);
- `idle_tls`: TLS connections with a site's certificate that never send a request;
- `bodies`: pushes of messages as large as the gate lets one be, a tree of empty children, and
  8 MiB bodies sent in chunks, back to back (a site's certificate, no node key);
- `long_paths`: requests whose paths are 15 KB (refused by the gate, which logs them) or 60 KB
  (past the head cap: the connection is closed);
- `probe`: twice a second, a small request (Flower's get-run, no key: Flower refuses it), timed.

What each saw is kept for the tests to assert: how often the server closed an idle connection,
each probe's answer time and status, and how many requests each flood made."""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from federation_flood import gone

IDLE, FLOOD = "127.0.0.2", "127.0.0.3"  # the attacker's addresses


@dataclass
class Hostile:
    port: int
    ca: Path
    certificate: tuple[Path, Path]  # a site's TLS certificate and key: a peer that has one, and no node key
    idle: int = 48  # TLS connections held open (TCP ones: idle + 16), re-opened when the server closes them
    stop: threading.Event = field(default_factory=threading.Event)
    closed: Counter[str] = field(default_factory=Counter)  # kind -> connections the server closed
    sent: Counter[str] = field(default_factory=Counter)  # flood -> requests made
    probes: list[tuple[float, int]] = field(default_factory=list)  # (seconds to the answer, status)
    errors: list[str] = field(default_factory=list)

    def start(self) -> list[threading.Thread]:
        attacks = (self.idle_tcp, self.idle_tls, self.bodies, self.long_paths, self.probe)
        threads = [threading.Thread(target=self._guarded, args=(attack,), daemon=True) for attack in attacks]
        for thread in threads:
            thread.start()
        return threads

    def _guarded(self, attack: object) -> None:
        try:
            attack()  # type: ignore[operator]
        except Exception as err:  # noqa: BLE001 (the test reports it)
            self.errors.append(f"{attack.__name__}: {type(err).__name__}: {err}")  # type: ignore[attr-defined]

    def _context(self, certificate: bool = True) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        if certificate:
            context.load_cert_chain(*map(str, self.certificate))
        return context

    def _socket(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=30, source_address=(IDLE, 0))

    def _hold(self, kind: str, connect: object, count: int) -> None:
        """`count` connections of `kind` open; one the server closes is counted and opened again."""
        held: list[socket.socket] = []
        while not self.stop.is_set():
            while len(held) < count and not self.stop.is_set():
                try:
                    held.append(connect())  # type: ignore[operator]
                except OSError:
                    self.closed[kind] += 1
                    time.sleep(0.1)
            for conn in list(held):
                if gone(conn):
                    self.closed[kind] += 1
                    held.remove(conn)
                    conn.close()
            self.stop.wait(0.5)
        for conn in held:
            conn.close()

    def idle_tcp(self) -> None:
        self._hold("tcp", self._socket, self.idle + 16)

    def idle_tls(self) -> None:
        context = self._context()
        self._hold("tls", lambda: context.wrap_socket(self._socket(), server_hostname="127.0.0.1"), self.idle)

    def _request(self, path: str, body: bytes | object = b"") -> int:
        """POST `path` from the attacker's address with a site's certificate: the status, 0 if the server hung up."""
        conn = http.client.HTTPSConnection(
            "127.0.0.1", self.port, context=self._context(), timeout=30, source_address=(FLOOD, 0)
        )
        try:
            conn.request("POST", path, body=body)  # type: ignore[arg-type]
            response = conn.getresponse()
            response.read()
            return response.status
        except (OSError, http.client.HTTPException):
            return 0
        finally:
            conn.close()

    def bodies(self) -> None:
        from flwr.proto.fleet_pb2 import PushMessagesRequest
        from flwr.proto.message_pb2 import ObjectTree

        from incofl.deploy.fleet import PUSH_CAP

        tree = ObjectTree(object_id="a" * 64)
        tree.children.extend(ObjectTree() for _ in range(PUSH_CAP // 2 - 64))  # 2 bytes an empty child
        wide = PushMessagesRequest(message_object_trees=[tree]).SerializeToString()[:PUSH_CAP]
        while not self.stop.is_set():
            self.sent["wide"] += bool(self._request("/v1/fleet/push-messages", wide))
            chunked = (bytes(1 << 20) for _ in range(9))  # no length: http.client sends it in chunks
            self.sent["chunked"] += bool(self._request("/v1/fleet/push-object", chunked))

    def long_paths(self) -> None:
        while not self.stop.is_set():
            for size in (15_000, 60_000):
                self._request("/v1/fleet/" + "x" * size)
                self.sent[f"path{size}"] += 1
            self.stop.wait(0.05)

    def probe(self) -> None:
        while not self.stop.is_set():
            start = time.monotonic()
            status = self._request("/v1/fleet/get-run", b"")
            self.probes.append((time.monotonic() - start, status))
            self.stop.wait(0.5)
