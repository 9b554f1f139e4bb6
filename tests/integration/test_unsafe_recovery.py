"""Online unsafe recovery of a tablet that lost two of its three replicas (issue 10, seed 001
"Restoring availability after catastrophic data loss"), then re-replication back to three.

One master, four tservers, one tablet. Two replicas' tservers are killed for good: the tablet
has no majority and no leader. ``UnsafeChangeConfig`` on the survivor forces a config of only
itself; it elects itself, every row it acknowledged as part of the old majority is still there,
and the master's re-replication adds replicas on the live tservers until the tablet has three
voters again.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pytest

from nyala._proto import consensus_pb2
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster
from nyala.testing import master_ops as ops
from nyala.testing.mini_cluster import FAST_TSERVER_FLAGS, fast_master_flags
from nyala.testing.replica_ops import committed_config, voters
from nyala.testing.tablet_ops import scan, write_to_leader

MASTER_FLAGS = fast_master_flags(
    "--background-rpc-retry-ms",
    "500",
    "--tserver-unresponsive-timeout-ms",
    "3000",
    "--follower-unavailable-considered-failed-sec",
    "3",
)
TSERVER_FLAGS = FAST_TSERVER_FLAGS
SCHEMA = Schema([Column("id", "int64"), Column("v", "string", nullable=True)], key=["id"])


@pytest.fixture
def cluster(make_cluster: Callable[..., MiniCluster]) -> MiniCluster:
    return make_cluster(5, num_masters=1, master_flags=MASTER_FLAGS, tserver_flags=TSERVER_FLAGS)


@pytest.mark.slow
def test_unsafe_recovery_after_losing_two_of_three(cluster: MiniCluster) -> None:
    ops.call(cluster, "CreateTable", ops.create_table_request("ur", SCHEMA, buckets=1))
    ops.wait_create_done(cluster, "ur")
    tablet_id = ops.locations(cluster, "ur")[0].tablet_id
    rows = {"id": pa.array(range(100), pa.int64()), "v": ["u"] * 100}
    write_to_leader(cluster, tablet_id, SCHEMA, rows, op="insert", client_id="u", seq_no=0)
    leader = cluster.leader_of(tablet_id)
    members = voters(committed_config(leader, tablet_id))
    # The survivor is the leader: it holds every acknowledged row.
    lost = [ts for ts in cluster.tservers if ts.uuid in members and ts is not leader]
    for ts in lost:
        ts.kill()

    request = consensus_pb2.UnsafeChangeConfigRequestPB(
        dest_uuid=leader.uuid, tablet_id=tablet_id, caller_id="test"
    )
    request.new_config.peers.add(permanent_uuid=leader.uuid)
    with leader.proxy() as proxy:
        proxy.call(proxy.consensus.UnsafeChangeConfig, request)

    def back_to_three() -> bool:
        config = committed_config(cluster.leader_of(tablet_id, timeout_s=2), tablet_id)
        members_now = voters(config)
        return len(members_now) == 3 and not members_now & {str(ts.uuid) for ts in lost}

    ops.wait_until(back_to_three, timeout_s=60, what="three voters again on live tservers")
    new_leader = cluster.leader_of(tablet_id)
    assert scan(new_leader, tablet_id, SCHEMA).num_rows == 100
    more = {"id": pa.array(range(100, 110), pa.int64()), "v": ["n"] * 10}
    answer = write_to_leader(cluster, tablet_id, SCHEMA, more, op="insert", client_id="u", seq_no=1)
    assert not answer.per_row_errors
    assert scan(cluster.leader_of(tablet_id), tablet_id, SCHEMA).num_rows == 110
