"""The cluster's internal PKI (Kudu's IPKI): a CA whose key the masters hold, and the
certificates it signs for servers (from a CSR), users, admins and join credentials.

Keys are ECDSA P-256 (cheap handshakes); certificates carry their holder as a URI subject
alternative name (``nyala.security.identity``), and a server's also carries the DNS name of its
UUID and the host it is reached at, so a peer can check either. The CA certificate's SHA-256
fingerprint is the cluster's identity (``nyala cert export-ca`` prints it).
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from nyala.errors import InvalidArgumentError, NotAuthorizedError
from nyala.security import files
from nyala.security.identity import SESSION_URI, Identity, Kind, server_dns_name

#: Validity of the CA certificate; rotate before it ends (docs/security.md).
CA_VALIDITY_S = 10 * 365 * 24 * 3600
#: Validity of a server's certificate; a server renews it by enrolling again.
SERVER_CERT_VALIDITY_S = 365 * 24 * 3600
#: Validity of a user's or admin's certificate unless the issuer says otherwise.
USER_CERT_VALIDITY_S = 30 * 24 * 3600
#: Validity of a join credential unless the issuer says otherwise: it is meant to be used once.
JOIN_CERT_VALIDITY_S = 24 * 3600
#: A CSR larger than this is refused before it is parsed.
CSR_BYTES_MAX = 16 * 1024


def new_key() -> ec.EllipticCurvePrivateKey:
    """A fresh private key."""
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey, passphrase: bytes | None = None) -> bytes:
    """``key`` as PKCS#8 PEM, encrypted under ``passphrase`` if given."""
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase)
        if passphrase
        else serialization.NoEncryption()
    )
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def fingerprint(cert_pem_data: bytes) -> str:
    """The SHA-256 fingerprint of a PEM certificate, as hex pairs joined by colons."""
    digest = x509.load_pem_x509_certificate(cert_pem_data).fingerprint(hashes.SHA256())
    return ":".join(f"{b:02X}" for b in digest)


def now_utc() -> datetime.datetime:
    """The current time, as certificates state theirs."""
    return datetime.datetime.now(datetime.UTC)


def _host_names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def make_csr(key: ec.EllipticCurvePrivateKey, server_uuid: str) -> bytes:
    """A server's certificate signing request (PEM) for its UUID."""
    return make_identity_csr(key, Identity(Kind.SERVER, server_uuid))


def make_identity_csr(key: ec.EllipticCurvePrivateKey, identity: Identity) -> bytes:
    """A certificate signing request (PEM) for ``identity`` (``nyala user add`` sends one)."""
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(identity))]))
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class IssuedCert:
    """One certificate as ``nyala cert list`` shows it."""

    identity: str
    serial: int
    not_after: datetime.datetime
    path: Path


class ClusterCa:
    """The cluster CA: its certificate and private key. Only masters (and the operator's
    ``nyala cert`` commands on a master's host) hold one."""

    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.cert = cert
        self._key = key

    @property
    def cert_pem(self) -> bytes:
        return cert_pem(self.cert)

    @property
    def private_key(self) -> ec.EllipticCurvePrivateKey:
        """The CA's key: signs certificates and authorization tokens (never leaves a master)."""
        return self._key

    @classmethod
    def create(cls, common_name: str = "nyala cluster CA") -> ClusterCa:
        """A new self-signed CA."""
        key = new_key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = now_utc()
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(seconds=CA_VALIDITY_S))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    def save(self, directory: Path, passphrase: bytes | None = None) -> None:
        """Writes ``ca.pem`` and ``ca.key`` (0600; encrypted under ``passphrase`` if given)."""
        files.write_private(directory / files.CA_KEY, key_pem(self._key, passphrase))
        files.write_public(directory / files.CA_CERT, self.cert_pem)

    @classmethod
    def load(cls, directory: Path, passphrase: bytes | None = None) -> ClusterCa:
        """Reads ``ca.pem`` and ``ca.key``; a wrong or missing passphrase is an
        ``InvalidArgumentError`` that names no secret."""
        tls = files.load_tls(directory, files.CA_CERT, files.CA_KEY)
        return cls.from_pem(tls.cert_pem, tls.key_pem, passphrase, where=str(directory))

    @classmethod
    def from_pem(
        cls, cert_pem_data: bytes, key_pem_data: bytes, passphrase: bytes | None, *, where: str
    ) -> ClusterCa:
        """The CA of a certificate and a (possibly encrypted) key; ``InvalidArgumentError``
        naming ``where`` (never a secret) if the key cannot be read."""
        cert = x509.load_pem_x509_certificate(cert_pem_data)
        try:
            key = serialization.load_pem_private_key(key_pem_data, password=passphrase or None)
        except (TypeError, ValueError):
            raise InvalidArgumentError(
                f"cannot read the CA key in {where}: wrong or missing key file"
            ) from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise InvalidArgumentError(f"the CA key in {where} is not an EC key")
        return cls(cert, key)

    def key_pem(self, passphrase: bytes) -> bytes:
        """The CA's key as PKCS#8 PEM encrypted under ``passphrase`` (for the sys catalog)."""
        return key_pem(self._key, passphrase)

    @classmethod
    def exists(cls, directory: Path) -> bool:
        return (directory / files.CA_KEY).exists() and (directory / files.CA_CERT).exists()

    def issue(
        self,
        identity: Identity,
        public_key: ec.EllipticCurvePublicKey,
        *,
        validity_s: int,
        hosts: Sequence[str] = (),
        not_before: datetime.datetime | None = None,
        session: bool = False,
    ) -> x509.Certificate:
        """A certificate for ``identity``'s key; a server's also names its UUID's DNS name and
        ``hosts`` (IP addresses or DNS names it is reached at); session credentials carry
        ``SESSION_URI`` after the identity."""
        names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(identity.uri)]
        if session:
            names.append(x509.UniformResourceIdentifier(SESSION_URI))
        if identity.kind is Kind.SERVER:
            names.append(x509.DNSName(server_dns_name(identity.name)))
            names.extend(_host_names(hosts))
        start = not_before or now_utc() - datetime.timedelta(minutes=5)
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(identity))]))
            .issuer_name(self.cert.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + datetime.timedelta(seconds=validity_s))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )

    def sign_server_csr(self, csr_pem: bytes, server_uuid: str, hosts: Sequence[str]) -> bytes:
        """Signs a tablet server's CSR for ``server_uuid`` (PEM); ``InvalidArgumentError`` for
        a malformed, oversized or badly signed CSR, or one for another UUID."""
        identity = Identity(Kind.SERVER, server_uuid)
        public_key = _csr_key(csr_pem, identity)
        cert = self.issue(identity, public_key, validity_s=SERVER_CERT_VALIDITY_S, hosts=hosts)
        return cert_pem(cert)

    def sign_identity_csr(
        self,
        csr_pem: bytes,
        identity: Identity,
        *,
        validity_s: int,
        not_before: datetime.datetime | None = None,
        session: bool = False,
    ) -> bytes:
        """Signs a user's or admin's CSR for ``identity`` (PEM); ``InvalidArgumentError`` as
        ``sign_server_csr``."""
        public_key = _csr_key(csr_pem, identity)
        cert = self.issue(
            identity, public_key, validity_s=validity_s, not_before=not_before, session=session
        )
        return cert_pem(cert)

    def issue_credentials(
        self,
        identity: Identity,
        directory: Path,
        cert_name: str,
        key_name: str,
        *,
        validity_s: int,
        hosts: Sequence[str] = (),
        not_before: datetime.datetime | None = None,
    ) -> Path:
        """A new key and certificate for ``identity``, written to ``directory`` with the CA's
        certificate beside them; returns the certificate's path."""
        key = new_key()
        cert = self.issue(
            identity, key.public_key(), validity_s=validity_s, hosts=hosts, not_before=not_before
        )
        files.write_private(directory / key_name, key_pem(key))
        files.write_public(directory / cert_name, cert_pem(cert))
        files.write_public(directory / files.CA_CERT, self.cert_pem)
        return directory / cert_name

    def verify(self, cert_pem_data: bytes) -> Identity:
        """The identity a certificate names, if this CA signed it and it is valid now;
        ``NotAuthorizedError`` otherwise."""
        cert = x509.load_pem_x509_certificate(cert_pem_data)
        public_key = self.cert.public_key()
        assert isinstance(public_key, ec.EllipticCurvePublicKey)
        try:
            cert.verify_directly_issued_by(self.cert)
        except (ValueError, TypeError, InvalidSignature):
            raise NotAuthorizedError("the certificate is not signed by this cluster's CA") from None
        now = now_utc()
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            raise NotAuthorizedError("the certificate has expired or is not valid yet")
        return identity_of(cert)


def csr_key_sha256(csr_pem: bytes, identity: Identity) -> bytes:
    """SHA-256 of the DER public key of a CSR that names ``identity`` (what tells a retried
    request from another one for the same name); ``InvalidArgumentError`` as ``_csr_key``."""
    der = _csr_key(csr_pem, identity).public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    digest = hashes.Hash(hashes.SHA256())
    digest.update(der)
    return digest.finalize()


def _csr_key(csr_pem: bytes, identity: Identity) -> ec.EllipticCurvePublicKey:
    """The key of a CSR that names ``identity``; ``InvalidArgumentError`` for a malformed,
    oversized or badly signed CSR, or one for another identity."""
    if len(csr_pem) > CSR_BYTES_MAX:
        raise InvalidArgumentError(f"CSR of {len(csr_pem)} bytes is over {CSR_BYTES_MAX}")
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError:
        raise InvalidArgumentError("the CSR is not a PEM certificate signing request") from None
    if not csr.is_signature_valid:
        raise InvalidArgumentError("the CSR's signature does not verify")
    public_key = csr.public_key()
    if not isinstance(public_key, ec.EllipticCurvePublicKey):
        raise InvalidArgumentError("the CSR's key is not an EC key")
    cn = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(cn) != 1 or cn[0].value != str(identity):
        raise InvalidArgumentError(f"the CSR does not name {identity}")
    return public_key


def identity_of(cert: x509.Certificate) -> Identity:
    """The identity a certificate names in its URI subject alternative name."""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise InvalidArgumentError("the certificate names no nyala identity") from None
    for uri in sans.get_values_for_type(x509.UniformResourceIdentifier):
        return Identity.from_uri(uri)
    raise InvalidArgumentError("the certificate names no nyala identity")


def list_certs(directory: Path) -> list[IssuedCert]:
    """Every certificate (``*.pem``) under ``directory``: the CA's (named ``(CA)``) and those
    that name a nyala identity; other files are skipped."""
    found: list[IssuedCert] = []
    for path in sorted(directory.rglob("*.pem")):
        try:
            cert = x509.load_pem_x509_certificate(path.read_bytes())
        except ValueError:
            continue
        try:
            identity = str(identity_of(cert))
        except InvalidArgumentError:
            if path.name != files.CA_CERT:
                continue
            identity = "(CA)"
        found.append(IssuedCert(identity, cert.serial_number, cert.not_valid_after_utc, path))
    return found
