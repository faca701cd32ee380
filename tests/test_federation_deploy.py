"""A real deployment on 127.0.0.1 (docs/federation.md), started as a user starts one: site data
files, `incofl federation up` with TLS (a CA and server certificate made here) and node
authentication (a key per node, registered), which runs flower-superlink and one
flower-supernode per client, then `flwr run` of the app in flower-app/ on a short digits
InCoAvg run. Each node reads only its own data file; the run's summary equals the simulator's.
The fixture's finalizer stops `incofl federation up`, which stops every process it started."""

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


def _free_port(n: int) -> int:
    """The first of `n` consecutive free ports (the SuperLink's, then its nodes')."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = s.getsockname()[1]
        if first + n < 65536 and all(_free(first + i) for i in range(n)):
            return first
    raise RuntimeError("no free ports")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


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


@pytest.fixture
def federation(tmp_path):
    """`incofl federation up`'s process (its own process group) and its environment; stopped by SIGTERM."""
    home = tmp_path / "flwr-home"
    home.mkdir()
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        "PYTHONPATH": str(REPO / "src"),
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
    }
    started: list[subprocess.Popen] = []

    def up(*args: str | Path) -> subprocess.Popen:
        log = open(tmp_path / "up.log", "w")  # noqa: SIM115 (closed with the process)
        argv = [sys.executable, "-m", "incofl.cli", "federation", "up", *map(str, args)]
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        started.append(proc)
        return proc

    yield up, env
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # up stops its SuperLink and SuperNodes
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait_for(path: Path, proc: subprocess.Popen, logs: Path, timeout: float, text: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() or text not in path.read_text():
        if time.monotonic() > deadline or proc.poll() is not None:
            tails = {p.name: p.read_text()[-1500:] for p in logs.rglob("*.log")}
            pytest.fail(f"{path.name} not written within {timeout:.0f} s; logs: {json.dumps(tails, indent=1)}")
        time.sleep(0.5)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_localhost_deployment_with_tls_and_node_authentication_equals_the_simulator(tmp_path, federation):
    up, env = federation
    config = write_config(tmp_path, **DEPLOYED)
    cfg = load_run_config(config)
    sites = tmp_path / "sites"
    sites.mkdir()
    for site in export_sites(cfg, sites):
        assert Path(site["data-path"]).parent == sites
    certificates = tmp_path / "certificates"
    certificates.mkdir()
    _certificates(certificates)
    port = _free_port(1 + cfg.clients)
    proc = up("--sites", sites, "--port", port, "--certificates", certificates, "--auth", "--connection", "tls")
    _wait_for(tmp_path / "up.log", proc, tmp_path, timeout=120, text="federation up:")
    toml = (tmp_path / "flwr-home" / "config.toml").read_text()
    assert "[superlink.tls]" in toml and "root-certificates" in toml and "insecure" not in toml
    out = tmp_path / "deployed"
    run_config = f'config="{config}" out="{out}" round-timeout=120 join-timeout=60'
    done = subprocess.run(
        [BIN / "flwr", "run", REPO / "flower-app", "tls", "--run-config", run_config],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    _wait_for(out / "summary.json", proc, tmp_path, timeout=400)
    deployed = json.loads((out / "summary.json").read_text())
    simulated = train(cfg, tmp_path / "simulator")
    assert deployed["state_sha256"] == simulated["state_sha256"]
    assert deployed["final_acc"] == simulated["final_acc"]
    assert sorted(p.name for p in (sites / "keys").glob("*.pub")) == ["node0.pub", "node1.pub"]  # registered
