"""The whole length-prefixed frames that arrive on a socket (the peer channel's framing), for
tests that read what a sink or a committer wrote."""

from __future__ import annotations

import select
import socket
import time

from nyala.rpc.channel_wire import LENGTH


def frames_within(sock: socket.socket, wait_s: float) -> list[bytes]:
    """The whole frames that arrive on ``sock`` within ``wait_s``."""
    data = b""
    deadline = time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0:
        if select.select([sock], [], [], left)[0]:
            data += sock.recv(1 << 16)
    frames = []
    while data:
        (length,) = LENGTH.unpack_from(data)
        frames.append(data[LENGTH.size : LENGTH.size + length])
        data = data[LENGTH.size + length :]
    return frames
