"""The replicated master with real processes: 3 masters and 3 tservers on loopback (issue 9).

One cluster serves the tests of this module in order (each leaves every master running); the
tests that change the master set or start a master with a wrong list have their own cluster.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from nyala import errors
from nyala._proto import master_pb2, tserver_admin_pb2
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster, dump_logs, logs_on_failure
from nyala.testing import master_ops as ops
from nyala.testing.mini_cluster import FAST_TSERVER_FLAGS, fast_master_flags
from nyala.testing.tablet_ops import scan, write_to_leader

# Fast Raft for the sys catalog and the tablets, and fast tserver heartbeats: failover in about
# a second, and a new leader hears every tserver's full report within 200 ms.
MASTER_FLAGS = fast_master_flags(
    "--catalog-write-timeout-ms",
    "5000",
    # Short, so that the replacement test is quick; a replacement elsewhere is harmless.
    "--tablet-creation-timeout-ms",
    "6000",
)
TSERVER_FLAGS = FAST_TSERVER_FLAGS

SCHEMA = Schema([Column("id", "int64"), Column("v", "string", nullable=True)], key=["id"])


def _cluster(num_masters: int = 3) -> MiniCluster:
    return MiniCluster(
        3, num_masters=num_masters, master_flags=MASTER_FLAGS, tserver_flags=TSERVER_FLAGS
    )


@pytest.fixture(scope="module")
def shared() -> Iterator[MiniCluster]:
    with logs_on_failure(_cluster()) as mini:
        yield mini


@pytest.fixture
def cluster(shared: MiniCluster, request: pytest.FixtureRequest) -> Iterator[MiniCluster]:
    """The shared cluster with every master running; logs printed if the test fails."""
    yield shared
    for master in shared.masters:
        if not master.is_running():
            master.restart()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        dump_logs(shared, sys.stderr)


def _create(cluster: MiniCluster, name: str, *, buckets: int = 2) -> str:
    request = ops.create_table_request(name, SCHEMA, buckets=buckets)
    table_id = str(ops.call(cluster, "CreateTable", request).table_id)
    ops.wait_create_done(cluster, name)
    return table_id


def _kill_leader_master(cluster: MiniCluster) -> Any:
    leader = cluster.leader_master()
    leader.kill()
    return leader


def test_create_table_then_write_and_scan_every_tablet(cluster: MiniCluster) -> None:
    _create(cluster, "events", buckets=2)
    tablets = ops.locations(cluster, "events")
    assert len(tablets) == 2
    for i, tablet in enumerate(tablets):
        assert len(tablet.replicas) == 3
        assert tablet.leader_uuid in {r.ts_info.permanent_uuid for r in tablet.replicas}
        rows = {"id": pa.array([i * 10 + k for k in range(10)], pa.int64()), "v": ["x"] * 10}
        response = write_to_leader(
            cluster, tablet.tablet_id, SCHEMA, rows, op="insert", client_id="c", seq_no=i
        )
        assert not response.per_row_errors
        leader = cluster.leader_of(tablet.tablet_id)
        assert scan(leader, tablet.tablet_id, SCHEMA).num_rows == 10
    servers = ops.call(cluster, "ListTabletServers", master_pb2.ListTabletServersRequestPB())
    assert sorted(s.ts_info.permanent_uuid for s in servers.servers if s.live) == sorted(
        str(ts.uuid) for ts in cluster.tservers
    )
    assert sum(s.num_replicas for s in servers.servers) >= 6


def test_follower_master_refuses_clients_with_not_the_leader(cluster: MiniCluster) -> None:
    def refused_with_hint() -> bool:
        leader = cluster.leader_master()
        for follower in (m for m in cluster.masters if m is not leader):
            with follower.proxy() as proxy:
                request = master_pb2.ListTablesRequestPB(dest_uuid=follower.uuid)
                with pytest.raises(errors.NotLeaderError) as refused:
                    proxy.call(proxy.master.ListTables, request)
                if refused.value.leader_uuid != leader.uuid:
                    return False  # an election is under way; ask again
                answer = proxy.call(
                    proxy.master.ConnectToMaster, master_pb2.ConnectToMasterRequestPB()
                )
                assert answer.role == master_pb2.ROLE_FOLLOWER
                assert not answer.catalog_ready
                assert len(answer.masters) == 3
        return True

    ops.wait_until(refused_with_hint, what="followers refusing with the leader's uuid")


def test_new_leader_knows_every_tserver_and_replica_at_once(cluster: MiniCluster) -> None:
    _create(cluster, "before_failover", buckets=3)
    before = {t.tablet_id: t for t in ops.locations(cluster, "before_failover")}
    _kill_leader_master(cluster)
    # No cold cache (KUDU-1358): RF 3 needs all three tservers, known from heartbeats to
    # every master, with no wait for a heartbeat interval after the election.
    new_leader = cluster.leader_master()
    request = ops.create_table_request("after_failover", SCHEMA, replicas=3)
    request.dest_uuid = new_leader.uuid
    with new_leader.proxy() as proxy:
        proxy.call(proxy.master.CreateTable, request)
    ops.wait_create_done(cluster, "after_failover")
    # Replica locations come from the replicated records (KUDU-1353): complete at once.
    after = {t.tablet_id: t for t in ops.locations(cluster, "before_failover")}
    assert after.keys() == before.keys()
    for tablet_id, tablet in after.items():
        assert {r.ts_info.permanent_uuid for r in tablet.replicas} == {
            r.ts_info.permanent_uuid for r in before[tablet_id].replicas
        }
        assert all(r.ts_info.rpc_addr.port for r in tablet.replicas)


def _tablet_schema_versions(cluster: MiniCluster, table_id: str) -> list[int]:
    versions = []
    for ts in cluster.tservers:
        with ts.proxy() as proxy:
            request = tserver_admin_pb2.ListTabletsRequestPB(
                dest_uuid=ts.uuid, need_schema_info=True
            )
            for entry in proxy.call(proxy.admin.ListTablets, request).status_and_schema:
                if entry.tablet_status.table_id == table_id:
                    versions.append(entry.schema.version)
    return versions


def test_alter_table_interrupted_by_failover_completes(cluster: MiniCluster) -> None:
    table_id = _create(cluster, "altered", buckets=2)
    response = ops.call(cluster, "AlterTable", ops.add_column_request("altered", "extra", "int32"))
    assert response.schema_version == 1
    _kill_leader_master(cluster)  # right after the acknowledgement, before tablets report it
    ops.wait_alter_done(cluster, "altered")
    ops.wait_until(
        lambda: _tablet_schema_versions(cluster, table_id) == [1] * 6,
        what="every replica at schema version 1",
    )
    schema = ops.call(
        cluster,
        "GetTableSchema",
        master_pb2.GetTableSchemaRequestPB(table=ops.table_ident("altered")),
    ).schema
    assert schema.version == 1


_UNKNOWN = (errors.RetriableError, errors.TimedOutError, errors.AbortedError)


def test_acknowledged_ddl_survives_leader_kills_exactly_once(cluster: MiniCluster) -> None:
    acked_creates: set[str] = set()
    acked_deletes: set[str] = set()
    acked_alters: dict[str, int] = {}
    maybe: set[str] = set()
    for i in range(9):
        name = f"ddl_{i}"
        if i in (3, 6):
            _kill_leader_master(cluster).start()  # back as a follower while DDL goes on
        try:
            ops.call_once(cluster, "CreateTable", ops.create_table_request(name, SCHEMA))
            acked_creates.add(name)
        except _UNKNOWN:
            maybe.add(name)
            continue
        try:
            for column in ("a", "b"):
                ops.call_once(cluster, "AlterTable", ops.add_column_request(name, column, "int32"))
                acked_alters[name] = acked_alters.get(name, 0) + 1
            if i % 2 == 0:
                request = master_pb2.DeleteTableRequestPB(table=ops.table_ident(name))
                ops.call_once(cluster, "DeleteTable", request)
                acked_deletes.add(name)
        except _UNKNOWN:
            maybe.add(name)
    tables = ops.list_tables(cluster)
    names = {n for n in tables if n.startswith("ddl_")}
    assert acked_creates - acked_deletes - maybe <= names
    assert not names & (acked_deletes - maybe)
    assert names <= acked_creates | maybe
    for name in names - maybe:
        assert tables[name].schema_version == acked_alters.get(name, 0)  # each alter once
    # Nothing half-visible: every listed table has all its tablets, each with 3 replicas.
    for name in names:
        tablets = ops.locations(cluster, name)
        assert len(tablets) == 1
        assert len(tablets[0].replicas) == 3
    # A name deleted for good can be created again (deleted tables are kept by id only).
    for name in sorted(acked_deletes - maybe)[:1]:
        ops.call(cluster, "CreateTable", ops.create_table_request(name, SCHEMA))


def test_retried_ddl_requests_answer_with_their_first_effect(cluster: MiniCluster) -> None:
    """A DDL request retried after its answer was lost (a timeout, a master failover) must not
    fail with ALREADY_PRESENT / NOT_FOUND nor take effect twice: the request id is replicated
    with the table record, so even a new leader master recognises the retry."""
    create = ops.create_table_request("retried", SCHEMA)
    first = ops.call(cluster, "CreateTable", create).table_id
    ops.wait_create_done(cluster, "retried")
    _kill_leader_master(cluster)
    assert ops.call(cluster, "CreateTable", create).table_id == first
    other = ops.create_table_request("retried", SCHEMA)  # a different request: a real clash
    with pytest.raises(errors.AlreadyPresentError):
        ops.call(cluster, "CreateTable", other)

    alter = ops.add_column_request("retried", "extra", "int32")
    alter.new_table_name = "retried2"
    version = ops.call(cluster, "AlterTable", alter).schema_version
    again = ops.call(cluster, "AlterTable", alter)  # names the old table, renamed by the first
    assert (again.table_id, again.schema_version) == (first, version)
    assert ops.list_tables(cluster)["retried2"].schema_version == version

    delete = master_pb2.DeleteTableRequestPB(table=ops.table_ident("retried2"), request_id="d1")
    ops.call(cluster, "DeleteTable", delete)
    ops.call(cluster, "DeleteTable", delete)  # the retry succeeds too
    with pytest.raises(errors.NotFoundError):
        ops.call(
            cluster,
            "DeleteTable",
            master_pb2.DeleteTableRequestPB(table=ops.table_ident("retried2"), request_id="d2"),
        )


def test_deleted_table_replicas_are_tombstoned(cluster: MiniCluster) -> None:
    table_id = _create(cluster, "doomed", buckets=2)
    ops.call(
        cluster, "DeleteTable", master_pb2.DeleteTableRequestPB(table=ops.table_ident("doomed"))
    )

    def tombstoned() -> bool:
        states = []
        for ts in cluster.tservers:
            with ts.proxy() as proxy:
                request = tserver_admin_pb2.ListTabletsRequestPB(dest_uuid=ts.uuid)
                for entry in proxy.call(proxy.admin.ListTablets, request).status_and_schema:
                    if entry.tablet_status.table_id == table_id:
                        states.append(entry.tablet_status.data_state)
        return len(states) == 6 and all(s == 3 for s in states)  # TABLET_DATA_TOMBSTONED

    ops.wait_until(tombstoned, what="every replica of the deleted table tombstoned")
    with pytest.raises(errors.NotFoundError):
        ops.locations(cluster, "doomed")


def test_tablet_not_created_in_time_is_replaced_elsewhere(cluster: MiniCluster) -> None:
    stuck = cluster.tservers[0]
    stuck.pause()
    try:
        # RF 1 tablets land on every server (eight make missing the paused one about a
        # 1-in-2000 chance); those on the paused one never get a leader and are replaced, after
        # the creation timeout, on a server that answers.
        names = [f"r{i}" for i in range(8)]
        for name in names:
            ops.call(cluster, "CreateTable", ops.create_table_request(name, SCHEMA, replicas=1))
        for name in names:
            ops.wait_create_done(cluster, name, timeout_s=60)
            for tablet in ops.locations(cluster, name):
                assert [r.ts_info.permanent_uuid for r in tablet.replicas] != [stuck.uuid]
        # A replacement stays off the server that never reported the replica it replaces,
        # so no replacement is itself replaced.
        replaced = dict(
            re.findall(
                r"replaced tablet (\w+) \(creation timed out\) by (\w+)",
                "".join(m.log_path.read_text(errors="replace") for m in cluster.masters),
            )
        )
        assert replaced, "no tablet was placed on the paused server"
        assert not set(replaced.values()) & set(replaced), replaced
    finally:
        stuck.resume()


def test_tablets_still_electing_are_not_replaced_when_creation_times_out() -> None:
    # Elections take far longer than the creation timeout here (no replica campaigns for
    # 60 heartbeats), but every replica runs on a live server and reports so: the master
    # waits for them instead of replacing them, which on a busy cluster would only add
    # tablets, copies and elections (a replacement storm).
    slow_elections = [*TSERVER_FLAGS, "--leader-failure-max-missed-heartbeat-periods", "60"]
    master_flags = [*MASTER_FLAGS, "--tablet-creation-timeout-ms", "1500"]
    with logs_on_failure(
        MiniCluster(3, num_masters=1, master_flags=master_flags, tserver_flags=slow_elections)
    ) as cluster:
        ops.call(cluster, "CreateTable", ops.create_table_request("slow", SCHEMA, buckets=4))
        ops.wait_create_done(cluster, "slow", timeout_s=90)
        log_text = "".join(m.log_path.read_text(errors="replace") for m in cluster.masters)
        assert "creation timed out" not in log_text
        assert len(ops.locations(cluster, "slow")) == 4


def test_master_with_mismatched_masters_list_refuses_to_start(cluster: MiniCluster) -> None:
    victim = next(m for m in cluster.masters if m is not cluster.leader_master())
    victim.kill()
    flags = list(victim.flags)
    at = flags.index("--masters")
    victim.flags[at + 1] = ",".join([*cluster.master_addrs[:2], "127.0.0.1:1"])
    try:
        victim.start()
        assert victim.wait_exit(timeout_s=30) != 0
        assert "does not match the sys catalog's Raft config" in victim.log_tail(3)
    finally:
        victim.flags = flags
    victim.restart()


def _cli(cluster: MiniCluster, *args: str) -> subprocess.CompletedProcess[str]:
    masters = ",".join(m.rpc_addr for m in cluster.masters if m.is_running())
    return subprocess.run(
        [sys.executable, "-m", "nyala.cli", "master", *args, "-m", masters],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_add_a_fourth_master_then_remove_one_with_the_cli() -> None:
    with _cluster() as cluster:
        try:
            _create(cluster, "kept", buckets=2)
            new = cluster.add_master()
            added = _cli(cluster, "add", new.rpc_addr)
            assert added.returncode == 0, added.stderr
            assert str(new.uuid) in added.stdout
            ops.wait_until(
                lambda: sum(ops.is_voter(m) for m in ops.masters(cluster)) == 4,
                what="the new master promoted to VOTER",
            )
            listed = _cli(cluster, "list", "--format", "json")
            assert listed.returncode == 0, listed.stderr
            rows = json.loads(listed.stdout)
            assert sorted(r["member_type"] for r in rows) == ["VOTER"] * 4
            assert sorted(r["role"] for r in rows) == ["FOLLOWER"] * 3 + ["LEADER"]
            leader = cluster.leader_master()
            victim = next(m for m in cluster.masters if m not in (leader, new))
            removed = _cli(cluster, "remove", str(victim.uuid))
            assert removed.returncode == 0, removed.stderr
            victim.kill()
            entries = ops.masters(cluster)
            assert sorted(m.permanent_uuid for m in entries) == sorted(
                str(m.uuid) for m in cluster.masters if m is not victim
            )
            # The leader cannot remove itself.
            leader = cluster.leader_master()
            request = master_pb2.RemoveMasterRequestPB(master_uuid=leader.uuid)
            with pytest.raises(errors.InvalidArgumentError, match="cannot remove itself"):
                ops.call_once(cluster, "RemoveMaster", request)
            # The three remaining masters (one of them new) elect a leader that has it all.
            leader.kill()
            assert "kept" in ops.list_tables(cluster)
        except BaseException:
            dump_logs(cluster, sys.stderr)
            raise
