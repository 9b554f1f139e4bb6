"""Limits and deadlines of the RPC layer (DESIGN.md §8), with their units in their names."""

from __future__ import annotations

from dataclasses import dataclass

from nyala.security.files import TlsSettings, credentials_from_env, load_client_tls

MIB = 1024 * 1024


@dataclass(frozen=True)
class RpcSettings:
    """What every channel and server of one process uses."""

    # Largest message sent or received, either direction; a bigger one fails the call.
    message_bytes_max: int = 50 * MIB
    # Deadline of a client call (writes, scans, consensus) when the caller gives none.
    client_timeout_ms: int = 10_000
    # Deadline of an admin call (create/delete tablet, config change) when the caller gives none.
    admin_timeout_ms: int = 30_000
    # TLS on every channel and server of the process (None: plaintext, an insecure cluster).
    # A server with TLS requires a client certificate of the cluster CA on every connection.
    tls: TlsSettings | None = None

    def __post_init__(self) -> None:
        if self.message_bytes_max < 4096:
            raise ValueError(f"message_bytes_max {self.message_bytes_max} is below 4096")
        if self.client_timeout_ms <= 0 or self.admin_timeout_ms <= 0:
            raise ValueError("RPC timeouts must be positive")

    def grpc_options(self) -> list[tuple[str, int | str]]:
        """gRPC channel/server options enforcing the size limit in both directions."""
        return [
            ("grpc.max_send_message_length", self.message_bytes_max),
            ("grpc.max_receive_message_length", self.message_bytes_max),
            # Every process on a host binds its own port; never share one silently.
            ("grpc.so_reuseport", 0),
        ]


def tool_settings() -> RpcSettings:
    """What a tool's channel uses when it is given no settings: the client credentials
    ``NYALA_CREDENTIALS`` names (a secure cluster), else plaintext."""
    directory = credentials_from_env()
    return RpcSettings(tls=load_client_tls(directory) if directory is not None else None)
