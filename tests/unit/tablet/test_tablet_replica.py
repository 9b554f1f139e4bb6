"""Three TabletReplicas (real WAL, real storage, real Raft runtime) over an in-memory network:
writes through the leader, follower refusals, exactly-once retries, linearizable scans, and
bootstrap after a restart (storage at last_flushed_index, committed entries re-applied)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pytest

from nyala import errors
from nyala._proto import common_pb2, tserver_pb2
from nyala.common.clock import RealClock
from nyala.common.metrics import MetricsRegistry
from nyala.consensus.options import RaftOptions
from nyala.consensus.runtime import RuntimeOptions
from nyala.consensus.runtime.transport import InMemoryNetwork
from nyala.consensus.runtime.wal_log import WalLogOptions
from nyala.consensus.types import RaftConfig, RaftPeer, Role
from nyala.rowops import encode, make_op_batch
from nyala.rpc import RpcMetrics
from nyala.schema import Column, Schema
from nyala.storage import RowStatus
from nyala.tablet import Partition, TabletDirs, TabletManager
from nyala.tablet.applier import WriteOutcome
from nyala.tablet.replica import TabletReplica, TabletState
from nyala.tablet.write_entry import (
    RequestId,
    decode_write_entry,
    encode_write_entry,
)
from nyala.testing.garbage import collector_off
from nyala.tserver.memory import MemoryTracker, MemoryUsage
from nyala.tserver.scanners import ScannerRegistry
from nyala.tserver.services import TabletService

SCHEMA = Schema([Column("id", "int64"), Column("v", "string", nullable=True)], ["id"])
UUIDS = ("a" * 32, "b" * 32, "c" * 32)
CONFIG = RaftConfig(tuple(RaftPeer(u, f"127.0.0.1:{7050 + i}") for i, u in enumerate(UUIDS)))
TABLET = "7" * 32
RAFT = RaftOptions(heartbeat_interval_ms=30, missed_heartbeats_before_election=3)
RUNTIME = RuntimeOptions(timer_slack_ms=5)
WAIT_S = 15.0


def _ops(ids: list[int], op: str = "insert") -> bytes:
    batch = make_op_batch({"id": ids, "v": [f"v{i}" for i in ids]}, op, SCHEMA)
    return bytes(encode(batch).to_pybytes())


def test_write_entry_round_trip_and_damage() -> None:
    rid = RequestId("client-1", 7, 5)
    payload = encode_write_entry(rid, 3, b"arrow-bytes")
    entry = decode_write_entry(payload)
    assert entry.request_id == rid
    assert entry.schema_version == 3
    assert bytes(entry.ops) == b"arrow-bytes"
    assert decode_write_entry(encode_write_entry(None, 0, b"x")).request_id is None
    with pytest.raises(errors.CorruptionError):
        decode_write_entry(b"NYWR")
    with pytest.raises(errors.CorruptionError):
        decode_write_entry(b"XXXX" + payload[4:])
    with pytest.raises(errors.InvalidArgumentError):
        encode_write_entry(RequestId("c", -2, 0), 0, b"")


@pytest.mark.parametrize("client_id", ["", "c", "client-1", "0123456789abcdef0123456789abcdef"])
def test_write_entry_ops_start_aligned_and_version_1_is_still_read(client_id: str) -> None:
    rid = RequestId(client_id, 1, 0)
    payload = encode_write_entry(rid, 2, b"ops")
    assert payload.index(b"ops") % 8 == 0
    assert payload[4] == 3
    # Version 1 (before the padding and the timestamp) put the ops right after the client id.
    header = bytearray(payload[:28] + client_id.encode())
    header[4] = 1
    old = decode_write_entry(bytes(header) + b"old-ops")
    assert (old.request_id, bytes(old.ops)) == (rid, b"old-ops")
    with pytest.raises(errors.NotSupportedError):
        decode_write_entry(payload[:4] + b"\x04" + payload[5:])


def _managers(root: Path) -> dict[str, TabletManager]:
    out = {}
    for uuid in UUIDS:
        dirs = TabletDirs(
            tablet_meta=root / uuid / "tablet-meta",
            consensus_meta=root / uuid / "consensus-meta",
            wals=root / uuid / "wals",
            data=root / uuid / "data",
        )
        for p in (dirs.tablet_meta, dirs.consensus_meta, dirs.wals, dirs.data):
            p.mkdir(parents=True, exist_ok=True)
        manager = TabletManager(dirs, WalLogOptions(segment_size_bytes=1 << 20))
        manager.open_all()
        out[uuid] = manager
    return out


@asynccontextmanager
async def _running(
    root: Path, *, create: bool, managers: dict[str, TabletManager] | None = None
) -> AsyncIterator[dict[str, TabletReplica]]:
    """Three replicas of ``TABLET``; ``managers``, if given, is filled with their managers."""
    opened = _managers(root)
    if managers is not None:
        managers.update(opened)
    replicas = {}
    for uuid, manager in opened.items():
        if create:
            manager.create_tablet(
                TABLET,
                table_id="t",
                table_name="t",
                schema=SCHEMA,
                partition=Partition(),
                config=CONFIG,
            )
        replicas[uuid] = manager.replica(TABLET)
    network = InMemoryNetwork()
    try:
        async with asyncio.TaskGroup() as group:
            for uuid, replica in replicas.items():
                replica.start_consensus(
                    uuid,
                    group,
                    network.transport(uuid),
                    RealClock(),
                    raft_options=RAFT,
                    runtime_options=RUNTIME,
                )
            yield replicas
            for replica in replicas.values():
                await replica.stop_consensus()
    finally:
        for manager in opened.values():
            manager.shutdown()


def _is_leader(replica: TabletReplica) -> bool:
    return replica.runtime is not None and replica.runtime.role is Role.LEADER


async def _leader(replicas: dict[str, TabletReplica]) -> TabletReplica:
    async with asyncio.timeout(WAIT_S):
        while True:
            leaders = [
                r
                for r in replicas.values()
                if r.runtime is not None and r.runtime.role is Role.LEADER
            ]
            if len(leaders) == 1:
                return leaders[0]
            await asyncio.sleep(0.005)


async def _write_retrying(replicas: dict[str, TabletReplica], ids: list[int]) -> None:
    async with asyncio.timeout(WAIT_S):
        while True:
            leader = await _leader(replicas)
            try:
                outcome = await leader.write(None, 0, _ops(ids))
            except errors.NotLeaderError:
                await asyncio.sleep(0.01)
                continue
            assert outcome.result is not None
            assert outcome.result.ok
            return


def _rows(replica: TabletReplica) -> list[int]:
    assert replica.storage is not None
    table = replica.storage.scan(["id"])
    return sorted(table.column("id").to_pylist())


async def _converged(replicas: dict[str, TabletReplica], expected: list[int]) -> None:
    async with asyncio.timeout(WAIT_S):
        while True:
            if all(_rows(r) == expected for r in replicas.values()):
                return
            await asyncio.sleep(0.01)


def test_writes_through_the_leader_reach_every_replica(tmp_path: Path) -> None:
    asyncio.run(_writes_through_the_leader_reach_every_replica(tmp_path))


async def _writes_through_the_leader_reach_every_replica(tmp_path: Path) -> None:
    async with _running(tmp_path, create=True) as replicas:
        leader = await _leader(replicas)
        assert leader.state is TabletState.RUNNING
        outcome = await leader.write(RequestId("c1", 0, 0), 0, _ops([1, 2, 3]))
        assert outcome.result is not None
        assert outcome.result.ok
        # Per-row errors: a second insert of key 2 is ALREADY_PRESENT, key 4 goes in.
        outcome = await leader.write(RequestId("c1", 1, 0), 0, _ops([2, 4]))
        assert outcome.result is not None
        assert outcome.result.errors() == [(0, RowStatus.ALREADY_PRESENT)]
        # A malformed batch is refused whole, identically everywhere; replicas keep going.
        refused = await leader.write(None, 0, b"not an arrow stream")
        assert refused.result is None
        assert refused.error is not None
        assert "malformed" in refused.error
        _, scanned = await leader.scan(["id", "v"])
        assert isinstance(scanned, pa.Table)
        assert scanned.column("id").to_pylist() == [1, 2, 3, 4]
        await _converged(replicas, [1, 2, 3, 4])


def test_a_follower_refuses_writes_and_scans_with_the_leader_hint(tmp_path: Path) -> None:
    asyncio.run(_a_follower_refuses_writes_and_scans_with_the_leader_hint(tmp_path))


async def _a_follower_refuses_writes_and_scans_with_the_leader_hint(tmp_path: Path) -> None:
    async with _running(tmp_path, create=True) as replicas:
        leader = await _leader(replicas)
        await leader.write(None, 0, _ops([1]))  # followers have heard from the leader by now
        await _converged(replicas, [1])
        follower = next(r for r in replicas.values() if r is not leader)
        assert leader.runtime is not None
        with pytest.raises(errors.NotLeaderError) as info:
            await follower.write(None, 0, _ops([2]))
        assert info.value.leader_uuid == leader.runtime.uuid
        assert info.value.leader_addr == CONFIG.peer(leader.runtime.uuid).address  # type: ignore[union-attr]
        with pytest.raises(errors.NotLeaderError):
            await follower.scan()
        with pytest.raises(errors.SchemaMismatchError):
            await leader.write(None, 1, _ops([2]))


def test_a_retried_request_is_applied_once(tmp_path: Path) -> None:
    asyncio.run(_a_retried_request_is_applied_once(tmp_path))


async def _a_retried_request_is_applied_once(tmp_path: Path) -> None:
    async with _running(tmp_path, create=True) as replicas:
        leader = await _leader(replicas)
        rid = RequestId("client", 5, 5)
        first = await leader.write(rid, 0, _ops([10], "upsert"))
        again = await leader.write(rid, 0, _ops([10, 11], "upsert"))
        assert again == first
        await _converged(replicas, [10])
        # A duplicate that reached the log anyway (a retry racing a leader change) is not
        # applied again on any replica.
        assert leader.runtime is not None
        await leader.runtime.propose(encode_write_entry(rid, 0, _ops([12], "upsert")))
        await leader.write(RequestId("client", 6, 6), 0, _ops([13], "upsert"))
        await _converged(replicas, [10, 13])
        # Request 5 was declared complete (first incomplete is now 6) and is forgotten: a late
        # retry of it is refused instead of being applied a second time.
        with pytest.raises(errors.AbortedError, match="declared complete"):
            await leader.write(rid, 0, _ops([14], "upsert"))


def test_a_retry_racing_its_first_entry_answers_with_the_first_timestamp(tmp_path: Path) -> None:
    asyncio.run(_a_retry_racing_its_first_entry(tmp_path))


async def _a_retry_racing_its_first_entry(tmp_path: Path) -> None:
    """The retry is proposed before the first entry applied (as after a leader change): its
    entry applies as a duplicate, and its answer is the first one's, timestamp included, so
    a snapshot read at the acknowledged time is the first to see the row."""
    async with _running(tmp_path, create=True) as replicas:
        leader = await _leader(replicas)
        rid = RequestId("racer", 3, 3)
        first, again = await asyncio.gather(
            leader.write(rid, 0, _ops([20], "upsert")), leader.write(rid, 0, _ops([21], "upsert"))
        )
        assert again == first
        await _converged(replicas, [20])
        assert leader.storage is not None
        assert leader.applier is not None
        assert leader.applier.applied_index >= first.op_index + 1, "both entries applied"
        seen = leader.storage.scan(["id"], snapshot_ts=again.timestamp).column("id")
        before = leader.storage.scan(["id"], snapshot_ts=again.timestamp - 1).column("id")
        assert (seen.to_pylist(), before.to_pylist()) == ([20], [])


def test_restart_replays_committed_entries_above_last_flushed_index(tmp_path: Path) -> None:
    asyncio.run(_restart_replays_committed_entries_above_last_flushed_index(tmp_path))


async def _restart_replays_committed_entries_above_last_flushed_index(tmp_path: Path) -> None:
    async with _running(tmp_path, create=True) as replicas:
        await _write_retrying(replicas, [1, 2])
        await _converged(replicas, [1, 2])
        for replica in replicas.values():
            assert replica.storage is not None
            replica.storage.flush()  # rows 1, 2 now in rowsets
        await _write_retrying(replicas, [3])
        await _write_retrying(replicas, [4, 5])
        await _converged(replicas, [1, 2, 3, 4, 5])
        flushed = {u: r.storage.last_flushed_index for u, r in replicas.items() if r.storage}
    async with _running(tmp_path, create=False) as replicas:
        for uuid, replica in replicas.items():
            assert replica.storage is not None
            # Storage restarted at its flush point; the rest comes back from the WAL.
            assert replica.storage.last_flushed_index == flushed[uuid]
        await _converged(replicas, [1, 2, 3, 4, 5])
        await _write_retrying(replicas, [6])
        await _converged(replicas, [1, 2, 3, 4, 5, 6])


def test_outcomes_arriving_out_of_order_are_kept_until_the_client_completes_them(
    tmp_path: Path,
) -> None:
    asyncio.run(_outcomes_arriving_out_of_order(tmp_path))


async def _outcomes_arriving_out_of_order(tmp_path: Path) -> None:
    async with _running(tmp_path, create=True) as replicas:
        leader = await _leader(replicas)
        # Concurrent requests of one client reach the log out of seq-no order.
        outcomes = {}
        for seq in (3, 1, 2):
            outcomes[seq] = await leader.write(RequestId("c", seq, 1), 0, _ops([seq], "upsert"))
        for seq in (1, 2, 3):  # retries answer with the first outcome
            again = await leader.write(RequestId("c", seq, 1), 0, _ops([99], "upsert"))
            assert again == outcomes[seq]
        # Requests 1 and 2 are declared complete; 3 (still incomplete) is kept.
        await leader.write(RequestId("c", 4, 3), 0, _ops([4], "upsert"))
        for seq in (1, 2):
            with pytest.raises(errors.AbortedError, match="declared complete"):
                await leader.write(RequestId("c", seq, 3), 0, _ops([99], "upsert"))
        assert await leader.write(RequestId("c", 3, 3), 0, _ops([99], "upsert")) == outcomes[3]
        await _converged(replicas, [1, 2, 3, 4])


def test_write_many_answers_each_request_on_its_own(tmp_path: Path) -> None:
    asyncio.run(_write_many_answers_each_request_on_its_own(tmp_path))


async def _write_many_answers_each_request_on_its_own(tmp_path: Path) -> None:
    async with _running(tmp_path, create=True) as replicas:
        leader = await _leader(replicas)
        first = await leader.write(RequestId("m", 1, 1), 0, _ops([1]))
        results = await leader.write_many(
            [
                (RequestId("m", 2, 1), 0, _ops([2, 3])),
                (RequestId("m", 1, 1), 0, _ops([50])),  # a retry: the first outcome
                (RequestId("m", 3, 1), 1, _ops([4])),  # wrong schema version
                (RequestId("m", 4, 1), 0, _ops([2, 5])),  # key 2 is taken by the first
                (None, 0, b"not an arrow stream"),  # refused whole, others unaffected
            ]
        )
        assert len(results) == 5
        assert isinstance(results[0], WriteOutcome)
        assert results[0].result is not None
        assert results[0].result.ok
        assert results[1] == first
        assert isinstance(results[2], errors.SchemaMismatchError)
        assert isinstance(results[3], WriteOutcome)
        assert results[3].result is not None
        assert results[3].result.errors() == [(0, RowStatus.ALREADY_PRESENT)]
        assert results[0].op_index < results[3].op_index  # proposed in request order
        assert isinstance(results[4], WriteOutcome)
        assert results[4].result is None
        await _converged(replicas, [1, 2, 3, 5])
        follower = next(r for r in replicas.values() if r is not leader)
        with pytest.raises(errors.NotLeaderError):
            await follower.write_many([(RequestId("m", 9, 1), 0, _ops([9]))])


def test_a_retry_after_a_flush_and_restart_gets_its_first_outcome(tmp_path: Path) -> None:
    asyncio.run(_a_retry_after_a_flush_and_restart(tmp_path))


async def _a_retry_after_a_flush_and_restart(tmp_path: Path) -> None:
    """The request outcomes are persisted with the flush: after every replica flushed and
    restarted (nothing left to replay from the WAL), retries answer with their first
    outcomes and are not applied again; a stale retry is still refused."""
    requests = {
        "stale": (RequestId("c", 0, 0), _ops([0])),
        "insert": (RequestId("c", 1, 1), _ops([1])),
        "upsert": (RequestId("c", 2, 1), _ops([2], "upsert")),
        "mixed": (RequestId("c", 3, 1), _ops([1, 3])),  # key 1 is taken: ALREADY_PRESENT
    }
    async with _running(tmp_path, create=True) as replicas:
        leader = await _leader(replicas)
        first = {name: await leader.write(rid, 0, ops) for name, (rid, ops) in requests.items()}
        assert first["insert"].result is not None
        assert first["insert"].result.ok
        assert first["mixed"].result is not None
        assert first["mixed"].result.errors() == [(0, RowStatus.ALREADY_PRESENT)]
        await _converged(replicas, [0, 1, 2, 3])
        for replica in replicas.values():
            assert replica.storage is not None
            replica.storage.flush()
            assert replica.storage.last_flushed_index >= first["mixed"].op_index
    async with _running(tmp_path, create=False) as replicas:
        for replica in replicas.values():  # every replica knows them, whichever leads
            assert replica.applier is not None
            for name in ("insert", "upsert", "mixed"):
                assert replica.applier.outcome_of(requests[name][0]) == first[name]
        leader = await _leader(replicas)
        for name in ("insert", "upsert", "mixed"):
            rid, ops = requests[name]
            again = await leader.write(rid, 0, ops)
            # Op index, statuses (the insert APPLIED, not ALREADY_PRESENT) and timestamp.
            assert again == first[name], name
        # Answered by its request id alone: rows a retry would add (key 4) stay out.
        upsert_id = requests["upsert"][0]
        assert await leader.write(upsert_id, 0, _ops([2, 4], "upsert")) == first["upsert"]
        with pytest.raises(errors.AbortedError, match="declared complete"):
            await leader.write(requests["stale"][0], 0, requests["stale"][1])
        # The upsert's version is still the first one's.
        assert leader.storage is not None
        stamp = first["upsert"].timestamp
        before = leader.storage.scan(["id"], snapshot_ts=stamp - 1).column("id").to_pylist()
        assert 2 not in before
        assert 2 in leader.storage.scan(["id"], snapshot_ts=stamp).column("id").to_pylist()
        await leader.write(RequestId("c", 4, 4), 0, _ops([5]))  # a new request still applies
        await _converged(replicas, [0, 1, 2, 3, 5])


def test_refused_writes_are_freed_without_the_cyclic_collector(tmp_path: Path) -> None:
    """A refused write's error is kept as its answer (``errors.kept_as_answer``); with its
    traceback it would hold the frames that served the write, their requests and the list it
    sits in: a cycle only the cyclic collector frees, which servers run rarely. A tablet server
    refusing 500,000-row writes over its soft memory limit held 1 GB of them so. Each way a
    write can be refused as one answer among others: over the soft limit (one tablet's writes,
    awaited in the call's task), meant for another server, and refused by the replica before it
    is proposed (a schema version mismatch)."""
    asyncio.run(_refused_writes_are_freed_without_the_cyclic_collector(tmp_path))


async def _refused_writes_are_freed_without_the_cyclic_collector(tmp_path: Path) -> None:
    managers: dict[str, TabletManager] = {}
    async with _running(tmp_path, create=True, managers=managers) as replicas:
        leader = await _leader(replicas)
        uuid = next(u for u, r in replicas.items() if r is leader)
        # Over its soft limit with a MemRowSet to flush: every write is refused (retriable).
        full = MemoryTracker(100 << 20)
        full.update(MemoryUsage(memrowsets_bytes=1 << 20, untracked_bytes=200 << 20))
        services = [
            TabletService(
                uuid,
                RpcMetrics(MetricsRegistry()),
                time.monotonic(),
                managers[uuid],
                ScannerRegistry(60_000),
                admit_write=admit,
            )
            for admit in (full.admit_write, None)
        ]
        ops = _ops(list(range(2_000)))
        with collector_off() as left:
            for service, dest, version, refused in [
                (services[0], uuid, 0, common_pb2.SERVICE_UNAVAILABLE),
                (services[1], "d" * 32, 0, common_pb2.WRONG_SERVER_UUID),
                (services[1], uuid, 7, common_pb2.MISMATCHED_SCHEMA),
            ]:
                for seq in range(3):
                    sub = tserver_pb2.WriteRequestPB(
                        dest_uuid=dest, tablet_id=TABLET, schema_version=version, ops=ops
                    )
                    sub.request_id.client_id = "refused"
                    sub.request_id.seq_no = seq
                    multi = tserver_pb2.WriteMultiRequestPB(dest_uuid=uuid, requests=[sub])
                    answer = await service.WriteMulti(multi, cast(Any, None))
                    assert [r.error.code for r in answer.responses] == [refused]
            requests = (tserver_pb2.WriteMultiRequestPB, tserver_pb2.WriteRequestPB)
            kept = left((errors.NyalaError, *requests))
            assert kept == [], kept[:5]
        assert full.writes_refused == 3
