"""A federation on this machine (`incofl federation up`): a SuperLink on 127.0.0.1 and one
SuperNode per site data file (`incofl federation export`) or site's own data (`--site-data
CLIENT=PATH`: a folder, its node's `data-folder`, or an .npz, its `data-npz`: deploy/site/owndata.py,
in place of that client's exported file, if any), each node told its client and data,
and a connection in Flower's config (`$FLWR_HOME/config.toml`, `~/.flwr/config.toml` by default)
for `flwr run`. It runs until interrupted (Ctrl-C or SIGTERM), then stops every process it
started; one that dies stops the rest, naming it.

Secure by default: TLS on every API, with the certificates in `certificates` (`ca.pem`,
`server.pem`, `server.key`: a server certificate for 127.0.0.1; default: `<sites>/certificates`,
made there unless present); node authentication: each node's P-384 key pair
(`<sites>/keys/node<client>`, made unless `incofl federation export --keys` made it) is
registered with `flwr supernode register` before the node starts, the SuperLink refuses any
other node, and the ServerApp binds each client to its node's key (run config `node-keys`); and
the SuperLink's and each node's work is run by a process that `up` starts with a fresh secret
(Flower's process isolation), so that no other process can take it from their Runtime APIs: the
SuperLink's by Flower's SuperExec, each node's by incofl's warm executor (executor.py: one process
for all the node's messages, which runs incofl's ClientApp only). `insecure`: none of these, for a
trusted loopback test only (each message in a fresh `flwr-clientapp`, Flower's default). Every
node runs as `python -m incofl.deploy.supernode` (supernode.py: Flower's SuperNode, with its
hard-coded 3 s wait after an empty pull cut short).

The sites' port (`port`, what nodes dial) is nginx's (edge.py), which `up` starts in front of the
SuperLink: it terminates TLS (mutual: a site's certificate, bound to its node key), bounds every
connection, head, body and request rate, and passes what it lets through, over a private unix
socket, to the SuperLink's Fleet API and its gate (superlink.py, server/gate.py: the protocol's own rules,
the budget of a reply from the run's models: the facts file's `reply_cap`). The SuperLink's Control
and Runtime APIs are on `port + 1`, on 127.0.0.1; its state in memory (`link_state`; `disk`: in
SQLite in `<sites>/superlink/`); the nodes take
the ports after. Everything up and its processes write is private (they run with umask 077:
the database, node states, the run's files; its logs 0600), and site files, private keys and the folders of keys
and logs that group or others may read are refused in one line naming them.

Anyone who can connect to the Control API's port can use it (`flwr run`: code that runs as this
user); Flower 1.42 has no user authentication without OIDC, so on a shared host every local user
can (docs/federation.md, "Threat model").
"""

from __future__ import annotations

import os
import pwd
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from incofl.config import ConfigError
from incofl.deploy import DATA_FOLDER, DATA_NPZ, DATA_PATH
from incofl.deploy.edge import Edge, nginx, reload, site_bindings
from incofl.deploy.logs import BoundedLog, pump, raise_fd_limit
from incofl.deploy.wire.credentials import check_private, private_folder
from incofl.numerics import Numerics, NumericsError, conflicts, environment

LinkState = Literal["memory", "disk"]

CONNECTION = "incofl-local"  # the connection `flwr run` names
# FLWR_SUPEREXEC_TASK_POLL_INTERVAL of the processes up starts, unless set (Flower's: 1 s). Each SuperExec asks
# that often; an idle 2-node federation then used 6% of a core (1 s: 2%, 0.1 s: 19%)
TASK_POLL = 0.25
# the SuperLink's own SuperExec, which asks the SuperLink (the process every node's request shares)
# for a run's ServerApp to start: Flower's 1 s, unless set (a run's start waits up to 1 s for it)
SERVER_TASK_POLL = 1.0
POLL_VARIABLE = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
PRIVATE_UMASK = 0o077  # of every process up starts
SITES_APART = 4  # sites started apart on this machine (and `flwr` tools) that dial the sites' port from 127.0.0.1
DEFAULT_REPLY_CAP = 512  # MiB: the gate's cap on one reply where the facts file states none


@dataclass(frozen=True)
class LocalFederation:
    """What `incofl federation up` starts (module docstring)."""

    sites: Path
    port: int = 9092
    connection: str = CONNECTION
    certificates: Path | None = None  # one's own; default: <sites>/certificates, made
    insecure: bool = False
    logs: Path | None = None
    numerics: Numerics = "native"  # the kernels of every process started (incofl.numerics)
    own: dict[int, Path] = field(default_factory=dict)  # client -> its site's own data (`site_data`)
    link_state: LinkState = "memory"  # where the SuperLink keeps messages and objects (`link_args`)

    @property
    def keys(self) -> Path:
        return self.sites.resolve() / "keys"

    @property
    def server_public(self) -> Path:
        """The server's public key (`incofl federation export` made it), which a site serving its own data acts on."""
        from incofl.deploy.wire.signing import SERVER  # cryptography: the flower extra's

        return self.keys / f"{SERVER}.pub"

    def node_data(self) -> dict[int, tuple[str, Path]]:
        """client -> its node's data, as its node config key and path: the site files', each client
        in `own` its own data's in place of its file's; refused in one line where a node could not run."""
        if self.own and self.insecure:
            raise ConfigError(
                "--site-data with --insecure: a site's own data declares its facts, which only a run with "
                "node-keys takes; drop --insecure"
            )
        if self.own and not self.server_public.is_file():  # what its node checks the server's instructions with
            raise ConfigError(
                f"--site-data: no {self.server_public}, the server's public key that a site serving its own data "
                "acts on; make it with incofl federation export (--declared where every site serves its own)"
            )
        own = {
            client: (DATA_FOLDER if path.is_dir() else DATA_NPZ, check_private(path))
            for client, path in self.own.items()
        }
        return {client: (DATA_PATH, path) for client, path in self.site_files().items()} | own

    def site_files(self) -> dict[int, Path]:
        """client -> its data file, from the files in `sites` (each names its client)."""
        files: dict[int, Path] = {}
        for path in sorted(self.sites.glob("*.npz")):
            try:
                with np.load(path) as f:
                    client = int(f["client"])
            except (OSError, ValueError, KeyError):
                raise ConfigError(f"{path}: not a site data file; make them with incofl federation export") from None
            if client in files:
                raise ConfigError(f"{path} and {files[client]} both hold client {client}'s data")
            files[client] = check_private(path).resolve()
        if not files and not self.own:
            raise ConfigError(
                f"--sites {self.sites}: no site data files (*.npz); make them with incofl federation export, "
                "or pass --site-data"
            )
        return files

    def tls(self, clients: Iterable[int]) -> tuple[Path, Path, Path] | None:
        """(ca.pem, server.pem, server.key): the given folder's, else `<sites>/certificates`' (made
        unless present), with each client's site certificate (`node<K>.pem`, `.key`: there, or issued
        by the CA's key there); None when insecure."""
        if self.insecure:
            return None
        from incofl.deploy.wire.credentials import certificates, given_certificates, node_certificate

        if self.certificates is None:
            return certificates(self.sites.resolve() / "certificates", clients=clients)
        paths = given_certificates(self.certificates)
        check_private(paths[2])
        for client in clients:
            node_certificate(paths[0].parent, client)
        return paths


def site_data(values: Iterable[str]) -> dict[int, Path]:
    """client -> its site's own data, from `--site-data CLIENT=PATH` values (PATH a folder or an
    .npz file); refused in one line naming the first value that is not."""
    own: dict[int, Path] = {}
    for value in values:
        client, _, path = value.partition("=")
        where = Path(path).resolve()
        if not client.isdigit() or not path:
            raise ConfigError(f"--site-data {value}: not CLIENT=PATH (a client index, its data's folder or .npz)")
        if not (where.is_dir() or (where.is_file() and where.suffix == ".npz")):
            raise ConfigError(f"--site-data {value}: {path} is not a folder or an .npz file")
        if int(client) in own:
            raise ConfigError(f"--site-data {value}: client {int(client)}'s data named twice")
        own[int(client)] = where
    return own


def flower_home() -> Path:
    return Path(os.environ.get("FLWR_HOME", Path.home() / ".flwr"))


def add_connection(name: str, address: str, root_certificates: Path | None) -> Path:
    """`[superlink.<name>]` in Flower's config, appended (the rest of the file as it was; a
    missing file first gets Flower's own defaults, as `flwr` would write them); an entry of that
    name with other settings is refused in one line, never overwritten."""
    path = flower_home() / "config.toml"
    if not path.exists():  # any flwr command writes its defaults first (this process never imports flwr)
        subprocess.run([flower_tool("flwr"), "config", "list"], capture_output=True, timeout=60, check=False)
    entry = {"address": address, **({"root-certificates": str(root_certificates)} if root_certificates else {})}
    if root_certificates is None:
        entry["insecure"] = True
    text = path.read_text() if path.exists() else ""
    try:
        existing = tomllib.loads(text).get("superlink", {}).get(name)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not TOML ({err})") from None
    if existing == entry:
        return path
    if existing is not None:
        raise ConfigError(
            f"{path}: connection {name} exists with other settings ({existing}); remove it or pass --connection"
        )
    lines = [f"\n[superlink.{name}]", f'address = "{address}"']
    lines += [f'root-certificates = "{root_certificates}"'] if root_certificates else ["insecure = true"]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


def flower_tool(name: str) -> str:
    """A Flower command: beside this Python's (a virtual environment's bin), else on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise ConfigError(f"{name}: not found; install the extra: pip install -e '.[flower]'")
    return found


def check_ports(first: int, count: int) -> None:
    """Refuse, in one line, ports another process holds (a SuperLink still running?)."""
    for port in range(first, first + count):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                raise ConfigError(
                    f"--port {first}: 127.0.0.1:{port} is in use (another federation up?); the federation needs "
                    f"ports {first}..{first + count - 1}: pass another --port"
                ) from None


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    def listening() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    wait_for(listening, proc, f"127.0.0.1:{port}", timeout)


def wait_for(ready: Callable[[], bool], proc: subprocess.Popen, what: str, timeout: float = 60.0) -> None:
    """Until `ready()`; refused if `proc` exits first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited ({proc.returncode}) before {what} was ready")
        if ready():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{proc.args[0]}: {what} not ready after {timeout:.0f} s")


class Processes:
    """The started processes (in this process's group: a kill of the group ends them too), each
    logging to `<logs>/<name>.log` through `pump`."""

    def __init__(self, logs: Path, numerics: Numerics = "native"):
        self.logs, self.procs = private_folder(logs), []
        # Flower starts its own helpers (flwr-serverapp, flwr-clientapp) from PATH; each SuperExec and
        # executor looks for a message to run every TASK_POLL seconds (Flower's default: 1)
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        self.env = {POLL_VARIABLE: str(TASK_POLL), **os.environ, "PATH": path}
        if bad := conflicts(numerics, self.env):  # the server and nodes pin before torch is imported
            raise NumericsError(f"--numerics {numerics}, but the environment sets {', '.join(bad)}")
        self.env.update(environment(numerics))

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = BoundedLog(self.logs / f"{name}.log")
        # umask 077: whatever it creates (the database, node states, the run's files) is its owner's only
        proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**self.env, **(env or {})}, umask=PRIVATE_UMASK
        )
        thread = threading.Thread(target=pump, args=(proc.stdout, log), name=f"log-{name}", daemon=True)
        thread.start()
        self.procs.append((name, proc, (thread, log)))
        return proc

    def run(self, args: list[str]) -> None:
        done = subprocess.run(args, capture_output=True, text=True, env=self.env, timeout=60, umask=PRIVATE_UMASK)
        if done.returncode:
            raise RuntimeError(f"{' '.join(args[:3])}: {(done.stderr or done.stdout).strip()[-500:]}")

    def dead(self) -> str | None:
        return next((f"{name} exited ({p.returncode})" for name, p, _ in self.procs if p.poll() is not None), None)

    def stop(self) -> None:
        for _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for _, proc, (thread, log) in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            thread.join(timeout=10)
            log.close()


def up(fed: LocalFederation) -> int:
    """Start the federation, wait until interrupted or a process dies, stop everything; the exit code."""
    raise_fd_limit()  # before anything starts: every process up starts inherits it (nginx sizes its caps by it)
    sites = fed.node_data()
    check_ports(fed.port, 2 + len(sites))
    tls = fed.tls(sites)
    procs = Processes(fed.logs or fed.sites / "logs", fed.numerics)
    stop, hangups = {"signal": 0}, []

    def interrupted(signum: int, _frame: object) -> None:
        stop["signal"] = signum

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGHUP, lambda *_: hangups.append(1))
    try:
        secret = None if fed.insecure else superexec_secret(fed.keys / "superexec.secret")
        config, rebind = start_link(fed, tls, secret, procs, len(sites))
        start_nodes(fed, sites, tls, secret, procs)
        print(startup_line(fed, sites, tls is not None, config, procs.logs), flush=True)
        while not stop["signal"]:
            dead = procs.dead()
            if dead:
                print(f"incofl federation up: {dead}; see {procs.logs}; stopping", file=sys.stderr)
                return 1
            if hangups:
                hangups.clear()
                print(rebound(rebind, fed.keys), flush=True)
            time.sleep(0.5)
        return 0
    finally:
        procs.stop()


def rebound(rebind: Callable[[], None], keys: Path) -> str:
    """SIGHUP's line: each site's certificate bound again to `keys/node<K>.pub` (a site that changed
    its key, registered anew), or why not (nginx keeps the binding it had)."""
    try:
        rebind()
    except (ConfigError, OSError, ValueError) as err:
        return f"federation up: SIGHUP: the sites' port keeps its bindings: {err}"
    return f"federation up: SIGHUP: each site's certificate bound again to its node key in {keys} (nginx reloaded)"


def superexec_secret(path: Path) -> Path:
    """A fresh shared secret (0600) for the SuperExecs `up` starts: with it, only they can take
    the run's ServerApp task from the SuperLink's port and a node's messages from the node's."""
    import secrets

    from incofl.deploy.wire.credentials import write_secret

    write_secret(path, secrets.token_bytes(32))
    return path


def isolated(secret: Path | None) -> list[str]:
    """The flags with which a SuperLink or SuperNode waits for a SuperExec that proves itself with `secret`
    (Flower 1.42 reads the secret only in process isolation; without one, its default: its own SuperExec)."""
    return [] if secret is None else ["--isolation", "process", "--superexec-auth-secret-file", str(secret)]


def start_superexec(name: str, runtime: str, ca: Path, secret: Path | None, parent: int, procs: Processes) -> None:
    """The SuperExec that runs the SuperLink's ServerApps, from its Runtime API at `runtime` (none without a secret)."""
    if secret is None:
        return
    procs.start(
        name,
        [flower_tool("flower-superexec"), "--runtime-api-address", runtime, "--root-certificates", str(ca)]
        + ["--superexec-auth-secret-file", str(secret), "--parent-pid", str(parent)],
        {POLL_VARIABLE: os.environ.get(POLL_VARIABLE, str(SERVER_TASK_POLL))},
    )


def start_executor(name: str, runtime: str, secret: Path | None, parent: int, procs: Processes) -> None:
    """The warm executor (executor.py) that runs the messages of the SuperNode at `runtime` (none without a secret)."""
    if secret is None:
        return
    procs.start(
        name,
        [sys.executable, "-m", "incofl.deploy.executor", "--runtime-api-address", runtime]
        + ["--superexec-auth-secret-file", str(secret), "--parent-pid", str(parent)],
    )


def link_args(fed: LocalFederation) -> list[str]:
    """Flower's flags for where its SuperLink keeps state: in memory (its default), or with `disk`
    in a SQLite file, `<sites>/superlink/state.db`, made afresh (what an earlier up left is removed),
    so that what nodes push is not held in memory. Memory is the default: each request costs the
    SuperLink about half the CPU (docs/performance.md, Flower), and what a node can make it hold is
    the gate's budget of its unanswered replies (docs/federation.md, Threat model)."""
    if fed.link_state == "memory":
        return []
    folder = private_folder(fed.sites.resolve() / "superlink")
    for old in folder.glob("state.db*"):  # the database and its journal: this up's own files
        old.unlink()
    return ["--database", str(folder / "state.db")]


def start_link(
    fed: LocalFederation, tls: tuple[Path, Path, Path] | None, secret: Path | None, procs: Processes, nodes: int
) -> tuple[Path, Callable[[], None]]:
    """The SuperLink (superlink.py: its Fleet API on a unix socket in `<sites>/edge`, the rest on
    `port + 1`, 127.0.0.1), listening; nginx on `port` in front of its Fleet API (`start_edge`); and
    its SuperExec. The connection added to Flower's config, and what binds the sites' certificates
    again to the node keys in `<sites>/keys` (nginx reloads its configuration)."""
    folder = private_folder(fed.sites.resolve() / "edge")
    fleet = folder / "fleet.sock"
    security = ["--insecure"] if tls is None else ["--ssl-ca-certfile", str(tls[0])]
    security += [] if tls is None else ["--ssl-certfile", str(tls[1]), "--ssl-keyfile", str(tls[2])]
    security += [] if fed.insecure else ["--enable-supernode-auth"]
    link = procs.start(
        "superlink",
        [sys.executable, "-m", "incofl.deploy.superlink", "--fleet-socket", str(fleet), *security]
        + ["--max-message-mb", str(reply_cap_mib(fed))]
        + [*isolated(secret), "--disable-runtime-dependency-installation", *link_args(fed)]
        + ["--host", "127.0.0.1", "--port", str(fed.port + 1)],
    )
    wait_for_port(fed.port + 1, link)
    wait_for(fleet.exists, link, f"{fleet}")
    proxy = start_edge(edge_of(fed, tls, folder, nodes), procs)

    def rebind() -> None:
        edge_of(fed, tls, folder, nodes).check()  # written and tested; nginx keeps the last good one otherwise
        reload(proxy.pid)  # returns once no worker with the old bindings accepts a connection

    address = f"127.0.0.1:{fed.port + 1}"  # the Control and Runtime APIs: this machine's only
    if tls is not None:
        start_superexec("superexec-superlink", address, tls[0], secret, link.pid, procs)
    return add_connection(fed.connection, address, None if tls is None else tls[0]), rebind


def reply_cap_mib(fed: LocalFederation) -> float:
    """The gate's cap on one reply, in MiB: what the facts file (`incofl federation export`) states
    from the run's models, else DEFAULT_REPLY_CAP."""
    from incofl.deploy.server.serverdata import FACTS, stated_reply_cap

    cap = stated_reply_cap(fed.keys / FACTS)
    return DEFAULT_REPLY_CAP if cap is None else round(cap / (1 << 20), 3)


def edge_of(fed: LocalFederation, tls: tuple[Path, Path, Path] | None, folder: Path, nodes: int) -> Edge:
    """nginx's settings for this federation: the sites' port on 127.0.0.1, where every node of this
    machine dials from (its nodes and SITES_APART more), each site certificate (`CN=node<K>`) bound
    to the node key `<sites>/keys/node<K>.pub` (none without TLS), the gate's caps per route, and
    this process's open-file limit (`up` raised it to its hard limit first: children inherit it)."""
    from incofl.deploy.flower.fleet import route_caps

    bound = site_bindings(fed.keys) if tls is not None and not fed.insecure else {}
    sites_at = {"127.0.0.1": nodes + SITES_APART}
    user = pwd.getpwuid(os.geteuid()).pw_name if os.geteuid() == 0 else ""
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return Edge(f"127.0.0.1:{fed.port}", folder, folder / "fleet.sock", tls, bound, route_caps(), sites_at, files, user)


def start_edge(edge: Edge, procs: Processes) -> subprocess.Popen:
    """nginx with `edge`'s configuration (tested first: a refusal in one line), listening on the sites' port."""
    edge.check()
    proxy = procs.start("edge", [nginx(), *edge.args(edge.folder / "nginx.conf")])
    wait_for_port(int(edge.listen.rpartition(":")[2]), proxy)
    return proxy


def start_nodes(
    fed: LocalFederation,
    sites: dict[int, tuple[str, Path]],
    tls: tuple[Path, Path, Path] | None,
    secret: Path | None,
    procs: Processes,
) -> None:
    """One SuperNode per client's data (`LocalFederation.node_data`; unless insecure, its key
    registered first) and its executor."""
    from incofl.deploy.wire.credentials import node_certificate, node_key

    for i, (client, (data, path)) in enumerate(sorted(sites.items())):
        security = ["--insecure"] if tls is None else ["--root-certificates", str(tls[0])]
        if tls is not None:  # the certificate the sites' port asks for (supernode.py)
            cert, key = node_certificate(tls[0].parent, client)
            security += ["--client-certificate", str(cert), "--client-key", str(key)]
        auth, signer = [], ""
        if not fed.insecure:
            private, public = node_key(fed.keys, client)
            procs.run([flower_tool("flwr"), "supernode", "register", str(public), fed.connection])
            auth = ["--auth-supernode-private-key", str(private)]
            signer = f' node-key="{private}"'  # its replies signed with its key (wire/signing.py)
        port = fed.port + 2 + i
        node = procs.start(
            f"supernode{client}",
            [sys.executable, "-m", "incofl.deploy.supernode", *security, *auth, *isolated(secret)]
            + ["--superlink", f"127.0.0.1:{fed.port}", "--port", str(port)]
            + ["--node-config", f'client={client} {data}="{path}"{server_key_entry(fed, data)}{signer}'],
        )
        # a node's runtime API is plain HTTP on 127.0.0.1 (Flower's default): the secret is what guards it
        start_executor(f"executor{client}", f"127.0.0.1:{port}", secret, node.pid, procs)


def server_key_entry(fed: LocalFederation, data: str) -> str:
    """The node config entry of the server's public key for a node whose `data` is its site's own
    (an exported file carries the key)."""
    return "" if data == DATA_PATH else f' server-key="{fed.server_public}"'


def startup_line(fed: LocalFederation, sites: Collection[int], tls: bool, config: Path, logs: Path) -> str:
    """What is up, who can use it, and the `flwr run` that runs on it."""
    clients = ", ".join(map(str, sorted(sites)))
    if fed.insecure:
        security = "no TLS, no node authentication: any node may claim any client and traffic is plain"
        server = fed.keys / "server"  # export's: the nodes act only on what it signs (wire/signing.py)
        keys = (f' server-key="{server}"' if server.exists() else "") + " insecure=true"  # no node-keys: say so
    else:
        security = f"TLS, node authentication: client K is the node with key {fed.keys}/nodeK"
        keys = f' node-keys="{fed.keys}"'
    return (
        f"federation up: SuperLink 127.0.0.1:{fed.port} (its Fleet API only, for the nodes; {security}), "
        f"{len(sites)} nodes (clients {clients}); connection {fed.connection} in {config}; logs in {logs}\n"
        f"who can run code: anyone who can connect to 127.0.0.1:{fed.port + 1} (the Control API) can flwr run an "
        "app that runs as this user (Flower has no user authentication without OIDC): on a shared host any local "
        "user; keep it to you "
        "with a network namespace or container, or iptables -m owner (docs/federation.md, Threat model)\n"
        f"run (with the config and --set the files were exported with): flwr run flower-app {fed.connection} "
        f'--run-config \'config="FILE" set="KEY=VALUE ..." out="RUN_DIR"{keys}\''
    )
