"""A federation on this machine (`incofl federation up`): a SuperLink on 127.0.0.1 and one
SuperNode per site data file (`incofl federation export`), each node told its client and file,
and a connection in Flower's config (`$FLWR_HOME/config.toml`, `~/.flwr/config.toml` by default)
for `flwr run`. It runs until interrupted (Ctrl-C or SIGTERM), then stops every process it
started; one that dies stops the rest, naming it.

Without `certificates` the APIs are plain (loopback only); with a folder holding `ca.pem`,
`server.pem` and `server.key` (a server certificate for 127.0.0.1), TLS on every API. With
`auth`, node authentication: each node gets a P-384 key pair (in `<sites>/keys/`), registered
with `flwr supernode register` before it starts; the SuperLink refuses any other node.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from incofl.config import ConfigError

CONNECTION = "incofl-local"  # the connection `flwr run` names


@dataclass(frozen=True)
class LocalFederation:
    """What `incofl federation up` starts (module docstring)."""

    sites: Path
    port: int = 9092
    connection: str = CONNECTION
    certificates: Path | None = None
    auth: bool = False
    logs: Path | None = None

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
            files[client] = path.resolve()
        if not files:
            raise ConfigError(
                f"--sites {self.sites}: no site data files (*.npz); make them with incofl federation export"
            )
        return files

    def tls(self) -> tuple[Path, Path, Path] | None:
        if self.certificates is None:
            return None
        paths = tuple(self.certificates / name for name in ("ca.pem", "server.pem", "server.key"))
        missing = [p.name for p in paths if not p.is_file()]
        if missing:
            raise ConfigError(f"--certificates {self.certificates}: no {', '.join(missing)}")
        return paths  # type: ignore[return-value]


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
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"flower-superlink exited ({proc.returncode}) before listening on {port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"flower-superlink: nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")


def node_key(folder: Path, client: int) -> tuple[Path, Path]:
    """A node's P-384 key pair in OpenSSH format (what SuperNode authentication reads), made once."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private, public = folder / f"node{client}", folder / f"node{client}.pub"
    if not private.exists():
        folder.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP384R1())
        encoding, ssh = serialization.Encoding, serialization.PrivateFormat.OpenSSH
        public.write_bytes(key.public_key().public_bytes(encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
        private.write_bytes(key.private_bytes(encoding.PEM, ssh, serialization.NoEncryption()))
        private.chmod(0o600)
    return private, public


class Processes:
    """The started processes (in this process's group: a kill of the group ends them too)."""

    def __init__(self, logs: Path):
        self.logs, self.procs = logs, []
        logs.mkdir(parents=True, exist_ok=True)
        # Flower starts its own helpers (flower-superexec, flwr-serverapp, flwr-clientapp) from PATH
        self.env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "w")  # noqa: SIM115 (closed in stop)
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        self.procs.append((name, proc, log))
        return proc

    def run(self, args: list[str]) -> None:
        done = subprocess.run(args, capture_output=True, text=True, env=self.env, timeout=60)
        if done.returncode:
            raise RuntimeError(f"{' '.join(args[:3])}: {(done.stderr or done.stdout).strip()[-500:]}")

    def dead(self) -> str | None:
        return next((f"{name} exited ({p.returncode})" for name, p, _ in self.procs if p.poll() is not None), None)

    def stop(self) -> None:
        for _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for _, proc, log in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()


def up(fed: LocalFederation) -> int:
    """Start the federation, wait until interrupted or a process dies, stop everything; the exit code."""
    sites, tls = fed.site_files(), fed.tls()
    check_ports(fed.port, 1 + len(sites))
    address = f"127.0.0.1:{fed.port}"
    procs = Processes(fed.logs or fed.sites / "logs")
    stop = {"signal": 0}

    def interrupted(signum: int, _frame: object) -> None:
        stop["signal"] = signum

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    try:
        security = ["--insecure"] if tls is None else ["--ssl-ca-certfile", str(tls[0])]
        security += [] if tls is None else ["--ssl-certfile", str(tls[1]), "--ssl-keyfile", str(tls[2])]
        link = procs.start(
            "superlink",
            [flower_tool("flower-superlink"), *security, *(["--enable-supernode-auth"] if fed.auth else [])]
            + ["--disable-runtime-dependency-installation", "--host", "127.0.0.1", "--port", str(fed.port)],
        )
        wait_for_port(fed.port, link)
        config = add_connection(fed.connection, address, None if tls is None else tls[0])
        node_security = ["--insecure"] if tls is None else ["--root-certificates", str(tls[0])]
        for i, (client, path) in enumerate(sorted(sites.items())):
            auth = []
            if fed.auth:
                private, public = node_key(fed.sites / "keys", client)
                procs.run([flower_tool("flwr"), "supernode", "register", str(public), fed.connection])
                auth = ["--auth-supernode-private-key", str(private)]
            procs.start(
                f"supernode{client}",
                [flower_tool("flower-supernode"), *node_security, *auth, "--superlink", address]
                + ["--port", str(fed.port + 1 + i), "--node-config", f'client={client} data-path="{path}"'],
            )
        print(
            f"federation up: SuperLink {address} ({'TLS' if tls else 'no TLS'}"
            f"{', node authentication' if fed.auth else ''}), {len(sites)} nodes (clients "
            f"{', '.join(map(str, sorted(sites)))}); connection {fed.connection} in {config}; logs in {procs.logs}\n"
            f"run (with the config and --set the files were exported with): flwr run flower-app {fed.connection} "
            '--run-config \'config="FILE" set="KEY=VALUE ..." out="RUN_DIR"\'',
            flush=True,
        )
        while not stop["signal"]:
            dead = procs.dead()
            if dead:
                print(f"incofl federation up: {dead}; see {procs.logs}; stopping", file=sys.stderr)
                return 1
            time.sleep(0.5)
        return 0
    finally:
        procs.stop()
