"""Signatures on a federation's messages, both ways, independent of what Flower checks.

Every instruction the ServerApp sends (identify, train, evaluate) is signed with the server's
key, `keys/server` (made by `incofl federation export`, whose public half each site's data file
carries: site/sitedata.py), and a node acts on nothing else; every reply a node sends is signed with
its site's node key (`keys/node<client>`, the key it authenticates to the SuperLink with), and
the ServerApp checks it against that client's registered public key before it reads anything
else. What is signed is a statement (`statement`): a canonical encoding (JSON, keys sorted, no
spaces) of what the message is and answers and of the SHA-256 of its content (`digest`: every
record, every entry by name, each value type-tagged, each array's dtype, shape and the SHA-256 of
its bytes), so that no header Flower carries (source node, reply-to id) is trusted:

- an instruction: the run, the node it is for, its type and round, its content;
- a reply: the run, the round, the client, the id and type of the instruction it answers, its content;
- a node's failure (an error reply, whose one line is all it holds: codec.sign_failure): the run,
  the client, the id and type of the instruction it answers, the line.

ECDSA with SHA-384 over P-384 keys (those `export --keys` and `ssh-keygen -t ecdsa -b 384` make,
which Flower's node authentication takes), from `cryptography`. This module imports no Flower
(a message's records are read by their attributes): the codec attaches and strips the signature.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from incofl.config import ConfigError

ALGORITHM = ec.ECDSA(hashes.SHA384())
SERVER = "server"  # the server's key pair in a keys folder: `server` and `server.pub`


class SignatureError(ValueError):
    """A message whose signature is missing, malformed or not its signer's."""


def _value(value: Any) -> Any:
    """A record value, tagged by its type (a bool is no int, a float exact in hex)."""
    if isinstance(value, bool):
        return ["b", int(value)]
    if isinstance(value, int):
        return ["i", value]
    if isinstance(value, float):
        return ["f", value.hex()]
    if isinstance(value, str):
        return ["s", value]
    if isinstance(value, bytes):
        return ["y", value.hex()]
    if isinstance(value, list):
        return ["l", [_value(v) for v in value]]
    raise SignatureError(f"a record value of type {type(value).__name__}, which no message holds")


def _array(array: Any) -> list[Any]:
    return ["a", str(array.dtype), list(array.shape), str(array.stype), hashlib.sha256(array.data).hexdigest()]


def digest(content: Any, leave_out: str = "") -> str:
    """SHA-256 of a message's content (a Flower RecordDict) in its canonical form (module
    docstring), the record `leave_out` left out."""
    records: dict[str, Any] = {}
    for kind, group in (
        ("array", content.array_records),
        ("metric", content.metric_records),
        ("config", content.config_records),
    ):
        for name, record in group.items():
            if name != leave_out:
                entries = {key: _array(v) if kind == "array" else _value(v) for key, v in record.items()}
                records[name] = [kind, entries]
    return hashlib.sha256(canonical(records)).hexdigest()


def canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def statement(kind: str, **fields: int | str) -> bytes:
    """What is signed: the kind of message (`instruction` or `reply`) and its fields, canonical."""
    return canonical({"kind": kind, **fields})


def sign(key: ec.EllipticCurvePrivateKey, text: bytes) -> bytes:
    return key.sign(text, ALGORITHM)


def verify(public: ec.EllipticCurvePublicKey, text: bytes, signature: bytes, signer: str) -> None:
    """Refuse (SignatureError, one line naming `signer`) a signature that is not `signer`'s on `text`."""
    try:
        public.verify(signature, text, ALGORITHM)
    except (InvalidSignature, ValueError):  # a malformed signature too
        raise SignatureError(f"its signature is not {signer}'s") from None


def private_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """An EC private key in OpenSSH format (a node's, the server's); refused in one line, as is one
    that group or others may read (it may have been read already: credentials.check_private)."""
    from incofl.deploy.wire.credentials import check_private

    try:
        key = serialization.load_ssh_private_key(check_private(path).read_bytes(), password=None)
    except ConfigError:
        raise
    except (OSError, ValueError, TypeError) as err:
        raise ConfigError(f"{path}: not an unencrypted OpenSSH private key ({str(err)[:80]})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{path}: not an ECDSA key (make one with ssh-keygen -t ecdsa -b 384)")
    return key


def public_key(data: bytes, what: str) -> ec.EllipticCurvePublicKey:
    """An EC public key, OpenSSH (a site's file), PEM (as Flower's SuperLink holds a node's) or DER
    (SubjectPublicKeyInfo); refused in one line naming `what`."""
    try:
        if data.startswith(b"ecdsa-"):
            key = serialization.load_ssh_public_key(data)
        elif data.startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(data)
        else:
            key = serialization.load_der_public_key(data)
    except (ValueError, TypeError):
        raise ConfigError(f"{what}: not an ECDSA public key") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise ConfigError(f"{what}: not an ECDSA public key")
    return key


def server_key_pair(folder: Path) -> tuple[Path, Path]:
    """The server's key pair in `folder` (`server`, `server.pub`: P-384, OpenSSH), made once."""
    from incofl.deploy.wire.credentials import write_public, write_secret

    private, public = folder / SERVER, folder / f"{SERVER}.pub"
    if private.exists():
        key = private_key(private)
    else:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP384R1())
        ssh = serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        write_secret(private, key.private_bytes(*ssh))
    if not public.exists():
        write_public(public, openssh(key.public_key()))
    return private, public


def openssh(public: ec.EllipticCurvePublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
