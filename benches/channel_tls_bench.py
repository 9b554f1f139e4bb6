"""What TLS costs the consensus peer channel: the extension's TLS (``nyala.rpc.tls_socket``,
rustls) next to asyncio's own TLS transport (Python's ``ssl``, what the channel used before)
and a plain asyncio connection (no TLS: the baseline), measured in the same run on loopback.

Each case sends ``N`` frames of one size from a client process to a server process that reads
them into a buffer (``asyncio.BufferedProtocol``, as the channel's server does), with mutual
TLS from certificates of nyala's own PKI. Reported per side: CPU milliseconds per MB (the
process's CPU time, handshake included), for 100 KB frames (a 1,000-row batch's
AppendEntries) and 4 KB frames (small writes' batches and their answers). The headline ratios
``native_vs_asyncio_tls_*`` are the extension's CPU over asyncio TLS's, both sides together
(below 1: cheaper), and ``native_tls_overhead_*`` the extension's CPU over plain's.

Usage: ``python benches/channel_tls_bench.py [--quick]``; the last line printed is one JSON
object. docs/security.md, "Cost", quotes it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import ssl
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from nyala.rpc.tls_socket import SocketTlsTransport, tls_config, tls_handshake
from nyala.security import pki
from nyala.security.identity import Identity, Kind, server_dns_name

SERVER_UUID = "a" * 32
CASES = {"large": 100_000, "small": 4_000}
KINDS = ("plain", "asyncio_tls", "native_tls")


def _credentials(directory: Path) -> dict[str, bytes]:
    ca = pki.ClusterCa.create()
    out = {"ca": ca.cert_pem}
    for side, uuid in (("server", SERVER_UUID), ("client", "b" * 32)):
        key = pki.new_key()
        cert = ca.issue(Identity(Kind.SERVER, uuid), key.public_key(), validity_s=3600)
        out[f"{side}_cert"], out[f"{side}_key"] = pki.cert_pem(cert), pki.key_pem(key)
        (directory / f"{side}.pem").write_bytes(out[f"{side}_cert"])
        (directory / f"{side}.key").write_bytes(out[f"{side}_key"])
    (directory / "ca.pem").write_bytes(ca.cert_pem)
    return out


def _ssl_context(directory: Path, side: str) -> ssl.SSLContext:
    server = side == "server"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(directory / "ca.pem")
    context.load_cert_chain(directory / f"{side}.pem", directory / f"{side}.key")
    return context


class _Sink(asyncio.BufferedProtocol):
    def __init__(self, expected: int, done: asyncio.Future[None]) -> None:
        self.buffer = bytearray(256 * 1024)
        self.received = 0
        self.expected = expected
        self.done = done
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self.buffer)

    def buffer_updated(self, nbytes: int) -> None:
        self.received += nbytes
        if self.received >= self.expected and self.transport is not None:
            self.transport.write(b"k")  # all here

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


class _Source(asyncio.Protocol):
    def __init__(self, acked: asyncio.Future[None]) -> None:
        self.acked = acked
        self.writable = asyncio.Event()
        self.writable.set()

    def data_received(self, data: bytes) -> None:
        if not self.acked.done():
            self.acked.set_result(None)

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()


async def _server(
    kind: str, creds: dict[str, bytes], directory: Path, expected: int, ports: Any
) -> float:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    started = time.process_time()
    if kind == "native_tls":
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        ports.put(listener.getsockname()[1])
        sock, _ = await loop.sock_accept(listener)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        started = time.process_time()
        config = tls_config(creds["ca"], creds["server_cert"], creds["server_key"], server=True)
        session = await tls_handshake(sock, config)
        SocketTlsTransport(loop, sock, session, _Sink(expected, done))
    else:
        context = _ssl_context(directory, "server") if kind == "asyncio_tls" else None
        server = await loop.create_server(
            lambda: _Sink(expected, done), "127.0.0.1", 0, ssl=context
        )
        ports.put(server.sockets[0].getsockname()[1])
    await done
    return time.process_time() - started


def _server_process(
    kind: str, directory: str, creds: dict[str, bytes], expected: int, ports: Any, results: Any
) -> None:
    results.put(asyncio.run(_server(kind, creds, Path(directory), expected, ports)))


async def _client(
    kind: str, creds: dict[str, bytes], directory: Path, port: int, size: int, count: int
) -> float:
    loop = asyncio.get_running_loop()
    acked: asyncio.Future[None] = loop.create_future()
    source = _Source(acked)
    started = time.process_time()
    transport: asyncio.BaseTransport
    if kind == "native_tls":
        sock = socket.socket()
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        config = tls_config(creds["ca"], creds["client_cert"], creds["client_key"], server=False)
        session = await tls_handshake(sock, config, server_hostname=server_dns_name(SERVER_UUID))
        transport = SocketTlsTransport(loop, sock, session, source)
        await asyncio.sleep(0)
    else:
        context = _ssl_context(directory, "client") if kind == "asyncio_tls" else None
        name = server_dns_name(SERVER_UUID) if context else None
        transport, _ = await loop.create_connection(
            lambda: source, "127.0.0.1", port, ssl=context, server_hostname=name
        )
    assert isinstance(transport, asyncio.Transport)
    frame = os.urandom(size)
    view = memoryview(frame)
    for _ in range(count):
        transport.write(view[:4])  # a length, then the frame, as the channel writes them
        transport.write(view[4:])
        await source.writable.wait()
    await acked
    spent = time.process_time() - started
    transport.close()
    return spent


def _case(
    kind: str, size: int, count: int, directory: Path, creds: dict[str, bytes]
) -> dict[str, float]:
    ctx = multiprocessing.get_context("spawn")
    ports, results = ctx.Queue(), ctx.Queue()
    server = ctx.Process(
        target=_server_process, args=(kind, str(directory), creds, size * count, ports, results)
    )
    server.start()
    port = ports.get(timeout=60)
    client_s = asyncio.run(_client(kind, creds, directory, port, size, count))
    server_s = results.get(timeout=120)
    server.join()
    mb = size * count / 1e6
    return {"sender": client_s * 1000 / mb, "receiver": server_s * 1000 / mb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer bytes and rounds")
    args = parser.parse_args()
    megabytes = 100 if args.quick else 400
    rounds = 3 if args.quick else 5
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        creds = _credentials(directory)
        for case, size in CASES.items():
            count = megabytes * 1_000_000 // size
            runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
            for _ in range(rounds):  # the kinds alternated, so each sees the same machine
                for kind in KINDS:
                    runs[kind].append(_case(kind, size, count, directory, creds))
            for kind in KINDS:
                for side in ("sender", "receiver"):
                    value = statistics.median(r[side] for r in runs[kind])
                    result[f"{kind}_{side}_ms_per_mb_{case}"] = round(value, 3)
            total = {
                kind: result[f"{kind}_sender_ms_per_mb_{case}"]
                + result[f"{kind}_receiver_ms_per_mb_{case}"]
                for kind in KINDS
            }
            result[f"native_vs_asyncio_tls_{case}"] = round(
                total["native_tls"] / total["asyncio_tls"], 3
            )
            result[f"native_tls_overhead_{case}"] = round(total["native_tls"] / total["plain"], 3)
            print(
                f"{case} frames ({size} B): CPU ms per MB, sender + receiver: "
                + ", ".join(f"{kind} {total[kind]:.3f}" for kind in KINDS)
                + f" | native/asyncio TLS {result[f'native_vs_asyncio_tls_{case}']}",
                flush=True,
            )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
