"""Malformed and oversized RPCs and handshakes against every service of a secure cluster
(issue 36): each gets an error, no server crashes, no data changes.

Every method of every service (read from the proto descriptors, so a new RPC is covered) is
sent random bytes, truncated and lying length prefixes and a message over the size limit, with
an admin's certificate so the calls get past the role check to the request parsing; the RPC
ports are sent garbage instead of a TLS handshake, a plaintext HTTP/2 preface, and TLS
handshakes cut short.
"""

from __future__ import annotations

import random
import socket
import ssl
from collections.abc import Iterator

import grpc
import pytest

import nyala
from nyala._proto import (
    consensus_pb2,
    master_pb2,
    tablet_copy_pb2,
    tserver_admin_pb2,
    tserver_pb2,
)
from nyala.rpc.credentials import channel_credentials
from nyala.rpc.errors import split_host_port
from nyala.testing import MiniCluster, logs_on_failure
from nyala.testing.mini_cluster import FAST_TSERVER_FLAGS, fast_master_flags

SCHEMA = nyala.Schema.parse("id:int64, v:string?", key=["id"])
MIB = 1024 * 1024
#: Past the servers' rpc_message_bytes_max (1 MiB below).
OVERSIZED_BYTES = 2 * MIB
SMALL_LIMIT = ["--rpc-message-bytes-max", str(MIB), "--tablet-copy-chunk-bytes", str(256 * 1024)]

_FILES = (master_pb2, tserver_pb2, tserver_admin_pb2, consensus_pb2, tablet_copy_pb2)
METHODS = [
    (f"/{service.full_name}/{method.name}", method.client_streaming, method.server_streaming)
    for module in _FILES
    for service in module.DESCRIPTOR.services_by_name.values()
    for method in service.methods
]


def _payloads(rng: random.Random) -> list[bytes]:
    return [
        b"",
        rng.randbytes(rng.randint(1, 64)),
        rng.randbytes(rng.randint(256, 4096)),
        b"\x0a\xff\xff\xff\x0f" + b"x" * 8,  # field 1 says 4 GiB follow; 8 bytes do
        b"\x0a" * 1000,  # a length prefix with nothing behind it, over and over
        b"\x12\x05hello\xff",  # a tag of an unknown wire type
        b"\x0a\x20" + b"f" * 32 + b"\x12\x04\x08\x01",  # a plausible dest_uuid, then junk
    ]


@pytest.fixture(scope="module")
def cluster() -> Iterator[MiniCluster]:
    mini = MiniCluster(
        3,
        num_masters=1,
        master_flags=fast_master_flags(*SMALL_LIMIT),
        tserver_flags=[*FAST_TSERVER_FLAGS, *SMALL_LIMIT],
        secure=True,
    )
    with logs_on_failure(mini) as started:
        yield started


def _snapshot(cluster: MiniCluster) -> list[tuple[int, str]]:
    assert cluster.security is not None
    with nyala.connect(cluster.master_addrs, credentials=cluster.security.admin_dir) as client:
        table = client.table("fuzzed").scan().to_arrow()
    return sorted(zip(table.column("id").to_pylist(), table.column("v").to_pylist(), strict=True))


def _call(channel: grpc.Channel, path: str, streams: tuple[bool, bool], data: bytes) -> None:
    """Sends ``data`` as the request of ``path``; any answer or error is fine, a hang is not."""
    client_streaming, server_streaming = streams
    timeout_s = 5.0
    code = grpc.StatusCode.OK
    try:
        if client_streaming:
            for _ in channel.stream_stream(path)(iter([data, data]), timeout=timeout_s):
                pass
        elif server_streaming:
            for _ in channel.unary_stream(path)(data, timeout=timeout_s):
                pass
        else:
            channel.unary_unary(path)(data, timeout=timeout_s)
    except grpc.RpcError as err:
        code = err.code()
    assert code != grpc.StatusCode.DEADLINE_EXCEEDED, f"{path} hung on {data[:16]!r}"


def test_malformed_and_oversized_rpcs_get_errors_and_change_nothing(cluster: MiniCluster) -> None:
    assert cluster.security is not None
    assert cluster.rpc_settings.tls is not None
    with nyala.connect(cluster.master_addrs, credentials=cluster.security.admin_dir) as client:
        table = client.create_table(
            "fuzzed", SCHEMA, partitioning=nyala.HashPartitioning(["id"], buckets=3), replicas=3
        )
        assert table.insert({"id": list(range(100)), "v": [f"r{i}" for i in range(100)]}).ok
    before = _snapshot(cluster)
    rng = random.Random(36)
    oversized = rng.randbytes(OVERSIZED_BYTES)
    options = [("grpc.max_send_message_length", 8 * MIB)]
    credentials = channel_credentials(cluster.rpc_settings.tls)
    for server in [*cluster.masters, *cluster.tservers]:
        with grpc.secure_channel(server.rpc_addr, credentials, options=options) as channel:
            services: set[str] = set()
            for path, client_streaming, server_streaming in METHODS:
                streams = (client_streaming, server_streaming)
                for data in _payloads(rng):
                    _call(channel, path, streams, data)
                service = path.rpartition("/")[0]
                if service not in services:  # one oversized request per service
                    services.add(service)
                    _call(channel, path, streams, oversized)
        assert server.is_running(), f"{server.name} died: {server.log_tail()}"
    for server in [*cluster.masters, *cluster.tservers]:
        server.wait_ready(10)  # every server still answers
    assert _snapshot(cluster) == before


def _raw(addr: str, data: bytes) -> None:
    host, port = split_host_port(addr)
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(data)
        sock.settimeout(0.5)
        try:
            while sock.recv(4096):
                pass
        except (TimeoutError, ConnectionError):
            pass


def _cut_tls_handshake(addr: str) -> None:
    """A TLS client that stops after its hello, and one that hangs up mid-handshake."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    _raw(addr, hello)  # a hello and then silence
    _raw(addr, hello[: len(hello) // 2])  # half a hello


def test_garbage_and_cut_handshakes_leave_servers_running(cluster: MiniCluster) -> None:
    rng = random.Random(7)
    http2_preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    # The RPC ports, and the tablet servers' consensus peer channels (their TLS is the
    # extension's, not gRPC's: the only port a tserver listens on besides RPC and HTTP).
    targets = [server.rpc_addr for server in [*cluster.masters, *cluster.tservers]]
    for ts in cluster.tservers:
        (channel,) = ts.listening_ports() - {ts.rpc_port, ts.http_port}
        targets.append(f"127.0.0.1:{channel}")
    for addr in targets:
        _raw(addr, http2_preface)  # plaintext gRPC
        _raw(addr, b"\x16\x03\x01\xff\xff" + rng.randbytes(512))  # a lying record
        _raw(addr, b"\x16\x03\x01\x00\x40" + rng.randbytes(64))  # a record of noise
        _raw(addr, rng.randbytes(4096))
        _raw(addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        _cut_tls_handshake(addr)
    for server in [*cluster.masters, *cluster.tservers]:
        assert server.is_running(), f"{server.name} died: {server.log_tail()}"
        server.wait_ready(10)
    # Replication still works: a write is acknowledged (by a majority, over the channels).
    assert cluster.security is not None
    with nyala.connect(cluster.master_addrs, credentials=cluster.security.admin_dir) as client:
        table = client.table("fuzzed")
        assert table.upsert({"id": [990_001], "v": ["after the garbage"]}).ok
        assert (990_001, "after the garbage") in _snapshot(cluster)
