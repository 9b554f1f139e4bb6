"""Exactly once across restarts on real processes (issue 34, item 5; docs/tablet-lifecycle.md).

A write is acknowledged, every replica flushes it (the age-based flush, every 200 ms) and
every tablet server is SIGKILLed and restarted: nothing is left to replay from the WAL, so
only the request outcomes persisted with the flush can answer a retry. The same request,
sent again under its request id, must get its first answer, and its rows must be there once.
"""

from __future__ import annotations

import time
from typing import Any

from nyala._proto import common_pb2, tserver_pb2
from nyala.rowops import encode, make_op_batch
from nyala.schema import Column, Schema
from nyala.storage import StorageEngine
from nyala.testing import MiniCluster, tablet_ops
from nyala.testing.mini_cluster import FAST_TSERVER_FLAGS, ServerProcess

SCHEMA = Schema([Column("id", "int64"), Column("v", "string", nullable=True)], ["id"])
TABLET = "e" * 32
CLIENT = "exactly-once-test"
FLUSH_WAIT_S = 20.0


def _write(ts: ServerProcess, seq: int, op: str, ids: list[int]) -> Any:
    batch = make_op_batch({"id": ids, "v": [f"v{i}" for i in ids]}, op, SCHEMA)
    request = tserver_pb2.WriteRequestPB(
        dest_uuid=ts.uuid,
        tablet_id=TABLET,
        request_id=common_pb2.RequestIdPB(
            client_id=CLIENT, seq_no=seq, first_incomplete_seq_no=1, attempt_no=0
        ),
        schema_version=SCHEMA.version,
        ops=encode(batch).to_pybytes(),
    )
    with ts.proxy() as proxy:
        return proxy.call(proxy.tablet.Write, request, timeout_ms=10_000)


def _flushed_index(ts: ServerProcess) -> int:
    """The replica's last flushed op index, read from its data directory (server down)."""
    engine = StorageEngine.open(ts.fs_root / "data" / TABLET, background_flush=False)
    return engine.last_flushed_index


def test_a_retry_after_flush_and_restart_gets_the_first_answer(make_cluster: Any) -> None:
    cluster: MiniCluster = make_cluster(
        3, tserver_flags=[*FAST_TSERVER_FLAGS, "--flush-interval-ms", "200"]
    )
    cluster.create_tablet(TABLET, SCHEMA)
    leader = cluster.leader_of(TABLET)
    first = {
        1: _write(leader, 1, "insert", [1, 2]),
        2: _write(leader, 2, "upsert", [3]),
    }
    assert not first[1].per_row_errors
    assert not first[2].per_row_errors
    last_index = max(r.op_id.index for r in first.values())
    # Every replica flushes the writes; then all servers die together.
    deadline = time.monotonic() + FLUSH_WAIT_S
    time.sleep(1.0)  # five flush intervals
    while True:
        for ts in cluster.tservers:
            ts.kill()
        if all(_flushed_index(ts) >= last_index for ts in cluster.tservers):
            break
        assert time.monotonic() < deadline, "the replicas did not flush the writes"
        for ts in cluster.tservers:
            ts.start()
        for ts in cluster.tservers:
            ts.wait_ready()
        time.sleep(1.0)
    for ts in cluster.tservers:
        ts.start()
    for ts in cluster.tservers:
        ts.wait_ready()
    leader = cluster.leader_of(TABLET)
    for seq, op, ids in ((1, "insert", [1, 2]), (2, "upsert", [3])):
        again = _write(leader, seq, op, ids)
        # The insert is not ALREADY_PRESENT; op index and timestamp are the first's.
        assert list(again.per_row_errors) == [], seq
        assert again.op_id.index == first[seq].op_id.index, seq
        assert again.timestamp == first[seq].timestamp, seq
    rows = tablet_ops.scan(leader, TABLET, SCHEMA)
    assert sorted(rows.column("id").to_pylist()) == [1, 2, 3]
