"""A real deployment on 127.0.0.1 (docs/federation.md): flower-superlink and one flower-supernode
per client, TLS on every API (a CA and server certificate made here), node authentication
(each node's key registered with `flwr supernode register`), then `flwr run` of the app in
flower-app/ on a short digits InCoAvg run. Each node reads only its own data file; the run's
summary equals the simulator's. Every process is stopped by the fixture's finalizer."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

if not os.environ.get("CI"):
    pytest.importorskip("flwr", reason="the flower extra is not installed (pip install -e '.[flower]')")

from federation_helpers import export_sites, write_config  # noqa: E402

from incofl.config import load_run_config  # noqa: E402
from incofl.fl.engine.run import train  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DEPLOYED = {"clients": 2, "ratio": 1.0, "rounds": 2}  # two nodes, both training every round


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate it signs for 127.0.0.1 and localhost: (ca, cert, key) PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def certificate(subject: str, key, issuer: str, signer, ca: bool, sans: list | None = None):  # noqa: ANN001
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    ca = certificate("incofl test CA", ca_key, "incofl test CA", ca_key, True)
    sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    server = certificate("127.0.0.1", key, "incofl test CA", ca_key, False, sans)
    paths = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


def _node_key(folder: Path, client: int) -> tuple[Path, Path]:
    """A node's P-384 key pair in OpenSSH format (what SuperNode authentication reads)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    private, public = folder / f"node{client}", folder / f"node{client}.pub"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    )
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    )
    return private, public


class Processes:
    """Started processes, each in its own process group; `stop` ends them all (the finalizer)."""

    def __init__(self, folder: Path, env: dict[str, str]):
        self.folder, self.env, self.procs = folder, env, []

    def start(self, name: str, *args: str | Path) -> subprocess.Popen:
        log = open(self.folder / f"{name}.log", "w")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen(
            [str(a) for a in args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.folder,
            start_new_session=True,
        )
        self.procs.append((proc, log))
        return proc

    def run(self, *args: str | Path, timeout: float = 60) -> str:
        done = subprocess.run(
            [str(a) for a in args], capture_output=True, text=True, env=self.env, cwd=self.folder, timeout=timeout
        )
        assert done.returncode == 0, f"{args[:3]}: {done.stdout[-2000:]} {done.stderr[-2000:]}"
        return done.stdout

    def stop(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc, log in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.close()


@pytest.fixture
def processes(tmp_path):
    home = tmp_path / "flwr-home"
    home.mkdir()
    # Flower starts its own helpers (flower-superexec, flwr-serverapp, flwr-clientapp) from PATH
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        "PYTHONPATH": str(REPO / "src"),
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
    }
    procs = Processes(tmp_path, env)
    yield procs
    procs.stop()


def _wait_for(path: Path, procs: Processes, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            logs = {p.name: p.read_text()[-1500:] for p in procs.folder.glob("*.log")}
            pytest.fail(f"{path.name} not written within {timeout:.0f} s; logs: {json.dumps(logs, indent=1)}")
        time.sleep(0.5)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_localhost_deployment_with_tls_and_node_authentication_equals_the_simulator(tmp_path, processes):
    config = write_config(tmp_path, **DEPLOYED)
    cfg = load_run_config(config)
    sites = export_sites(cfg, tmp_path)
    ca, cert, key = _certificates(tmp_path)
    link, *node_ports = _free_ports(1 + cfg.clients)  # the SuperLink's APIs share one port (HTTP, 1.42)
    tls = ["--ssl-ca-certfile", ca, "--ssl-certfile", cert, "--ssl-keyfile", key]
    processes.start(
        "superlink",
        BIN / "flower-superlink",
        *tls,
        "--enable-supernode-auth",
        "--disable-runtime-dependency-installation",
        "--host",
        "127.0.0.1",
        "--port",
        link,
    )
    (processes.folder / "flwr-home" / "config.toml").write_text(
        f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "127.0.0.1:{link}"\n'
        f'root-certificates = "{ca}"\n'
    )
    time.sleep(3)  # the SuperLink's APIs up
    for site, port in zip(sites, node_ports, strict=True):
        private, public = _node_key(tmp_path, int(site["client"]))
        processes.run(BIN / "flwr", "supernode", "register", public, "local")
        processes.start(
            f"supernode{site['client']}",
            BIN / "flower-supernode",
            "--superlink",
            f"127.0.0.1:{link}",
            "--root-certificates",
            ca,
            "--auth-supernode-private-key",
            private,
            "--port",
            port,
            "--node-config",
            f'client={site["client"]} data-path="{site["data-path"]}"',
        )
    out = tmp_path / "deployed"
    run_config = f'config="{config}" out="{out}" round-timeout=120 join-timeout=60'
    processes.run(BIN / "flwr", "run", REPO / "flower-app", "local", "--run-config", run_config, timeout=120)
    _wait_for(out / "summary.json", processes, timeout=400)
    deployed = json.loads((out / "summary.json").read_text())
    simulated = train(cfg, tmp_path / "simulator")
    assert deployed["state_sha256"] == simulated["state_sha256"]
    assert deployed["final_acc"] == simulated["final_acc"]
