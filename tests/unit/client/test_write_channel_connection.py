"""One connection of the client's write channel (``write_pipe._Connection``), plain and under
the extension's TLS, on real loopback sockets: a frame larger than the socket takes at once
reaches a reader that starts late, intact; a reader that never reads makes the sender's
deadline pass; a server certificate for another server is refused at the handshake."""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from nyala import _native
from nyala.client.write_pipe import _Connection
from nyala.security import pki
from nyala.security.identity import Identity, Kind
from nyala.testing.security import issue_tls_config

SERVER_UUID = "5" * 32  # what the ``server_tls`` fixture's certificate names (conftest)
PAYLOAD_BYTES = 24 * 1024 * 1024  # well over what loopback socket buffers hold
DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def client_tls(ca: pki.ClusterCa) -> _native.TlsConfig:
    return issue_tls_config(ca, Identity(Kind.USER, "alice"), server=False)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock


def _accept(listener: socket.socket, tls: _native.TlsConfig | None, deadline: float) -> _Connection:
    """The server's side: accepted, and with ``tls`` its handshake done."""
    sock, _ = listener.accept()
    if tls is None:
        return _Connection(sock, None)
    sock.setblocking(False)
    session = _native.TlsSession(tls, sock.fileno(), None)
    connection = _Connection(sock, session)
    while (step := session.handshake()) != 0:
        connection._wait(write=step != 1, deadline=deadline)
    return connection


def _dial(listener: socket.socket, tls: _native.TlsConfig | None, uuid: str) -> _Connection:
    sock = socket.create_connection(listener.getsockname(), timeout=5)
    return _Connection.open(sock, tls, uuid, time.monotonic() + DEADLINE_S)


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "tls"])
def test_a_frame_larger_than_the_socket_takes_reaches_a_late_reader_intact(
    listener: socket.socket,
    server_tls: _native.TlsConfig,
    client_tls: _native.TlsConfig,
    secure: bool,
) -> None:
    payload = os.urandom(PAYLOAD_BYTES)
    received: list[bytes] = []
    failures: list[BaseException] = []

    def serve() -> None:
        try:
            deadline = time.monotonic() + DEADLINE_S
            connection = _accept(listener, server_tls if secure else None, deadline)
            time.sleep(0.5)  # the sender fills the socket meanwhile, and must wait for room
            received.append(connection.receive(PAYLOAD_BYTES, deadline))
            connection.close()
        except BaseException as exc:
            failures.append(exc)

    server = threading.Thread(target=serve)
    server.start()
    client = _dial(listener, client_tls if secure else None, SERVER_UUID)
    started = time.monotonic()
    client.send(payload, time.monotonic() + DEADLINE_S)
    waited_s = time.monotonic() - started
    server.join(timeout=DEADLINE_S)
    client.close()
    assert not failures, failures
    assert hashlib.sha256(received[0]).digest() == hashlib.sha256(payload).digest()
    assert waited_s >= 0.3, "the whole frame went before the reader read anything"


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "tls"])
def test_a_reader_that_never_reads_makes_the_deadline_pass(
    listener: socket.socket,
    server_tls: _native.TlsConfig,
    client_tls: _native.TlsConfig,
    secure: bool,
) -> None:
    accepted: list[_Connection] = []
    server = threading.Thread(
        target=lambda: accepted.append(
            _accept(listener, server_tls if secure else None, time.monotonic() + DEADLINE_S)
        )
    )
    server.start()
    client = _dial(listener, client_tls if secure else None, SERVER_UUID)
    server.join(timeout=DEADLINE_S)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        client.send(os.urandom(PAYLOAD_BYTES), time.monotonic() + 0.5)
    assert time.monotonic() - started < 5.0
    with pytest.raises(TimeoutError):
        client.receive(4, time.monotonic() + 0.2)  # no answer comes either
    client.close()
    accepted[0].close()


def test_a_certificate_for_another_server_is_refused_at_the_handshake(
    listener: socket.socket, server_tls: _native.TlsConfig, client_tls: _native.TlsConfig
) -> None:
    def serve() -> None:
        with contextlib.suppress(ConnectionError, TimeoutError):  # the client hangs up
            _accept(listener, server_tls, time.monotonic() + 5)

    server = threading.Thread(target=serve)
    server.start()
    with pytest.raises(ConnectionError):
        _dial(listener, client_tls, "6" * 32)  # the server's certificate names "5" * 32
    server.join(timeout=10)
