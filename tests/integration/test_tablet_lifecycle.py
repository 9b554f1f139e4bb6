"""Tablet lifecycle on three real tserver processes: CreateTablet with the initial config,
listing, idempotence, tombstones and deletes across restarts, damaged metadata."""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nyala import errors
from nyala._proto import metadata_pb2, tserver_admin_pb2
from nyala.chaos.disk_fault import DiskFaults
from nyala.common import metafile
from nyala.rpc.schema_pb import schema_from_pb, schema_to_pb
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster
from nyala.testing.master_ops import wait_until
from nyala.testing.mini_cluster import ServerProcess, corrupt_file
from nyala.testing.tablet_ops import scan, write, write_request, write_to_leader

SCHEMA = Schema([Column("id", "int64"), Column("v", "string", nullable=True)], ["id"])
A, B = "a" * 32, "b" * 32
C_ELSEWHERE = "e" * 32


def _list(ts: ServerProcess) -> dict[str, Any]:
    with ts.proxy() as proxy:
        response = proxy.admin_call(
            proxy.admin.ListTablets,
            tserver_admin_pb2.ListTabletsRequestPB(dest_uuid=ts.uuid, need_schema_info=True),
        )
    return {entry.tablet_status.tablet_id: entry for entry in response.status_and_schema}


def _states(ts: ServerProcess) -> dict[str, tuple[str, str]]:
    return {
        tablet_id: (
            metadata_pb2.TabletState.Name(e.tablet_status.state),
            metadata_pb2.TabletDataState.Name(e.tablet_status.data_state),
        )
        for tablet_id, e in _list(ts).items()
    }


def _rows(first: int, end: int) -> dict[str, list[Any]]:
    return {"id": list(range(first, end)), "v": [f"v{i}" for i in range(first, end)]}


def _delete(ts: ServerProcess, tablet_id: str, kind: int) -> None:
    request = tserver_admin_pb2.DeleteTabletRequestPB(
        dest_uuid=ts.uuid, tablet_id=tablet_id, delete_type=kind, reason="test"
    )
    with ts.proxy() as proxy:
        proxy.admin_call(proxy.admin.DeleteTablet, request)


def test_create_tablet_on_every_server_is_listed_with_its_schema(cluster: MiniCluster) -> None:
    cluster.create_tablet(A, SCHEMA, table_name="events")
    cluster.create_tablet(A, SCHEMA, table_name="events")  # the same request again: fine
    for ts in cluster.tservers:
        entry = _list(ts)[A]
        status = entry.tablet_status
        assert status.table_name == "events"
        assert metadata_pb2.TabletDataState.Name(status.data_state) == "TABLET_DATA_READY"
        assert metadata_pb2.TabletState.Name(status.state) != "FAILED"
        assert schema_from_pb(entry.schema) == SCHEMA
        for sub in ("tablet-meta", "consensus-meta", "wals", "data"):
            assert (ts.fs_root / sub / A).exists(), sub


def test_create_tablet_refusals(cluster: MiniCluster) -> None:
    cluster.create_tablet(A, SCHEMA)
    # Another initial config for the same tablet is not the same request.
    with pytest.raises(errors.AlreadyPresentError):
        cluster.create_tablet(A, SCHEMA, servers=cluster.tservers[:2])
    first, second = cluster.tserver(0), cluster.tserver(1)
    request = tserver_admin_pb2.CreateTabletRequestPB(
        dest_uuid=second.uuid,
        tablet_id=B,
        table_id=B,
        table_name="t",
        config=cluster.initial_config(),
    )
    with first.proxy() as proxy:
        with pytest.raises(errors.WrongServerUuidError):
            proxy.admin_call(proxy.admin.CreateTablet, request)
        request.dest_uuid = first.uuid
        with pytest.raises(errors.InvalidArgumentError, match="schema"):
            proxy.admin_call(proxy.admin.CreateTablet, request)
    # A config that does not list the server is refused by that server.
    request.config.CopyFrom(cluster.initial_config(cluster.tservers[1:]))
    request.schema.CopyFrom(schema_to_pb(SCHEMA))
    with (
        first.proxy() as proxy,
        pytest.raises(errors.InvalidArgumentError, match="does not list this server"),
    ):
        proxy.admin_call(proxy.admin.CreateTablet, request)


def test_tombstone_and_delete_survive_a_restart(cluster: MiniCluster) -> None:
    ts = cluster.tserver(2)
    # A and B live on ``ts`` alone: a deleted replica still in a live group's config is copied
    # back by its leader (auto-vivification, docs/tablet-copy.md). C lives on the others.
    cluster.create_tablet(A, SCHEMA, servers=[ts])
    cluster.create_tablet(B, SCHEMA, servers=[ts])
    cluster.create_tablet(C_ELSEWHERE, SCHEMA, servers=cluster.tservers[:2])
    _delete(ts, A, metadata_pb2.TABLET_DATA_TOMBSTONED)
    _delete(ts, B, metadata_pb2.TABLET_DATA_DELETED)
    assert _states(ts) == {A: ("STOPPED", "TABLET_DATA_TOMBSTONED")}
    ts.kill()
    ts.restart()
    assert _states(ts) == {A: ("STOPPED", "TABLET_DATA_TOMBSTONED")}
    assert (ts.fs_root / "consensus-meta" / A).exists()  # kept so the replica can vote
    assert not (ts.fs_root / "wals" / A).exists()
    assert not (ts.fs_root / "data" / A).exists()
    for sub in ("tablet-meta", "consensus-meta", "wals", "data"):
        assert not (ts.fs_root / sub / B).exists(), sub
    with pytest.raises(errors.TabletNotFoundError):
        _delete(ts, B, metadata_pb2.TABLET_DATA_DELETED)
    # The other servers' replicas are untouched.
    assert set(_list(cluster.tserver(0))) == {C_ELSEWHERE}


def test_damaged_superblock_or_cmeta_fails_only_that_tablet(cluster: MiniCluster) -> None:
    cluster.create_tablet(A, SCHEMA)
    cluster.create_tablet(B, SCHEMA)
    ts = cluster.tserver(1)
    ts.kill()
    superblock = ts.fs_root / "tablet-meta" / A
    corrupt_file(superblock)
    ts.restart()
    listed = _list(ts)
    failed = listed[A].tablet_status
    assert metadata_pb2.TabletState.Name(failed.state) == "FAILED"
    assert str(superblock) in failed.state_reason
    assert metadata_pb2.TabletState.Name(listed[B].tablet_status.state) != "FAILED"

    ts.kill()
    metafile.write_atomic(
        ts.fs_root / "consensus-meta" / B, metafile.MetaKind.CONSENSUS_META, b"not json"
    )
    ts.restart()
    states = _states(ts)
    assert states[A][0] == "FAILED"
    assert states[B][0] == "FAILED"
    assert "CorruptionError" in _list(ts)[B].tablet_status.state_reason
    # The other servers never noticed.
    for other in (cluster.tserver(0), cluster.tserver(2)):
        assert all(state != "FAILED" for state, _ in _states(other).values())


def test_a_replica_whose_wal_fails_goes_failed_and_its_server_keeps_serving(
    tmp_path: Path, make_cluster: Callable[..., MiniCluster]
) -> None:
    """Every sync of the leader's process fails (the chaos disk shim): its replica goes FAILED
    with the reason, the process keeps running and answering, the other two go on without it,
    and after a restart on a healthy disk the replica serves again with every acknowledged
    row."""
    faults = DiskFaults(tmp_path)
    faults.build()
    with faults.environment():
        cluster = make_cluster(3)
    cluster.create_tablet(A, SCHEMA)
    write_to_leader(cluster, A, SCHEMA, _rows(0, 100), op="insert", client_id="c", seq_no=1)
    victim = cluster.leader_of(A)
    assert victim.pid is not None
    faults.arm(victim.pid, errno.EIO)
    with contextlib.suppress(errors.NyalaError):  # its sync fails: never acknowledged
        write(victim, write_request(victim, A, SCHEMA, _rows(100, 200), op="insert",
                                    client_id="c", seq_no=2))  # fmt: skip
    wait_until(lambda: _states(victim)[A][0] == "FAILED", what="the replica FAILED")
    reason = _list(victim)[A].tablet_status.state_reason
    assert "consensus failed" in reason
    assert victim.is_running()
    assert victim.ping().server_uuid == victim.uuid
    # The two others elect a leader among themselves and take writes.
    write_to_leader(cluster, A, SCHEMA, _rows(100, 200), op="upsert", client_id="c", seq_no=3)

    faults.disarm(victim.pid)
    victim.restart()
    wait_until(lambda: _states(victim)[A][0] == "RUNNING", what="the replica RUNNING again")
    leader = cluster.leader_of(A)
    assert sorted(scan(leader, A, SCHEMA).column("id").to_pylist()) == list(range(200))
