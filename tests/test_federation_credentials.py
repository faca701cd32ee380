"""What `incofl federation up` and `export --keys` secure a federation with (deploy/credentials.py,
local.py): private keys that no other user can read at any moment, node keys made once, a
server certificate the CA signs for 127.0.0.1, and a start-up line that says what is secured
and who can run code. Fast: nothing is started."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

if not os.environ.get("CI"):
    pytest.importorskip("flwr", reason="the flower extra is not installed (pip install -e '.[flower]')")

from incofl.deploy import credentials  # noqa: E402
from incofl.deploy.local import LocalFederation, startup_line  # noqa: E402


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
    ca, server, key = credentials.certificates(tmp_path / "certificates")
    assert ("server.key", 0o600) in seen and key.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(
        ["keys", "node3", "node3.pub", "certificates", "ca.pem", "server.pem", "server.key"]
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
    credentials.certificates(tmp_path)  # present: used as they are
    assert ca_path.read_bytes() == before


def test_the_startup_line_says_what_is_secured_and_who_can_run_code(tmp_path):
    sites, config, logs = {0: tmp_path / "site0.npz", 1: tmp_path / "site1.npz"}, tmp_path / "c.toml", tmp_path
    secure = startup_line(LocalFederation(tmp_path), sites, True, config, logs)
    assert "TLS, node authentication" in secure and f'node-keys="{tmp_path.resolve() / "keys"}"' in secure
    insecure = startup_line(LocalFederation(tmp_path, insecure=True), sites, False, config, logs)
    assert "any node may claim any client and traffic is plain" in insecure and "node-keys" not in insecure
    for line in (secure, insecure):
        assert "on a shared host any local user" in line and line.count("\n") == 2
