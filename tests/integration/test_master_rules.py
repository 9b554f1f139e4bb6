"""Master rules that only a real cluster shows (issue 31), each with its own cluster:

* a CreateTable whose replication fails leaves no trace: clients never see the table while its
  batch is out, a new leader's catalog has no such table, and no tablet server was asked to
  create a replica of it (seed 002, exception 1: records are committed to memory only once
  replicated);
* a master that lost its catalog (its fs root wiped, the sys catalog formed again) hears the
  tablet servers report replicas it has no record of, and deletes none of them: their data
  survives (seed 002, Appendix A);
* the sys catalog flushes and garbage-collects its WAL like any tablet, so after many DDL
  operations and leader changes no master holds its first WAL segment any more; a fourth master
  added then cannot catch up from the leader's log, gets the sys catalog by tablet copy, is
  promoted, and, made leader, serves the whole catalog.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

from nyala import errors
from nyala._proto import (
    common_pb2,
    consensus_pb2,
    master_pb2,
    tablet_copy_pb2,
    tserver_admin_pb2,
)
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster, dump_logs
from nyala.testing import master_ops as ops
from nyala.testing.mini_cluster import FAST_TSERVER_FLAGS, ServerProcess, fast_master_flags
from nyala.testing.tablet_ops import scan, write_to_leader

SCHEMA = Schema([Column("id", "int64"), Column("v", "string", nullable=True)], key=["id"])
SYS_CATALOG = "0" * 32


def _table_names_on(ts: ServerProcess) -> list[str]:
    request = tserver_admin_pb2.ListTabletsRequestPB(dest_uuid=ts.uuid)
    with ts.proxy() as proxy:
        response = proxy.call(proxy.admin.ListTablets, request)
    return [e.tablet_status.table_name for e in response.status_and_schema]


def _replica_states(ts: ServerProcess) -> dict[str, str]:
    request = tserver_admin_pb2.ListTabletsRequestPB(dest_uuid=ts.uuid)
    with ts.proxy() as proxy:
        response = proxy.call(proxy.admin.ListTablets, request)
    return {
        e.tablet_status.tablet_id: str(e.tablet_status.data_state)
        for e in response.status_and_schema
    }


def _ask_tables(master: ServerProcess) -> list[str]:
    """The tables ``master`` lists (it must lead); [] when it refuses."""
    request = master_pb2.ListTablesRequestPB(dest_uuid=master.uuid)
    try:
        with master.proxy() as proxy:
            answer = proxy.call(proxy.master.ListTables, request, timeout_ms=1_000)
    except errors.NyalaError:
        return []
    return [t.name for t in answer.tables]


def test_create_table_that_fails_to_replicate_leaves_no_trace() -> None:
    flags = fast_master_flags("--catalog-write-timeout-ms", "3000")
    with MiniCluster(
        3, num_masters=3, master_flags=flags, tserver_flags=FAST_TSERVER_FLAGS
    ) as cluster:
        try:
            ops.call(cluster, "CreateTable", ops.create_table_request("kept", SCHEMA))
            ops.wait_create_done(cluster, "kept")
            leader = cluster.leader_master()
            followers = [m for m in cluster.masters if m is not leader]
            for master in followers:
                master.kill()  # the leader can no longer commit anything
            outcome: list[BaseException | None] = []

            def create() -> None:
                request = ops.create_table_request("ghost", SCHEMA, buckets=2)
                request.dest_uuid = leader.uuid or ""
                try:
                    with leader.proxy() as proxy:
                        proxy.call(proxy.master.CreateTable, request, timeout_ms=20_000)
                    outcome.append(None)
                except errors.NyalaError as exc:
                    outcome.append(exc)

            thread = threading.Thread(target=create)
            thread.start()
            seen: set[str] = set()
            while thread.is_alive():  # clients asking the leader while the batch is out
                seen.update(_ask_tables(leader))
                time.sleep(0.05)
            thread.join()
            assert outcome, "CreateTable did not answer"
            assert isinstance(outcome[0], errors.NyalaError), "ghost was acknowledged"
            assert "ghost" not in seen
            assert "kept" in seen or not seen

            # Its batch never reached a follower: without it they elect a leader, whose
            # catalog has no trace of it, and no tablet server was asked for a replica.
            leader.kill()
            for master in followers:
                master.restart()
            assert "ghost" not in ops.list_tables(cluster)
            leader.restart()
            assert "kept" in ops.list_tables(cluster)
            assert "ghost" not in ops.list_tables(cluster)
            time.sleep(1.0)  # background tasks of the new leader run every 100 ms
            for ts in cluster.tservers:
                assert "ghost" not in _table_names_on(ts)
        except BaseException:
            dump_logs(cluster, sys.stderr)
            raise


def test_master_that_lost_its_catalog_deletes_no_replica_it_does_not_know() -> None:
    with MiniCluster(
        3, num_masters=1, master_flags=fast_master_flags(), tserver_flags=FAST_TSERVER_FLAGS
    ) as cluster:
        try:
            ops.call(cluster, "CreateTable", ops.create_table_request("t", SCHEMA, buckets=2))
            ops.wait_create_done(cluster, "t")
            tablets = [loc.tablet_id for loc in ops.locations(cluster, "t")]
            for n, tablet_id in enumerate(tablets):
                data = {"id": [n], "v": ["kept"]}
                write_to_leader(
                    cluster, tablet_id, SCHEMA, data, op="insert", client_id="c", seq_no=n
                )
            before = {ts.uuid: _replica_states(ts) for ts in cluster.tservers}

            master = cluster.masters[0]
            master.kill()
            master.wipe()
            master.restart()  # a new, empty sys catalog: it knows none of the tablets
            assert ops.list_tables(cluster) == {}
            time.sleep(3.0)  # many heartbeats with full tablet reports, background rounds
            for ts in cluster.tservers:
                assert _replica_states(ts) == before[ts.uuid]
            for n, tablet_id in enumerate(tablets):
                leader = cluster.leader_of(tablet_id)
                assert scan(leader, tablet_id, SCHEMA).column("id").to_pylist() == [n]
        except BaseException:
            dump_logs(cluster, sys.stderr)
            raise


#: Masters that flush the sys catalog often and GC its WAL down to nothing retained.
GC_MASTER_FLAGS = fast_master_flags(
    "--wal-segment-bytes",
    "65536",
    "--wal-min-segments-to-retain",
    "0",
    "--wal-gc-interval-ms",
    "200",
    "--flush-interval-ms",
    "300",
    "--catalog-write-timeout-ms",
    "5000",
)


def _first_segment_gone(master: ServerProcess) -> bool:
    wal_dir = master.fs_root / "wals" / SYS_CATALOG
    return wal_dir.is_dir() and not (wal_dir / "wal-000000001").exists()


def _sys_catalog_copies(master: ServerProcess) -> list[Any]:
    with master.proxy() as proxy:
        response = proxy.call(
            proxy.tablet_copy.ListTabletCopies, tablet_copy_pb2.ListTabletCopiesRequestPB()
        )
    return [j for j in response.jobs if j.tablet_id == SYS_CATALOG]


def _step_down(master: ServerProcess) -> None:
    request = consensus_pb2.LeaderStepDownRequestPB(dest_uuid=master.uuid, tablet_id=SYS_CATALOG)
    with master.proxy() as proxy:
        proxy.call(proxy.consensus.LeaderStepDown, request)


def _make_leader(cluster: MiniCluster, master: ServerProcess) -> None:
    def leads() -> bool:
        if cluster.leader_master() is master:
            return True
        request = consensus_pb2.RunLeaderElectionRequestPB(
            dest_uuid=master.uuid, tablet_id=SYS_CATALOG
        )
        with master.proxy() as proxy:
            proxy.call(proxy.consensus.RunLeaderElection, request)
        time.sleep(0.5)
        return cluster.leader_master() is master

    ops.wait_until(leads, timeout_s=60, what=f"{master.name} leads")


def test_master_wal_is_gcd_and_a_new_master_gets_the_sys_catalog_by_tablet_copy() -> None:
    with MiniCluster(
        3, num_masters=3, master_flags=GC_MASTER_FLAGS, tserver_flags=FAST_TSERVER_FLAGS
    ) as cluster:
        try:
            expected: dict[str, int] = {}
            for n in range(30):  # DDL, and a leader change every few operations
                name = f"t{n:02d}"
                ops.call(cluster, "CreateTable", ops.create_table_request(name, SCHEMA))
                expected[name] = 1
                if n % 3 == 2:
                    ops.call(cluster, "DeleteTable", _delete_request(f"t{n - 1:02d}"))
                    del expected[f"t{n - 1:02d}"]
                if n % 5 == 4:
                    _step_down(cluster.leader_master())
            ops.wait_until(
                lambda: all(_first_segment_gone(m) for m in cluster.masters),
                timeout_s=60,
                what="every master's first WAL segment GC'd",
            )
            wal_bytes = [_dir_bytes(m.fs_root / "wals" / SYS_CATALOG) for m in cluster.masters]
            assert max(wal_bytes) < 8 * 65536, wal_bytes  # bounded, not the whole history

            newcomer = cluster.add_master()
            added = ops.call(
                cluster, "AddMaster", master_pb2.AddMasterRequestPB(rpc_addr=_hostport(newcomer))
            )
            assert added is not None
            ops.wait_until(
                lambda: sum(ops.is_voter(m) for m in ops.masters(cluster)) == 4,
                timeout_s=90,
                what="the new master promoted to VOTER",
            )
            jobs = _sys_catalog_copies(newcomer)
            assert [j.state for j in jobs] == ["SUCCEEDED"], jobs
            _make_leader(cluster, newcomer)
            tables = ops.list_tables(cluster)
            assert sorted(tables) == sorted(expected)
            for name in expected:
                assert len(ops.locations(cluster, name)) == 1
        except BaseException:
            dump_logs(cluster, sys.stderr)
            raise


def _delete_request(name: str) -> master_pb2.DeleteTableRequestPB:
    return master_pb2.DeleteTableRequestPB(table=ops.table_ident(name), request_id=name)


def _hostport(server: ServerProcess) -> common_pb2.HostPortPB:
    host, _, port = server.rpc_addr.rpartition(":")
    return common_pb2.HostPortPB(host=host, port=int(port))


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
