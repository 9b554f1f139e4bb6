"""Client writes on the tablet servers' peer channel (``WRITE_MAGIC``, issue 28): the rows a
client sends there are the rows it would have sent over gRPC; a server restarted on a new
channel port is dialled again and nothing is lost; frames that break the rules get an error
answer or a closed connection, never a partial write. Real processes on loopback."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator

import grpc
import pytest

import nyala
from nyala._proto import common_pb2, consensus_pb2, consensus_pb2_grpc, tserver_pb2
from nyala.rowops import encode, make_op_batch
from nyala.rpc.channel_wire import WRITE_MAGIC
from nyala.testing import MiniCluster
from nyala.testing.mini_cluster import FAST_TSERVER_FLAGS, ServerProcess, fast_master_flags

SCHEMA = nyala.Schema.parse("id:int64, name:string, score:double?", key=["id"])
WRITERS = 16
ROWS_PER_WRITER = 60


@pytest.fixture(scope="module")
def cluster() -> Iterator[MiniCluster]:
    with MiniCluster(
        1, num_masters=1, master_flags=fast_master_flags(), tserver_flags=FAST_TSERVER_FLAGS
    ) as started:
        yield started


def _write_rows(table: nyala.Table, first: int) -> list[int]:
    """WRITERS threads each upserting ROWS_PER_WRITER single rows; the keys acknowledged."""
    acked: list[list[int]] = [[] for _ in range(WRITERS)]
    failures: list[BaseException] = []

    def writer(k: int) -> None:
        try:
            for i in range(ROWS_PER_WRITER):
                key = first + k * ROWS_PER_WRITER + i
                row = {"id": [key], "name": [f"row-{key}"], "score": [key / 2]}
                table.upsert(row).raise_for_errors()
                acked[k].append(key)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not failures, failures[:3]
    return [key for per in acked for key in per]


def _stored(table: nyala.Table) -> dict[int, tuple[str, float | None]]:
    rows = table.scan().to_arrow().to_pylist()
    return {r["id"]: (r["name"], r["score"]) for r in rows}


def _channel_calls(client: nyala.Client) -> int:
    pipes = client._writer._pipes.values()
    return sum(p.channel.calls for p in pipes if p.channel is not None)


def test_rows_written_on_the_channel_are_those_written_over_grpc(cluster: MiniCluster) -> None:
    with (
        nyala.connect(cluster.master_addrs) as on_channel,
        nyala.connect(cluster.master_addrs, write_channel=False) as over_grpc,
    ):
        table = on_channel.create_table("channel_vs_grpc", SCHEMA, replicas=1)
        keys = _write_rows(table, 0)
        assert _channel_calls(on_channel) > 0
        keys += _write_rows(over_grpc.table("channel_vs_grpc"), 10_000)
        assert _channel_calls(over_grpc) == 0
        # A bulk write (the general path, one large call) goes on the channel too.
        bulk = list(range(20_000, 70_000))
        table.upsert(
            {"id": bulk, "name": [f"row-{k}" for k in bulk], "score": [k / 2 for k in bulk]}
        ).raise_for_errors()
        stored = _stored(table)
        assert sorted(stored) == sorted(keys + bulk)
        assert all(stored[k] == (f"row-{k}", k / 2) for k in stored)


def test_a_restarted_server_is_dialled_again_and_nothing_is_lost(cluster: MiniCluster) -> None:
    server = cluster.tserver(0)
    with nyala.connect(cluster.master_addrs, timeout_ms=60_000) as client:
        table = client.create_table("channel_restart", SCHEMA, replicas=1)
        before = _write_rows(table, 0)
        old_port = _channel_port(server)
        server.restart()  # SIGKILL, then a start: the channel listens on a new port
        assert _channel_port(server) != old_port
        after = _write_rows(table, 100_000)
        pipe = client._writer.pipe(server.rpc_addr)
        assert pipe.channel is not None
        assert pipe.channel.connections >= 2  # the old connection was dropped, a new one made
        assert _channel_calls(client) > 0
        assert sorted(_stored(table)) == sorted(before + after)


def _channel_port(server: ServerProcess) -> int:
    assert server.uuid is not None
    with grpc.insecure_channel(server.rpc_addr) as channel:
        answer = consensus_pb2_grpc.ConsensusServiceStub(channel).GetPeerChannel(
            consensus_pb2.PeerChannelRequestPB(dest_uuid=server.uuid), timeout=10
        )
    assert answer.port, "the tserver serves a channel"
    return int(answer.port)


def _call(sock: socket.socket, frame: bytes) -> tserver_pb2.WriteMultiResponsePB:
    sock.sendall(struct.pack(">I", len(frame)) + frame)
    (length,) = struct.unpack(">I", _exactly(sock, 4))
    return tserver_pb2.WriteMultiResponsePB.FromString(_exactly(sock, length))


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the server closed the connection"
        data += chunk
    return data


def test_frames_that_break_the_rules_are_answered_or_closed(cluster: MiniCluster) -> None:
    server = cluster.tserver(0)
    assert server.uuid is not None
    with nyala.connect(cluster.master_addrs) as client:
        table = client.create_table("channel_rules", SCHEMA, replicas=1)
        table.upsert({"id": [1], "name": ["one"]}).raise_for_errors()  # the tablet is led
        tablet_id = table.tablets()[0].tablet_id
        ops = encode(make_op_batch({"id": [7], "name": ["seven"]}, "upsert", table.schema))

        def request(dest_uuid: str, seq_no: int) -> bytes:
            sub = tserver_pb2.WriteRequestPB(
                dest_uuid=dest_uuid,
                tablet_id=tablet_id,
                ops=ops.to_pybytes(),
                schema_version=table.schema.version,
                request_id=common_pb2.RequestIdPB(
                    client_id="raw-test", seq_no=seq_no, first_incomplete_seq_no=seq_no
                ),
            )
            multi = tserver_pb2.WriteMultiRequestPB(dest_uuid=dest_uuid, requests=[sub])
            return multi.SerializeToString()

        port = _channel_port(server)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(WRITE_MAGIC)
            # Bytes that are no request: an error answer, and the connection goes on.
            garbage = _call(sock, b"\xff" * 16)
            assert garbage.error.code == common_pb2.INVALID_ARGUMENT, garbage
            # A call for another server: refused whole, nothing applied.
            wrong = _call(sock, request("0" * 32, 1))
            assert wrong.error.code == common_pb2.WRONG_SERVER_UUID, wrong
            assert 7 not in _stored(table)
            # A good call on the same connection is applied and answered.
            good = _call(sock, request(server.uuid, 2))
            assert not good.HasField("error"), good
            assert len(good.responses) == 1
            assert not good.responses[0].HasField("error"), good
            assert _stored(table)[7] == ("seven", None)
            # A frame over the limit closes the connection without an answer.
            sock.sendall(struct.pack(">I", 2**31))
            assert sock.recv(16) == b""
