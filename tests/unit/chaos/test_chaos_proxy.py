"""The fault-injecting proxy: forwarding, source identification, cuts, heals and delays."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from nyala.chaos.proxy import CLIENT, LOOPBACK, Network


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socket.create_server((LOOPBACK, 0))
    port = server.getsockname()[1]

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield port
    server.close()


def _roundtrip(port: int, payload: bytes = b"ping", timeout_s: float = 2.0) -> bytes:
    with socket.create_connection((LOOPBACK, port), timeout=timeout_s) as sock:
        sock.sendall(payload)
        return sock.recv(4096)


def test_forwards_and_identifies_the_dialing_process(echo_port: int) -> None:
    network = Network(lambda: {os.getpid(): "me"})
    proxy = network.add_proxy("echo", echo_port)
    try:
        assert _roundtrip(proxy.port) == b"ping"
        with socket.create_connection((LOOPBACK, proxy.port)) as sock:
            assert network.identify(sock.getsockname()[1], proxy.port) == "me"
    finally:
        network.close()


def test_unknown_process_is_a_client(echo_port: int) -> None:
    network = Network(dict)
    proxy = network.add_proxy("echo", echo_port)
    try:
        with socket.create_connection((LOOPBACK, proxy.port)) as sock:
            assert network.identify(sock.getsockname()[1], proxy.port) == CLIENT
    finally:
        network.close()


def test_cut_black_holes_new_and_closes_live_connections_until_healed(echo_port: int) -> None:
    network = Network(dict)
    proxy = network.add_proxy("echo", echo_port)
    try:
        live = socket.create_connection((LOOPBACK, proxy.port), timeout=2)
        live.sendall(b"a")
        assert live.recv(10) == b"a"
        network.cut({(CLIENT, "echo")})
        assert live.recv(10) == b""  # closed by the cut
        with pytest.raises(TimeoutError):
            _roundtrip(proxy.port, timeout_s=0.5)  # accepted, never answered
        network.cut({("someone-else", "echo")})
        assert _roundtrip(proxy.port) == b"ping"
        network.partition([{CLIENT}, {"echo"}])
        with pytest.raises(TimeoutError):
            _roundtrip(proxy.port, timeout_s=0.5)
        network.heal()
        assert _roundtrip(proxy.port) == b"ping"
    finally:
        network.close()


def test_delay_slows_each_chunk(echo_port: int) -> None:
    network = Network(dict)
    proxy = network.add_proxy("echo", echo_port)
    try:
        network.delay("echo", 200)
        started = time.monotonic()
        assert _roundtrip(proxy.port) == b"ping"
        assert time.monotonic() - started >= 0.35  # both directions
    finally:
        network.close()
