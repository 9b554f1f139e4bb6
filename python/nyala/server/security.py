"""A server's certificate at start-up (Kudu's IPKI, docs/security.md).

A master holds the cluster CA (``ca.pem``, ``ca.key`` in its security directory; a lone master
creates it at its first start) and signs its own certificate for its UUID. A tablet server
without a certificate sends a CSR to a master, over a connection made with the join credential
the operator gave it once, and keeps the signed certificate; from then on it is a server of
the cluster. A master added later may enroll the same way, and takes the CA's key from the sys
catalog when it leads. Both run before the RPC server binds, so every connection is TLS from
the start.

The HTTP pages of a secure server are served over TLS with the same certificate
(``http_tls``), and need a client certificate of the cluster except ``/healthz``
(``http_authorizer``).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from pathlib import Path

from cryptography import x509

from nyala._proto import master_pb2
from nyala.errors import IllegalStateError, InvalidArgumentError, NyalaError, RetriableError
from nyala.rpc import ServerProxy
from nyala.rpc.auth import Revocations
from nyala.rpc.errors import split_host_port
from nyala.rpc.http import Authorize, HttpRequest, HttpResponse
from nyala.security import files, pki
from nyala.security.identity import Identity, Kind, Role
from nyala.server.settings import ServerSettings

log = logging.getLogger(__name__)

#: A server certificate closer than this to its end is renewed at start.
RENEW_BEFORE_S = 30 * 24 * 3600


def ca_passphrase(settings: ServerSettings) -> bytes | None:
    if not settings.ca_key_passphrase_file:
        return None
    return Path(settings.ca_key_passphrase_file).read_bytes().strip()


def advertised_hosts(settings: ServerSettings) -> list[str]:
    """The hosts a server's certificate names: its RPC bind host (the machine's name and
    ``localhost`` too when it binds every interface)."""
    host, _ = split_host_port(settings.rpc_bind)
    if host in ("0.0.0.0", "::", ""):
        return [socket.getfqdn(), socket.gethostname(), "localhost", "127.0.0.1"]
    return [host, "localhost"] if host != "localhost" else [host]


def _has_own_certificate(directory: Path, server_uuid: str) -> bool:
    """Whether ``server.pem`` names this server and is not close to its end."""
    path = directory / files.SERVER_CERT
    if not path.exists() or not (directory / files.SERVER_KEY).exists():
        return False
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    if pki.identity_of(cert) != Identity(Kind.SERVER, server_uuid):
        return False
    remaining_s = (cert.not_valid_after_utc - pki.now_utc()).total_seconds()
    return remaining_s > RENEW_BEFORE_S


async def prepare_master(
    settings: ServerSettings, server_uuid: str, own_addr: str
) -> pki.ClusterCa | None:
    """The cluster CA of a secure master (created by a lone master at its first start), with
    this master's certificate signed by it; None for an insecure master, and for a master
    without the CA's key: one that lost its ``ca.key``, or a new master given only a join
    credential, which enrolls like a tablet server (``enroll``) with the other masters. Either
    serves with its certificate and takes the key from the sys catalog when it leads (when the
    masters keep an encrypted copy there: ``--ca-key-passphrase-file``)."""
    if not settings.security_dir:
        return None
    directory = Path(settings.security_dir)
    passphrase = ca_passphrase(settings)
    if not pki.ClusterCa.exists(directory):
        others = tuple(addr for addr in settings.masters if addr != own_addr)
        if (directory / files.CA_CERT).exists() and _has_own_certificate(directory, server_uuid):
            log.warning("%s has no ca.key: this master cannot sign until it gets one", directory)
            return None
        if others and (
            (directory / files.JOIN_CERT).exists() or (directory / files.SERVER_CERT).exists()
        ):
            await enroll(settings, server_uuid, settings.enroll_timeout_ms, others)
            log.warning("%s has no ca.key: this master cannot sign until it gets one", directory)
            return None
        if others:
            raise IllegalStateError(
                f"{directory} holds no cluster CA and no join credential: with several "
                "masters, create the CA once (nyala cert init-ca) and give the first masters "
                "a copy; give a master added later a copy or a join credential "
                "(nyala cert join-credential)"
            )
        log.info("creating the cluster CA in %s", directory)
        pki.ClusterCa.create().save(directory, passphrase)
    ca = pki.ClusterCa.load(directory, passphrase)
    if not _has_own_certificate(directory, server_uuid):
        ca.issue_credentials(
            Identity(Kind.SERVER, server_uuid),
            directory,
            files.SERVER_CERT,
            files.SERVER_KEY,
            validity_s=pki.SERVER_CERT_VALIDITY_S,
            hosts=advertised_hosts(settings),
        )
        log.info("signed this master's certificate for %s", server_uuid)
    return ca


async def enroll(
    settings: ServerSettings,
    server_uuid: str,
    timeout_ms: int,
    masters: tuple[str, ...] | None = None,
) -> None:
    """Makes sure a secure server has its certificate, asking a master (of ``masters``, by
    default ``--masters``) to sign a CSR, with the join credential, or with its current
    certificate while that is valid; a no-op for an insecure server."""
    if not settings.security_dir:
        return
    directory = Path(settings.security_dir)
    if _has_own_certificate(directory, server_uuid):
        return
    renewing = (directory / files.SERVER_CERT).exists()  # with its current certificate
    if not renewing and not (directory / files.JOIN_CERT).exists():
        raise InvalidArgumentError(
            f"{directory} has no certificate for {server_uuid} and no join credential: "
            "give the server one (nyala cert join-credential) for its first start"
        )
    key = pki.new_key()
    request = master_pb2.SignServerCertificateRequestPB(
        server_uuid=server_uuid,
        csr_pem=pki.make_csr(key, server_uuid),
        hosts=advertised_hosts(settings),
    )
    answer = await _ask_masters(settings, masters or settings.masters, request, timeout_ms)
    files.write_private(directory / files.SERVER_KEY, pki.key_pem(key))
    files.write_public(directory / files.SERVER_CERT, answer.cert_pem)
    log.info("enrolled: the cluster CA signed this server's certificate for %s", server_uuid)


async def _ask_masters(
    settings: ServerSettings,
    masters: tuple[str, ...],
    request: master_pb2.SignServerCertificateRequestPB,
    timeout_ms: int,
) -> master_pb2.SignServerCertificateResponsePB:
    """The first master's answer to ``request``; the last error if none answers within
    ``timeout_ms``."""
    if not masters:
        raise InvalidArgumentError("a secure server needs --masters to enroll")
    rpc_settings = settings.rpc_settings()
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        last: NyalaError | None = None
        for addr in masters:
            async with ServerProxy(addr, rpc_settings) as proxy:
                try:
                    return await proxy.admin_call(proxy.master.SignServerCertificate, request)
                except NyalaError as exc:
                    last = exc
        assert last is not None
        if not isinstance(last, RetriableError) or time.monotonic() > deadline:
            raise last
        await asyncio.sleep(0.5)


# --- the HTTP pages of a secure server ------------------------------------------------------

_NEEDS_CERT = (
    b"this page needs a client certificate of this cluster "
    b"(curl --cacert ca.pem --cert client.pem --key client.key https://...)\n"
)


def http_tls(settings: ServerSettings) -> ssl.SSLContext | None:
    """The TLS context of a secure server's HTTP pages (None: insecure): this server's
    certificate, TLS 1.2 or newer, and a client certificate of the cluster CA asked for but
    not required (``/healthz`` serves without one; ``http_authorizer`` decides the rest)."""
    if not settings.security_dir:
        return None
    directory = Path(settings.security_dir)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(directory / files.SERVER_CERT, directory / files.SERVER_KEY)
    context.load_verify_locations(cadata=files.read_file(directory / files.CA_CERT).decode())
    context.verify_mode = ssl.CERT_OPTIONAL
    return context


def http_authorizer(revocations: Revocations | None) -> Authorize:
    """Who may see a secure server's pages: ``/healthz`` anyone (load balancers, probes); the
    other pages a user, admin or server of the cluster; the actions (POST) an admin. A revoked
    user's certificate is refused as on the RPC port."""

    def authorize(request: HttpRequest, der: bytes | None) -> HttpResponse | None:
        if request.path == "/healthz":
            return None
        if der is None:
            return HttpResponse(401, _NEEDS_CERT)
        cert = x509.load_der_x509_certificate(der)  # the TLS handshake verified it
        try:
            caller = pki.identity_of(cert)
        except NyalaError:
            return HttpResponse(403, b"the client certificate names no nyala identity\n")
        needed = Role.ADMIN if request.method == "POST" else Role.USER
        if caller.role < needed:
            return HttpResponse(403, f"this needs the {needed.name} role\n".encode())
        if revocations is not None:
            not_before_ms = int(cert.not_valid_before_utc.timestamp() * 1000)
            revoked = revocations.refused(caller, not_before_ms)
            if revoked is not None:
                return HttpResponse(401, f"{revoked}\n".encode())
        return None

    return authorize
