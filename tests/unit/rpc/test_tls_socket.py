"""The extension's TLS under asyncio (``nyala.rpc.tls_socket``): real sockets on loopback,
certificates of nyala's own PKI, megabytes through in writes of every size."""

from __future__ import annotations

import asyncio
import hashlib
import random
import socket
from collections.abc import Awaitable, Callable

import pytest

from nyala import _native
from nyala.rpc.tls_socket import SocketTlsTransport, tls_handshake
from nyala.security import pki
from nyala.security.identity import Identity, Kind, server_dns_name
from nyala.testing.security import issue_tls_config

SERVER_UUID = "5" * 32  # what the ``server_tls`` fixture's certificate names (conftest)


def _client_tls(
    ca: pki.ClusterCa, identity: Identity, trust: pki.ClusterCa | None = None
) -> _native.TlsConfig:
    return issue_tls_config(ca, identity, server=False, trust=trust)


class _Collector(asyncio.BufferedProtocol):
    """Takes what arrives into a small buffer (many reads per record) and hashes it."""

    def __init__(self) -> None:
        self.buffer = bytearray(5000)
        self.digest = hashlib.sha256()
        self.received = 0
        self.ended = asyncio.get_running_loop().create_future()
        self.transport: SocketTlsTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, SocketTlsTransport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self.buffer)

    def buffer_updated(self, nbytes: int) -> None:
        self.digest.update(memoryview(self.buffer)[:nbytes])
        self.received += nbytes

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ended.done():
            self.ended.set_result(exc)


Handler = Callable[[SocketTlsTransport, _Collector], Awaitable[None]]


async def _serve(server_tls: _native.TlsConfig, handle: Handler) -> tuple[int, asyncio.Task[None]]:
    """A one-connection server: accepts, shakes hands, runs ``handle``."""
    loop = asyncio.get_running_loop()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)

    async def run() -> None:
        with listener:
            sock, _ = await loop.sock_accept(listener)
        session = await tls_handshake(sock, server_tls)
        collector = _Collector()
        transport = SocketTlsTransport(loop, sock, session, collector)
        await asyncio.sleep(0)  # connection_made
        await handle(transport, collector)

    return listener.getsockname()[1], loop.create_task(run())


async def _dial(
    port: int, client_tls: _native.TlsConfig, name: str = server_dns_name(SERVER_UUID)
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    session = await tls_handshake(sock, client_tls, server_hostname=name)
    reader = asyncio.StreamReader()
    protocol = asyncio.StreamReaderProtocol(reader)
    transport = SocketTlsTransport(loop, sock, session, protocol)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


def test_megabytes_cross_both_ways_in_writes_of_every_size(
    ca: pki.ClusterCa, server_tls: _native.TlsConfig
) -> None:
    rng = random.Random(7)
    upload = rng.randbytes(12 << 20)
    download = rng.randbytes(5 << 20)

    async def main() -> None:
        async def handle(transport: SocketTlsTransport, collector: _Collector) -> None:
            # The caller's certificate, as the channel's role check reads it.
            peercert = transport.get_extra_info("peercert")
            assert ("URI", "nyala://server/" + "6" * 32) in peercert["subjectAltName"]
            assert "AES_128_GCM" in transport.get_extra_info("cipher")
            await collector.ended  # the client closes once it has its download
            assert collector.received == len(upload)
            assert collector.digest.digest() == hashlib.sha256(upload).digest()

        async def respond(transport: SocketTlsTransport, collector: _Collector) -> None:
            transport.write(download)  # all at once: more than the socket takes
            await handle(transport, collector)

        port, server = await _serve(server_tls, respond)
        reader, writer = await _dial(port, _client_tls(ca, Identity(Kind.SERVER, "6" * 32)))
        at = 0
        while at < len(upload):
            size = rng.choice((1, 7, 4096, 16_383, 16_385, 100_000, 1 << 20))
            writer.write(memoryview(upload)[at : at + size])
            at += size
            if rng.random() < 0.3:
                await writer.drain()
        await writer.drain()
        assert await reader.readexactly(len(download)) == download
        writer.close()
        await asyncio.wait_for(server, 30)

    asyncio.run(main())


def test_a_reader_that_pauses_holds_the_writer_back_and_loses_nothing(
    ca: pki.ClusterCa, server_tls: _native.TlsConfig
) -> None:
    data = random.Random(3).randbytes(24 << 20)

    async def main() -> None:
        async def handle(transport: SocketTlsTransport, collector: _Collector) -> None:
            transport.pause_reading()
            await asyncio.sleep(0.5)
            assert collector.received == 0
            transport.resume_reading()
            await collector.ended
            assert collector.digest.digest() == hashlib.sha256(data).digest()

        port, server = await _serve(server_tls, handle)
        _, writer = await _dial(port, _client_tls(ca, Identity(Kind.SERVER, "6" * 32)))
        transport = writer.transport
        writer.write(data)
        # The socket's buffers hold a few megabytes; the rest waits, and the writer is told.
        assert transport.get_write_buffer_size() > (4 << 20)
        drained = asyncio.ensure_future(writer.drain())
        await asyncio.sleep(0.3)
        assert not drained.done()
        await asyncio.wait_for(drained, 30)
        writer.close()  # after the last byte left (close sends what was written first)
        await asyncio.wait_for(server, 30)

    asyncio.run(main())


@pytest.mark.parametrize("case", ["another CA", "another server's name", "plaintext"])
def test_a_handshake_with_the_wrong_credentials_fails_on_both_sides(
    ca: pki.ClusterCa, server_tls: _native.TlsConfig, case: str
) -> None:
    async def main() -> None:
        async def handle(transport: SocketTlsTransport, collector: _Collector) -> None:
            raise AssertionError("the handshake passed")

        port, server = await _serve(server_tls, handle)
        if case == "plaintext":
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"NYPC\x00\x00\x00\x01" + b"\x00" * 64)
            with pytest.raises(ConnectionError, match="TLS"):
                await asyncio.wait_for(server, 10)
            writer.close()
            return
        if case == "another CA":
            other = pki.ClusterCa.create()
            client_tls = _client_tls(other, Identity(Kind.SERVER, "6" * 32), trust=ca)
            name = server_dns_name(SERVER_UUID)
        else:
            client_tls = _client_tls(ca, Identity(Kind.SERVER, "6" * 32))
            name = server_dns_name("7" * 32)
        client_failed = False
        try:
            reader, writer = await _dial(port, client_tls, name)
            # TLS 1.3: the client finishes before the server has checked its certificate;
            # the server's verdict (an alert) ends the connection at the first read.
            with pytest.raises(ConnectionError):
                await reader.read(1)
        except ConnectionError:
            client_failed = True
        with pytest.raises(ConnectionError, match="TLS"):
            await asyncio.wait_for(server, 10)
        if case == "another server's name":
            assert client_failed  # the client itself refused the server's certificate

    asyncio.run(main())
