"""Where security material lives on disk, and reading it for the RPC layer.

A server's security directory (``--security-dir``) holds::

    ca.pem            the cluster CA's certificate (every server; what peers are checked against)
    ca.key            the CA's private key, 0600 (masters only; encrypted when the operator
                      gave a key file: ca.key is then PKCS#8 under that passphrase)
    server.pem/.key   this server's certificate and key, signed by the CA
    join.pem/.key     a join credential (a tablet server before its first start: used once to
                      have its CSR signed, then ignored)

A client's credentials directory (``nyala.connect(credentials=DIR)``, ``NYALA_CREDENTIALS``)
holds ``ca.pem``, ``client.pem`` and ``client.key``. Private keys are written 0600 and their
directory 0700; nothing here logs a key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from nyala.errors import InvalidArgumentError

CA_CERT = "ca.pem"
CA_KEY = "ca.key"
SERVER_CERT = "server.pem"
SERVER_KEY = "server.key"
JOIN_CERT = "join.pem"
JOIN_KEY = "join.key"
CLIENT_CERT = "client.pem"
CLIENT_KEY = "client.key"
#: The environment variable naming a client's credentials directory.
CREDENTIALS_ENV = "NYALA_CREDENTIALS"


@dataclass(frozen=True, repr=False)
class TlsSettings:
    """What a TLS channel or server needs: the CA to check peers against, and this side's
    certificate chain and private key (PEM). ``cert_pem`` is empty only for a tablet server
    that has not enrolled yet (it can then reach nothing but a master's signing RPC)."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def __repr__(self) -> str:  # never print a private key
        return f"TlsSettings(ca={len(self.ca_pem)} B, cert={len(self.cert_pem)} B, key=<hidden>)"


def write_private(path: Path, data: bytes) -> None:
    """Writes a secret readable by its owner only (0600), replacing ``path`` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_public(path: Path, data: bytes) -> None:
    """Writes a certificate (0644), replacing ``path`` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def read_file(path: Path) -> bytes:
    """The bytes of a security file; ``InvalidArgumentError`` naming it if it is missing."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise InvalidArgumentError(f"{path} does not exist") from None


def load_tls(directory: Path, cert_name: str, key_name: str) -> TlsSettings:
    """The CA certificate and the named certificate and key of ``directory``."""
    return TlsSettings(
        ca_pem=read_file(directory / CA_CERT),
        cert_pem=read_file(directory / cert_name),
        key_pem=read_file(directory / key_name),
    )


def load_server_tls(directory: Path) -> TlsSettings:
    """A server's TLS material: its own certificate once it has one, else its join credential
    (a tablet server before enrollment), else the CA alone."""
    for cert, key in ((SERVER_CERT, SERVER_KEY), (JOIN_CERT, JOIN_KEY)):
        if (directory / cert).exists():
            return load_tls(directory, cert, key)
    return TlsSettings(ca_pem=read_file(directory / CA_CERT), cert_pem=b"", key_pem=b"")


def load_client_tls(directory: Path) -> TlsSettings:
    """A client's credentials directory (``ca.pem``, ``client.pem``, ``client.key``)."""
    return load_tls(directory, CLIENT_CERT, CLIENT_KEY)


def credentials_from_env() -> Path | None:
    """The credentials directory ``NYALA_CREDENTIALS`` names, if set."""
    value = os.environ.get(CREDENTIALS_ENV, "")
    return Path(value) if value else None
