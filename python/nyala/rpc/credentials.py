"""TLS credentials of gRPC channels and servers, from ``RpcSettings.tls``.

Every connection of a secure cluster is mutual TLS: the server shows a certificate of the
cluster CA (checked by the client against the CA and the host or, when the client knows which
server it wants, the server's UUID), and the client shows one too (checked by the server
against the CA, then by ``nyala.rpc.auth`` against what the method requires).
"""

from __future__ import annotations

import socket
import ssl
import tempfile
from pathlib import Path

import grpc

from nyala import _native
from nyala.errors import InvalidArgumentError
from nyala.rpc.errors import split_host_port
from nyala.rpc.tls_socket import tls_config
from nyala.security.files import TlsSettings, write_private
from nyala.security.identity import Identity, Role, server_dns_name


def channel_credentials(tls: TlsSettings) -> grpc.ChannelCredentials:
    """A client's side of the handshake (without its certificate if it has none yet)."""
    if not tls.cert_pem:
        return grpc.ssl_channel_credentials(root_certificates=tls.ca_pem)
    return grpc.ssl_channel_credentials(
        root_certificates=tls.ca_pem, private_key=tls.key_pem, certificate_chain=tls.cert_pem
    )


def server_credentials(tls: TlsSettings) -> grpc.ServerCredentials:
    """A server's side: its certificate, and a client certificate of the CA required."""
    return grpc.ssl_server_credentials(
        [(tls.key_pem, tls.cert_pem)], root_certificates=tls.ca_pem, require_client_auth=True
    )


def channel_tls_config(tls: TlsSettings, *, server: bool) -> _native.TlsConfig:
    """The same mutual TLS for the consensus peer channel (``rpc.tls_socket``): this side
    shows its certificate and requires one of the CA from the other; a client checks the
    name it is given (``peer_server_name``)."""
    return tls_config(tls.ca_pem, tls.cert_pem, tls.key_pem, server=server)


def peer_server_name(server_uuid: str) -> str:
    """The name a socket client checks in a server's certificate: its UUID's."""
    return server_dns_name(server_uuid)


def not_a_server(peercert: object) -> str | None:
    """Why a verified peer certificate (as ``ssl.SSLSocket.getpeercert`` gives it) may not
    take part in Raft (None: it is a server's), the rule ``ConsensusPeerStream`` enforces."""
    role = peercert_role(peercert)
    return None if role >= Role.SERVER else f"needs the SERVER role; the peer has {role.name}"


def peercert_role(peercert: object) -> Role:
    """The highest role the nyala identities of a verified peer certificate carry; NONE if it
    names none."""
    role = Role.NONE
    alt_names = peercert.get("subjectAltName", ()) if isinstance(peercert, dict) else ()
    for kind, value in alt_names:
        if kind != "URI":
            continue
        try:
            role = max(role, Identity.from_uri(value).role)
        except InvalidArgumentError:
            continue
    return role


def uuid_binding_option(server_uuid: str) -> tuple[str, str]:
    """The channel option that makes the handshake check the server's certificate names
    ``server_uuid`` (instead of the host dialled)."""
    return ("grpc.ssl_target_name_override", server_dns_name(server_uuid))


#: How long ``handshake_refusal`` waits for the server's verdict on our certificate.
PROBE_TIMEOUT_MS = 2_000
# Alerts a secure server sends when it refuses the client's certificate (or its absence).
_REFUSALS = (
    "CERTIFICATE_REQUIRED",
    "UNKNOWN_CA",
    "CERTIFICATE_EXPIRED",
    "BAD_CERTIFICATE",
    "CERTIFICATE_UNKNOWN",
    "DECRYPT_ERROR",
    "HANDSHAKE_FAILURE",
)


def handshake_refusal(addr: str, tls: TlsSettings | None) -> str | None:
    """Why the server at ``addr`` refuses this client's credentials, or None if it does not
    (or cannot be reached). gRPC reports a refused handshake as a closed socket, like a server
    that is down; a failed call asks this to tell the two apart and raise a clear error.

    Opens one TLS connection with the client's certificate (checking nothing of the server's:
    no data is sent) and reads the server's verdict.
    """
    host, port = split_host_port(addr)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    with tempfile.TemporaryDirectory() as scratch:
        if tls is not None and tls.cert_pem:
            cert, key = Path(scratch) / "cert.pem", Path(scratch) / "key.pem"
            write_private(cert, tls.cert_pem)
            write_private(key, tls.key_pem)
            context.load_cert_chain(cert, key)
        try:
            with (
                socket.create_connection((host, port), timeout=PROBE_TIMEOUT_MS / 1000) as raw,
                context.wrap_socket(raw) as conn,
            ):
                # TLS 1.3: the verdict on our certificate comes after the handshake: the
                # server's HTTP/2 preface if it accepts us, an alert or a close if not.
                accepted = conn.recv(1) != b""
        except ssl.SSLError as exc:
            reason = exc.reason or ""
            if any(refusal in reason for refusal in _REFUSALS):
                return _explain(tls)
            return None  # not TLS at all (a plaintext server) or another failure
        except OSError:
            return None
    return None if accepted else _explain(tls)


def _explain(tls: TlsSettings | None) -> str:
    if tls is None or not tls.cert_pem:
        return (
            "the server requires TLS with a certificate of its cluster: pass credentials "
            "(nyala.connect(..., credentials=DIR) or NYALA_CREDENTIALS; docs/security.md)"
        )
    return (
        "the server refused this client's certificate: it is expired, not yet valid, or not "
        "signed by this cluster's CA"
    )
