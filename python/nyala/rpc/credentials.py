"""TLS credentials of gRPC channels and servers, from ``RpcSettings.tls``.

Every connection of a secure cluster is mutual TLS: the server shows a certificate of the
cluster CA (checked by the client against the CA and the host or, when the client knows which
server it wants, the server's UUID), and the client shows one too (checked by the server
against the CA, then by ``nyala.rpc.auth`` against what the method requires).
"""

from __future__ import annotations

import grpc

from nyala.security.files import TlsSettings
from nyala.security.identity import server_dns_name


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


def uuid_binding_option(server_uuid: str) -> tuple[str, str]:
    """The channel option that makes the handshake check the server's certificate names
    ``server_uuid`` (instead of the host dialled)."""
    return ("grpc.ssl_target_name_override", server_dns_name(server_uuid))
