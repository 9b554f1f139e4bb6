"""Replica admin operations survive a leader-master failover (issue 10): their state lives in
the tablet's Raft config, so the same request repeated at the new leader finishes the job.

Three masters, four tservers, one tablet. One step of a move is sent, the leader master is
killed, and ``client.admin.move_replica`` (which repeats the request, rediscovering the leader)
completes the move. Then the table's replication factor is lowered to 1 and raised back to 3.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pytest

import nyala
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster
from nyala.testing import master_ops as ops
from nyala.testing.mini_cluster import FAST_TSERVER_FLAGS, fast_master_flags
from nyala.testing.replica_ops import committed_config, voters
from nyala.testing.tablet_ops import scan, write_to_leader

MASTER_FLAGS = fast_master_flags(
    "--background-rpc-retry-ms",
    "500",
)
TSERVER_FLAGS = FAST_TSERVER_FLAGS
SCHEMA = Schema([Column("id", "int64"), Column("v", "string", nullable=True)], key=["id"])


@pytest.fixture
def cluster(make_cluster: Callable[..., MiniCluster]) -> MiniCluster:
    return make_cluster(4, num_masters=3, master_flags=MASTER_FLAGS, tserver_flags=TSERVER_FLAGS)


@pytest.mark.slow
def test_move_finishes_after_master_failover_and_replication_factor_changes(
    cluster: MiniCluster,
) -> None:
    ops.call(cluster, "CreateTable", ops.create_table_request("fo", SCHEMA, buckets=1))
    ops.wait_create_done(cluster, "fo")
    tablet_id = ops.locations(cluster, "fo")[0].tablet_id
    rows = {"id": pa.array(range(30), pa.int64()), "v": ["f"] * 30}
    write_to_leader(cluster, tablet_id, SCHEMA, rows, op="insert", client_id="f", seq_no=0)
    leader = cluster.leader_of(tablet_id)
    members = voters(committed_config(leader, tablet_id))
    spare = str(next(ts for ts in cluster.tservers if ts.uuid not in members).uuid)
    source = next(u for u in members if u != leader.uuid)

    with nyala.connect(",".join(cluster.master_addrs)) as client:
        client.admin.move_replica(tablet_id, source, spare, wait=False)
        cluster.leader_master().kill()
        client.admin.move_replica(tablet_id, source, spare, timeout_s=90)
        assert voters(committed_config(cluster.leader_of(tablet_id), tablet_id)) == (
            members - {source}
        ) | {spare}

        client.admin.change_replication_factor("fo", 1, timeout_s=90)
        ops.wait_until(
            lambda: len(voters(committed_config(cluster.leader_of(tablet_id), tablet_id))) == 1,
            what="one voter",
        )
        client.admin.change_replication_factor("fo", 3, timeout_s=90)
        ops.wait_until(
            lambda: len(voters(committed_config(cluster.leader_of(tablet_id), tablet_id))) == 3,
            timeout_s=60,
            what="three voters again",
        )
    assert scan(cluster.leader_of(tablet_id), tablet_id, SCHEMA).num_rows == 30


def test_retired_tserver_stays_retired_after_master_failover(cluster: MiniCluster) -> None:
    ops.call(cluster, "CreateTable", ops.create_table_request("rt", SCHEMA, buckets=2))
    ops.wait_create_done(cluster, "rt")
    hosted: dict[str, int] = {}
    for t in ops.locations(cluster, "rt"):
        for r in t.replicas:
            hosted[r.ts_info.permanent_uuid] = hosted.get(r.ts_info.permanent_uuid, 0) + 1
    retired = str(max(cluster.tservers, key=lambda ts: hosted.get(str(ts.uuid), 0)).uuid)

    with nyala.connect(",".join(cluster.master_addrs)) as client:
        client.admin.retire_tserver(retired, timeout_s=90)
        cluster.leader_master().kill()
        # The new leader loaded the retired mark with the catalog: new tablets (whose least
        # loaded candidate would be the empty retired server) avoid it ...
        ops.call(cluster, "CreateTable", ops.create_table_request("after", SCHEMA, buckets=4))
        ops.wait_create_done(cluster, "after")
        for name in ("rt", "after"):
            for t in ops.locations(cluster, name):
                assert retired not in {r.ts_info.permanent_uuid for r in t.replicas}, name
        # ... and the retirement, repeated, is done at once.
        assert "retired" in client.admin.retire_tserver(retired, wait=False, timeout_s=60)
