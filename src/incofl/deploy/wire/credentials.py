"""What a federation's processes prove themselves with: node key pairs (SuperNode
authentication, and what the ServerApp binds each client to) and a CA with a server
certificate and each site's client certificate for TLS (mutual on the sites' port), made with
`cryptography`.

Every file is written private: created 0600 and exclusively under a temporary name (so never
readable by another user, not even for a moment, and never through a planted symlink), flushed,
then renamed onto its name, in a folder made 0700. Existing files are used as they are, but a
secret (a private key, the server's key, a secret) or a folder of them that group or others may
read is refused in one line naming it (`check_private`): it may have been read already.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from incofl.atomic import atomic_path
from incofl.config import ConfigError

PEM = serialization.Encoding.PEM
CERTIFICATE_DAYS = 365
CA_NAME, CA_KEY = "incofl federation CA", "ca.key"


PRIVATE, PRIVATE_FOLDER = 0o600, 0o700


def check_private(path: Path) -> Path:
    """`path`, unless group or others may read (write, enter) it: then refused in one line naming it."""
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        fix = f"{PRIVATE_FOLDER:o}" if path.is_dir() else f"{PRIVATE:o}"
        raise ConfigError(f"{path}: readable by group or others (mode {mode:04o}); chmod {fix} it, or make it anew")
    return path


def private_folder(folder: Path) -> Path:
    """`folder`, made 0700 if missing (its parents as the umask says), refused if group or others may enter it."""
    folder.mkdir(mode=PRIVATE_FOLDER, parents=True, exist_ok=True)
    return check_private(folder)


def write_secret(path: Path, data: bytes) -> None:
    """`data` at `path`, readable by this user only from the moment the file exists (module docstring)."""
    with atomic_path(path, mode=PRIVATE) as tmp:
        tmp.write_bytes(data)


write_public = write_secret  # public halves too are created private; sharing them is the owner's choice


def node_key(folder: Path, client: int) -> tuple[Path, Path]:
    """Client `client`'s node key pair, `node<client>` and `node<client>.pub` in `folder`: P-384 in
    OpenSSH format (what `flower-supernode --auth-supernode-private-key` and `flwr supernode
    register` read), made once; a public key missing beside its private key is derived from it."""
    private, public = private_folder(folder) / f"node{client}", folder / f"node{client}.pub"
    if private.exists():
        key = serialization.load_ssh_private_key(check_private(private).read_bytes(), password=None)
    else:
        key = ec.generate_private_key(ec.SECP384R1())
        ssh = serialization.PrivateFormat.OpenSSH
        write_secret(private, key.private_bytes(PEM, ssh, serialization.NoEncryption()))
    if not public.exists():
        openssh = serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        write_public(public, key.public_key().public_bytes(*openssh))
    return private, public


def certificates(folder: Path, host: str = "127.0.0.1", clients: Iterable[int] = ()) -> tuple[Path, Path, Path]:
    """`ca.pem`, `server.pem` and `server.key` in `folder`: a CA and a server certificate it signs
    for `host` (and localhost), valid a year; made unless all three exist. The CA's key is kept
    beside them (`ca.key`, private) to issue each site's client certificate (`node_certificate`),
    made here for `clients`: the sites' port takes no TLS connection without one."""
    paths = private_folder(folder) / "ca.pem", folder / "server.pem", folder / "server.key"
    if all(p.exists() for p in paths):
        check_private(paths[2])
    else:
        ca_key, key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
        ca = _certificate(CA_NAME, ca_key, CA_NAME, ca_key, ca=True)
        sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(host))]
        server = _certificate(host, key, CA_NAME, ca_key, ca=False, sans=sans)
        write_secret(folder / CA_KEY, _pkcs8(ca_key))
        write_secret(paths[2], _pkcs8(key))
        write_public(paths[1], server.public_bytes(PEM))
        write_public(paths[0], ca.public_bytes(PEM))
        for old in folder.glob("node*.pem"):  # issued by the CA replaced: no longer valid
            old.unlink()
    for client in clients:
        node_certificate(folder, client)
    return paths


def given_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """`ca.pem`, `server.pem` and `server.key` in one's own `folder` (`--certificates`); refused in one
    line naming the missing ones."""
    paths = folder.resolve() / "ca.pem", folder.resolve() / "server.pem", folder.resolve() / "server.key"
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise ConfigError(f"--certificates {folder}: no {', '.join(missing)}")
    return paths


def node_certificate(folder: Path, client: int) -> tuple[Path, Path]:
    """`node<client>.pem` and `node<client>.key` in `folder`: the TLS client certificate with which
    client `client`'s site connects to the sites' port, issued once by the CA whose key is `ca.key`."""
    cert, key_path = folder / f"node{client}.pem", folder / f"node{client}.key"
    if cert.exists() and key_path.exists():
        check_private(key_path)
        return cert, key_path
    authority = folder / CA_KEY
    if not authority.exists():
        raise ConfigError(
            f"{folder}: no {cert.name} and no {CA_KEY} to issue it with (a folder an earlier incofl made, or "
            "certificates of your own): remove the folder to make it anew, or put your CA's node certificates there"
        )
    ca_key = serialization.load_pem_private_key(check_private(authority).read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP384R1())
    write_secret(key_path, _pkcs8(key))
    write_public(cert, _certificate(f"node{client}", key, CA_NAME, ca_key, ca=False).public_bytes(PEM))
    return cert, key_path


def _pkcs8(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: str,
    signer: ec.EllipticCurvePrivateKey,
    ca: bool,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERTIFICATE_DAYS))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(signer, hashes.SHA256())
