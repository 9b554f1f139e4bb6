"""Replicated writes and scans on three real tserver processes: through the leader, refused by
followers with the leader hint, and surviving a SIGKILL of the leader with no acknowledged row
lost (count and checksum); the killed server catches up after a restart."""

from __future__ import annotations

import threading
import time
import urllib.request
from typing import Any

import pyarrow as pa
import pytest

from nyala import errors
from nyala._proto import common_pb2, consensus_pb2, tserver_pb2
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster, tablet_ops
from nyala.testing.mini_cluster import ServerProcess

SCHEMA = Schema([Column("id", "int64"), Column("v", "string", nullable=True)], ["id"])
TABLET = "c" * 32
CLIENT_ID = "test-client"
DEADLINE_S = 60.0


def _data(ids: list[int]) -> dict[str, list[object]]:
    return {"id": list(ids), "v": [f"value-{i}" for i in ids]}


def _write_request(ts: ServerProcess, ids: list[int], seq: int, op: str = "insert") -> Any:
    return tablet_ops.write_request(
        ts, TABLET, SCHEMA, _data(ids), op=op, client_id=CLIENT_ID, seq_no=seq
    )


def _write(ts: ServerProcess, ids: list[int], seq: int, op: str = "insert") -> Any:
    return tablet_ops.write(ts, _write_request(ts, ids, seq, op))


def _write_anywhere(cluster: MiniCluster, ids: list[int], seq: int) -> None:
    """Writes through whichever server leads, retrying (same request id) until acknowledged."""
    tablet_ops.write_to_leader(
        cluster,
        TABLET,
        SCHEMA,
        _data(ids),
        op="upsert",
        client_id=CLIENT_ID,
        seq_no=seq,
        deadline_s=DEADLINE_S,
    )


def _scan(ts: ServerProcess) -> pa.Table:
    return tablet_ops.scan(ts, TABLET, SCHEMA, batch_size_bytes=4096)


def _checksum(table: pa.Table) -> str:
    return tablet_ops.row_checksum([table.column("id").to_pylist(), table.column("v").to_pylist()])


def _expected(ids: list[int]) -> str:
    return tablet_ops.row_checksum([ids, [f"value-{i}" for i in ids]])


def test_write_and_scan_through_the_leader_and_follower_refusal(cluster: MiniCluster) -> None:
    cluster.create_tablet(TABLET, SCHEMA)
    leader = cluster.leader_of(TABLET)
    response = _write(leader, [1, 2, 3], 0)
    assert not response.per_row_errors  # type: ignore[attr-defined]
    response = _write(leader, [3, 4], 1)
    errors_ = list(response.per_row_errors)  # type: ignore[attr-defined]
    assert [(e.row_index, common_pb2.ErrorCode.Name(e.code)) for e in errors_] == [
        (0, "ALREADY_PRESENT")
    ]
    # A malformed batch is refused with INVALID_ARGUMENT and breaks no replica.
    bad = _write_request(leader, [9], 50)
    bad.request_id.first_incomplete_seq_no = 1  # type: ignore[attr-defined]
    bad.ops = b"not an arrow stream"  # type: ignore[attr-defined]
    with leader.proxy() as proxy, pytest.raises(errors.InvalidArgumentError, match="malformed"):
        proxy.call(proxy.tablet.Write, bad)
    table = _scan(leader)
    assert table.column("id").to_pylist() == [1, 2, 3, 4]
    # The retried request 1 answers with its first outcome and applies nothing again.
    again = _write(leader, [3, 4], 1)
    assert list(again.per_row_errors) == errors_  # type: ignore[attr-defined]
    follower = next(ts for ts in cluster.tservers if ts is not leader)
    with pytest.raises(errors.NotLeaderError) as info:
        _write(follower, [5], 2)
    assert info.value.leader_uuid == leader.uuid
    assert info.value.leader_addr == leader.rpc_addr
    with pytest.raises(errors.NotLeaderError):
        _scan(follower)
    with urllib.request.urlopen(f"http://{leader.http_addr}/metrics", timeout=5) as page:
        metrics = page.read().decode()
    assert f'nyala_tablet_is_leader{{tablet_id="{TABLET}"}} 1' in metrics
    assert f'nyala_tablet_commit_index{{tablet_id="{TABLET}"}}' in metrics


def test_leader_sigkill_loses_no_acknowledged_row_and_the_victim_catches_up(
    cluster: MiniCluster,
) -> None:
    cluster.create_tablet(TABLET, SCHEMA)
    acknowledged: list[int] = []
    seq = 0
    for start in range(0, 50, 5):
        ids = list(range(start, start + 5))
        _write_anywhere(cluster, ids, seq)
        acknowledged += ids
        seq += 1
    victim = cluster.leader_of(TABLET)
    victim.kill()
    for start in range(50, 100, 5):
        ids = list(range(start, start + 5))
        _write_anywhere(cluster, ids, seq)
        acknowledged += ids
        seq += 1
    new_leader = cluster.leader_of(TABLET)
    assert new_leader is not victim
    table = _scan(new_leader)
    assert table.num_rows == len(acknowledged)
    assert _checksum(table) == _expected(acknowledged)

    victim.restart()
    deadline = time.monotonic() + DEADLINE_S
    leader_index = _last_logged(new_leader)
    while _last_logged(victim) < leader_index:
        assert time.monotonic() < deadline, "the restarted server did not catch up"
        time.sleep(0.1)
    # Consensus went over the peer channel (docs/consensus.md), to the restarted server too
    # (on its new port, asked again): no batch over gRPC.
    sent = new_leader.metric_by_label("nyala_consensus_peer_batches_sent_total", "transport")
    assert sent["channel"] > 0, sent
    assert sent["grpc"] == 0, sent
    # Its election's pre-vote and vote requests went that way too, none as a unary RPC.
    votes = new_leader.metric_by_label("nyala_consensus_peer_votes_sent_total", "transport")
    assert votes["channel"] >= 2, votes
    assert votes["grpc"] == 0, votes
    for server in cluster.tservers:
        calls = server.metric_by_label("nyala_rpc_requests_total", "method")
        assert not any("RequestVote" in method for method in calls), calls


def test_a_follower_killed_with_a_batch_in_flight_catches_up_without_waiting_out_a_timeout(
    make_cluster: Any,
) -> None:
    """A batch whose stream broke is sent again at the next heartbeat round, not after
    ``consensus_rpc_timeout_ms`` (here two minutes): the transport reports the loss."""
    cluster = make_cluster(3, tserver_flags=["--consensus-rpc-timeout-ms", "120000"])
    cluster.create_tablet(TABLET, SCHEMA)
    _write_anywhere(cluster, [0, 1, 2], 0)
    leader = cluster.leader_of(TABLET)
    victim = next(ts for ts in cluster.tservers if ts is not leader)
    victim.kill()
    for seq, start in enumerate(range(10, 60, 5), start=1):
        _write_anywhere(cluster, list(range(start, start + 5)), seq)  # batches to the victim
    assert cluster.leader_of(TABLET) is leader
    victim.restart()
    leader_index = _last_logged(leader)
    deadline = time.monotonic() + 20.0
    while _last_logged(victim) < leader_index:
        assert time.monotonic() < deadline, "the leader waited for its lost batch to time out"
        time.sleep(0.1)


def _last_logged(ts: ServerProcess) -> int:
    request = consensus_pb2.GetConsensusStateRequestPB(dest_uuid=ts.uuid, tablet_ids=[TABLET])
    with ts.proxy() as proxy:
        response = proxy.call(proxy.consensus.GetConsensusState, request)
    return int(response.tablets[0].committed_index)


def test_every_server_killed_and_restarted_keeps_every_acknowledged_row(
    cluster: MiniCluster,
) -> None:
    """Bootstrap across processes: SIGKILL all three (torn WAL tails included), restart, and
    the rows come back from rowsets plus WAL replay."""
    cluster.create_tablet(TABLET, SCHEMA)
    acknowledged: list[int] = []
    for seq, start in enumerate(range(0, 60, 6)):
        ids = list(range(start, start + 6))
        _write_anywhere(cluster, ids, seq)
        acknowledged += ids
    for ts in cluster.tservers:
        ts.kill()
    for ts in cluster.tservers:
        ts.restart()
    leader = cluster.leader_of(TABLET)
    table = _scan(leader)
    assert table.num_rows == len(acknowledged)
    assert _checksum(table) == _expected(acknowledged)
    _write_anywhere(cluster, [1000], 100)
    assert _scan(cluster.leader_of(TABLET)).num_rows == len(acknowledged) + 1


def test_a_scanner_continues_keeps_alive_and_closes(cluster: MiniCluster) -> None:
    cluster.create_tablet(TABLET, SCHEMA)
    leader = cluster.leader_of(TABLET)
    _write(leader, list(range(300)), 0)
    first = tserver_pb2.ScanRequestPB(
        dest_uuid=leader.uuid,
        new_scan=tserver_pb2.NewScanRequestPB(tablet_id=TABLET, read_mode=tserver_pb2.READ_LATEST),
        batch_size_bytes=1024,
        batches_max=1,
    )
    with leader.proxy() as proxy:
        responses = list(proxy.tablet.Scan(first, timeout=30))
        assert len(responses) == 1
        assert responses[0].has_more_results
        scanner_id = responses[0].scanner_id
        proxy.call(
            proxy.tablet.ScannerKeepAlive,
            tserver_pb2.ScannerKeepAliveRequestPB(dest_uuid=leader.uuid, scanner_id=scanner_id),
        )
        more = tserver_pb2.ScanRequestPB(dest_uuid=leader.uuid, scanner_id=scanner_id)
        responses += list(proxy.tablet.Scan(more, timeout=30))
        assert not responses[-1].has_more_results
        assert all(r.snapshot_index == responses[0].snapshot_index for r in responses)
        ids = [
            i
            for r in responses
            if r.batch  # the answer that ends the scan carries no rows
            for i in pa.ipc.open_stream(r.batch).read_all().column("id").to_pylist()
        ]
        assert ids == list(range(300))
        # A finished scanner is gone.
        with pytest.raises(errors.ScannerExpiredError):
            proxy.call(
                proxy.tablet.ScannerKeepAlive,
                tserver_pb2.ScannerKeepAliveRequestPB(dest_uuid=leader.uuid, scanner_id=scanner_id),
            )


def _flushed_everywhere_then_restarted(cluster: MiniCluster, ids: list[int], why: str) -> None:
    """Waits until every replica has written a rowset, restarts every server and checks that
    the rows ``ids`` read back."""
    deadline = time.monotonic() + DEADLINE_S
    data_dirs = [ts.fs_root / "data" / TABLET for ts in cluster.tservers]
    while not all(list(d.rglob("*.parquet")) for d in data_dirs):
        assert time.monotonic() < deadline, why
        time.sleep(0.1)
    for ts in cluster.tservers:
        ts.kill()
        ts.restart()
    assert _checksum(_scan(cluster.leader_of(TABLET))) == _expected(ids)


def test_periodic_flush_writes_rowsets_that_survive_a_restart() -> None:
    with MiniCluster(3, tserver_flags=["--flush-interval-ms", "200"]) as cluster:
        cluster.create_tablet(TABLET, SCHEMA)
        _write_anywhere(cluster, list(range(20)), 0)
        _flushed_everywhere_then_restarted(cluster, list(range(20)), "no rowset was flushed")


def test_memory_pressure_flushes_memrowsets_that_survive_a_restart() -> None:
    # Neither the size threshold (1 GiB) nor the periodic flush (60 s) would flush these rows
    # during the test: only the 1 MiB limit on all MemRowSets together does.
    flags = ["--memrowsets-memory-limit-mb", "1", "--memory-pressure-check-interval-ms", "100"]
    with MiniCluster(3, tserver_flags=flags) as cluster:
        cluster.create_tablet(TABLET, SCHEMA)
        ids = list(range(20_000))
        for seq, start in enumerate(range(0, len(ids), 5_000)):
            _write_anywhere(cluster, ids[start : start + 5_000], seq)
        _flushed_everywhere_then_restarted(
            cluster, ids, "no MemRowSet was flushed under memory pressure"
        )


def test_sigkill_of_every_server_mid_write_keeps_acknowledged_rows(cluster: MiniCluster) -> None:
    """SIGKILL while appends are in flight leaves torn WAL tails; after a restart every
    acknowledged row is there and the tablet takes writes again."""
    cluster.create_tablet(TABLET, SCHEMA)
    acknowledged: list[int] = []
    stop = threading.Event()

    def writer() -> None:
        seq = 0
        while not stop.is_set():
            ids = list(range(seq * 10, seq * 10 + 10))
            try:
                leader = cluster.leader_of(TABLET, timeout_s=2)
                _write(leader, ids, seq, "upsert")
            except (errors.NyalaError, AssertionError):
                continue  # unacknowledged: may or may not be applied
            acknowledged.extend(ids)
            seq += 1

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    deadline = time.monotonic() + DEADLINE_S
    while len(acknowledged) < 100:
        assert time.monotonic() < deadline, "writes did not start"
        time.sleep(0.01)
    for ts in cluster.tservers:
        ts.kill()
    stop.set()
    thread.join(timeout=30)
    for ts in cluster.tservers:
        ts.restart()
    scanned = set(_scan(cluster.leader_of(TABLET)).column("id").to_pylist())
    assert set(acknowledged) <= scanned
    _write_anywhere(cluster, [10**9], 10**6)
