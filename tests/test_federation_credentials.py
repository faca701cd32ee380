"""What `incofl federation up` and `export --keys` secure a federation with (deploy/wire/credentials.py,
up.py): private keys that no other user can read at any moment, node keys made once, a
server certificate the CA signs for 127.0.0.1, and a start-up line that says what is secured
and who can run code. Fast: nothing is started."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

if not os.environ.get("CI"):
    pytest.importorskip("flwr", reason="the flower extra is not installed (pip install -e '.[flower]')")

from incofl.deploy.up import LocalFederation, startup_line  # noqa: E402
from incofl.deploy.wire import credentials, signing  # noqa: E402


@pytest.fixture
def open_umask():
    """A umask that lets every file be read and written by anyone: only an explicit mode protects a key."""
    old = os.umask(0)
    yield
    os.umask(old)


def test_a_private_key_is_0600_from_the_moment_it_exists_and_renamed_into_place(tmp_path, monkeypatch, open_umask):
    seen = []
    replace = os.replace

    def checked(src: str | Path, dst: str | Path) -> None:
        seen.append((Path(dst).name, os.stat(src).st_mode & 0o777))  # the file before it has its name
        replace(src, dst)

    monkeypatch.setattr(os, "replace", checked)  # every atomic write renames through it
    private, public = credentials.node_key(tmp_path / "keys", 3)
    assert (private.name, public.name) == ("node3", "node3.pub")
    assert ("node3", 0o600) in seen and private.stat().st_mode & 0o777 == 0o600
    ca, server, key = credentials.certificates(tmp_path / "certificates", clients=[3])
    for secret in ("server.key", "ca.key", "node3.key"):  # the CA's key and a site's TLS key too
        assert (secret, 0o600) in seen and (ca.parent / secret).stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(
        ["keys", "node3", "node3.pub", "certificates", "ca.pem", "ca.key", "server.pem", "server.key"]
        + ["node3.pem", "node3.key"]
    )  # no temporary left


def test_a_node_key_is_made_once_and_its_public_half_derived_when_missing(tmp_path):
    from cryptography.hazmat.primitives import serialization

    private, public = credentials.node_key(tmp_path, 0)
    first = private.read_bytes(), public.read_bytes()
    public.unlink()
    assert credentials.node_key(tmp_path, 0) == (private, public)
    assert (private.read_bytes(), public.read_bytes()) == first
    key = serialization.load_ssh_public_key(public.read_bytes())
    assert key.curve.name == "secp384r1"  # type: ignore[attr-defined]


def test_the_server_certificate_is_signed_by_the_ca_for_127_0_0_1(tmp_path):
    import ipaddress

    from cryptography import x509

    ca_path, server_path, _ = credentials.certificates(tmp_path)
    ca, server = (x509.load_pem_x509_certificate(p.read_bytes()) for p in (ca_path, server_path))
    server.verify_directly_issued_by(ca)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)
    before = ca_path.read_bytes()
    credentials.certificates(tmp_path, clients=[0])  # present: used as they are; a site's issued by the CA
    assert ca_path.read_bytes() == before
    node = x509.load_pem_x509_certificate((tmp_path / "node0.pem").read_bytes())
    node.verify_directly_issued_by(ca)


def test_a_folder_without_the_cas_key_cannot_issue_a_sites_certificate(tmp_path):
    """Certificates an earlier incofl made (the CA's key not kept) or one's own: a site's missing
    certificate is refused in one line saying what to do, never made with another CA."""
    from incofl.config import ConfigError

    credentials.certificates(tmp_path, clients=[0])
    (tmp_path / "ca.key").unlink()
    credentials.certificates(tmp_path, clients=[0])  # what is there is used
    with pytest.raises(ConfigError, match="no node1.pem and no ca.key to issue it with.*remove the folder"):
        credentials.certificates(tmp_path, clients=[1])


def test_the_startup_line_says_what_is_secured_and_who_can_run_code(tmp_path):
    sites, config, logs = {0: tmp_path / "site0.npz", 1: tmp_path / "site1.npz"}, tmp_path / "c.toml", tmp_path
    secure = startup_line(LocalFederation(tmp_path), sites, True, config, logs)
    assert "TLS, node authentication" in secure and f'node-keys="{tmp_path.resolve() / "keys"}"' in secure
    insecure = startup_line(LocalFederation(tmp_path, insecure=True), sites, False, config, logs)
    assert "any node may claim any client and traffic is plain" in insecure and "node-keys" not in insecure
    assert "insecure=true" in insecure and "insecure" not in secure.splitlines()[2]
    for line in (secure, insecure):
        assert "on a shared host any local user" in line and line.count("\n") == 2


def test_site_files_keys_and_logs_are_created_private_and_loose_ones_refused(tmp_path, open_umask):
    """Under a umask that lets anyone read: a site's data file 0600, the keys folder 0700; an existing
    site file, private key, server key, secret or logs folder that group or others may read is refused
    in one line naming it (issue 51: they were written 0644 in a 0755 folder, and reused unchecked)."""
    from federation_helpers import read_site, write_config

    from incofl.config import ConfigError, load_run_config
    from incofl.deploy.up import Processes

    config = write_config(tmp_path, clients=2, ratio=1.0, rounds=1)
    from incofl.cli import run as incofl

    assert incofl(["federation", "export", "--config", str(config), "--out", str(tmp_path / "sites"), "--keys"]) == 0
    sites = tmp_path / "sites"
    assert (sites / "site0.npz").stat().st_mode & 0o777 == 0o600
    assert (sites / "keys").stat().st_mode & 0o777 == 0o700
    assert {p.stat().st_mode & 0o777 for p in (sites / "keys").iterdir()} == {0o600}
    fed = LocalFederation(sites)
    assert set(fed.site_files()) == {0, 1}
    credentials.certificates(sites / "certificates")
    loose = [sites / "site1.npz", sites / "keys" / "node1", sites / "certificates" / "server.key"]
    loose += [sites / "keys" / "server", sites / "keys" / "node0"]
    for path in loose:
        path.chmod(0o644)
    cfg = load_run_config(config)
    checks = [
        (lambda: read_site(sites / "site1.npz", cfg, 1), sites / "site1.npz"),
        (fed.site_files, sites / "site1.npz"),
        (lambda: credentials.node_key(sites / "keys", 1), sites / "keys" / "node1"),
        (lambda: credentials.certificates(sites / "certificates"), sites / "certificates" / "server.key"),
        (lambda: signing.server_key_pair(sites / "keys"), sites / "keys" / "server"),  # the ServerApp's signing key
        (lambda: signing.private_key(sites / "keys" / "node0"), sites / "keys" / "node0"),  # a node's node-key
    ]
    for check, path in checks:
        with pytest.raises(ConfigError, match=f"^{path}: readable by group or others \\(mode 0644\\); chmod 600 it"):
            check()
    (sites / "keys").chmod(0o755)
    with pytest.raises(ConfigError, match="keys: readable by group or others .*chmod 700"):
        credentials.node_key(sites / "keys", 0)
    (tmp_path / "logs").mkdir(mode=0o755)
    with pytest.raises(ConfigError, match="logs: readable by group or others"):
        Processes(tmp_path / "logs")
    import torch

    from incofl.deploy.site.client import SavedStores

    states = SavedStores(tmp_path / "site0.state" / "run", every=1)  # a node's saved stores
    states.save(1, {"c": torch.zeros(2)})
    assert states.folder.stat().st_mode & 0o777 == 0o700 and states.at(1) is not None
    states.folder.chmod(0o755)
    with pytest.raises(ConfigError, match="run: readable by group or others .*chmod 700"):
        states.at(1)


def test_the_executor_refuses_a_poll_interval_out_of_flowers_bounds_and_a_loose_secret(tmp_path, monkeypatch, capsys):
    """As Flower's SuperExec does (0.01..60 s), in one line, exit 2, before it asks anything."""
    from incofl.deploy import executor

    secret = tmp_path / "secret"
    credentials.write_secret(secret, b"s" * 32)
    argv = ["--runtime-api-address", "127.0.0.1:1", "--superexec-auth-secret-file", str(secret)]
    argv += ["--parent-pid", str(os.getpid())]
    for bad in ("0", "61", "nan", "soon"):
        monkeypatch.setenv("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", bad)
        with pytest.raises(SystemExit) as stop:
            executor.main(argv)
        assert stop.value.code == 2 and "between 0.01 and 60.0" in capsys.readouterr().err
    monkeypatch.setenv("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.25")
    secret.chmod(0o640)
    with pytest.raises(SystemExit) as stop:
        executor.main(argv)
    assert stop.value.code == 2 and "readable by group or others" in capsys.readouterr().err


def test_the_superlink_wrapper_keeps_the_control_api_on_loopback(capsys, tmp_path):
    """Its Control and Runtime APIs (Flower's --host) on a loopback address only, or one line, exit 2."""
    from incofl.deploy.superlink import parse

    socket = tmp_path / "fleet.sock"
    limits, flower = parse(["--fleet-socket", str(socket), "--host", "127.0.0.1", "--port", "9093", "--insecure"])
    assert limits.fleet == socket and flower == ["--host", "127.0.0.1", "--port", "9093", "--insecure"]
    for argv in (["--host", "0.0.0.0"], ["--host=10.0.0.1"], ["--control-api-address", "0.0.0.0:9093"]):
        with pytest.raises(SystemExit) as stop:
            parse(["--fleet-socket", str(socket), *argv])
        assert stop.value.code == 2 and capsys.readouterr().err.strip().splitlines()[-1].startswith("python -m")


def test_the_fleet_socket_and_the_message_cap_are_refused_in_one_line_when_they_cannot_hold(capsys, tmp_path):
    """A Fleet socket in a folder others may enter (uvicorn makes the socket 0666: its folder is what
    keeps others out) and a cap that is not positive are refused before anything starts (one line,
    exit 2); so are a site's certificate without its key and a key others may read."""
    from incofl.deploy.superlink import parse
    from incofl.deploy.supernode import parse as node_parse

    private, shared = tmp_path / "private", tmp_path / "shared"
    private.mkdir(mode=0o700)
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    assert parse(["--fleet-socket", str(private / "f.sock"), "--insecure"])[0].max_message == 512 << 20
    refused = [
        (["--fleet-socket", str(shared / "f.sock")], "its folder must exist and be private"),
        (["--fleet-socket", str(private / "f.sock"), "--max-message-mb", "0"], "--max-message-mb must be positive"),
    ]
    for argv, why in refused:
        with pytest.raises(SystemExit) as stop:
            parse([*argv, "--insecure"])
        assert stop.value.code == 2 and why in capsys.readouterr().err.strip().splitlines()[-1]
    loose = tmp_path / "node0.key"
    credentials.write_secret(loose, b"k")
    loose.chmod(0o644)
    for argv, why in [
        (["--client-key", str(loose)], "--client-certificate and --client-key go together"),
        (["--client-certificate", "c.pem", "--client-key", str(loose)], "readable by group or others"),
    ]:
        with pytest.raises(SystemExit) as stop:
            node_parse(argv)
        assert stop.value.code == 2 and why in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_run_without_node_keys_is_refused_unless_insecure():
    """Binding clients to their sites' keys is the default: a run config without `node-keys` is
    refused in one line unless it says `insecure=true` (issue 51: it was a warning)."""
    from incofl.config import ConfigError
    from incofl.deploy.server.serverapp import AppSettings

    with pytest.raises(ConfigError, match="^run config: node-keys: set the folder .* or insecure=true"):
        AppSettings.of({"out": "run"})
    assert AppSettings.of({"out": "run", "insecure": True}).node_keys is None
    assert AppSettings.of({"out": "run", "node-keys": "keys"}).node_keys == Path("keys")
