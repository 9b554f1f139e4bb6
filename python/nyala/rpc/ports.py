"""Free loopback ports for test clusters (the RPC layer is the only code that opens sockets).

By default the OS picks them (``bind`` to port 0), from its ephemeral range: the range every
outgoing connection's local port also comes from. A server restarted on its old port (a test
killing and restarting a process) can then find it taken by some client's connection made
meanwhile. ``NYALA_PORT_RANGE=LO-HI`` (ports LO to HI-1) makes the choice come from a range of
the caller's instead: below the ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``) no
outgoing connection takes a port of it, and test processes running side by side (pytest-xdist
workers, tests/conftest.py) each get their own range, so none picks a port another one's server
is about to take back.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import socket
from collections.abc import Collection

#: ``LO-HI``: the ports ``free_loopback_ports`` chooses from (LO inclusive, HI exclusive).
PORT_RANGE_ENV = "NYALA_PORT_RANGE"


def port_range_from_env() -> tuple[int, int] | None:
    """The range ``NYALA_PORT_RANGE`` names, or None when it is unset or empty."""
    text = os.environ.get(PORT_RANGE_ENV, "").strip()
    if not text:
        return None
    lo_text, sep, hi_text = text.partition("-")
    try:
        if not sep:
            raise ValueError(text)
        lo, hi = int(lo_text), int(hi_text)
    except ValueError:
        raise ValueError(f"{PORT_RANGE_ENV}={text!r}: expected LO-HI, two port numbers") from None
    if not 1 <= lo < hi <= 65536:
        raise ValueError(f"{PORT_RANGE_ENV}={text!r}: expected 1 <= LO < HI <= 65536")
    return lo, hi


def free_loopback_ports(
    count: int, host: str = "127.0.0.1", *, avoid: Collection[int] = ()
) -> list[int]:
    """``count`` distinct ports free right now on ``host``, none of them in ``avoid``.

    All sockets stay open until every port is chosen, so the ports are distinct; another
    process may still take one before the caller binds it (callers retry on a bind failure).
    ``avoid``: ports the caller chose earlier for servers that have not bound them yet (a port
    chosen here is released on return, so a later call may choose it again).
    """
    span = port_range_from_env()
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        if span is None:
            # A socket bound to a port of ``avoid`` stays open, so the OS offers another.
            for _ in range(count + len(avoid)):
                if len(ports) == count:
                    break
                sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                sock.bind((host, 0))
                port = int(sock.getsockname()[1])
                if port not in avoid:
                    ports.append(port)
            if len(ports) < count:
                raise OSError(
                    errno.EADDRINUSE,
                    f"fewer than {count} free ports besides the {len(avoid)} to avoid",
                )
            return ports
        lo, hi = span
        if count == 0:
            return ports
        candidates = [port for port in range(lo, hi) if port not in avoid]
        random.shuffle(candidates)
        for port in candidates:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                sock.bind((host, port))
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    raise
                continue
            ports.append(port)
            if len(ports) == count:
                return ports
        raise OSError(
            errno.EADDRINUSE, f"fewer than {count} free ports in {PORT_RANGE_ENV}={lo}-{hi}"
        )
