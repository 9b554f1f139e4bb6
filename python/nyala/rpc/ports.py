"""Free loopback ports for test clusters (the RPC layer is the only code that opens sockets)."""

from __future__ import annotations

import contextlib
import socket


def free_loopback_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports the OS reports free right now on ``host``.

    All sockets stay open until every port is chosen, so the ports are distinct; another
    process may still take one before the caller binds it (callers retry on a bind failure).
    """
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports
