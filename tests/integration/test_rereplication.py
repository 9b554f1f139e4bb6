"""Re-replication with real processes (issue 10): a tserver killed for good is replaced.

One master, four tservers, a failure timeout of 3 s. Killing a tserver that hosts replicas must
bring every affected tablet back to three voters on the survivors (3-4-3: a NON_VOTER is
copied and promoted, then the dead voter is evicted) with no acknowledged row lost; when the
dead tserver comes back, its stale replicas are tombstoned by the master.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pytest

from nyala._proto import metadata_pb2
from nyala.errors import NyalaError
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster
from nyala.testing import master_ops as ops
from nyala.testing.mini_cluster import FAST_TSERVER_FLAGS, fast_master_flags
from nyala.testing.replica_ops import committed_config, tablet_states, voters
from nyala.testing.tablet_ops import scan, write_to_leader

FAILED_AFTER_S = 3
MASTER_FLAGS = fast_master_flags(
    "--background-rpc-retry-ms",
    "500",
    "--tserver-unresponsive-timeout-ms",
    str(FAILED_AFTER_S * 1000),
    "--follower-unavailable-considered-failed-sec",
    str(FAILED_AFTER_S),
)
TSERVER_FLAGS = FAST_TSERVER_FLAGS
SCHEMA = Schema([Column("id", "int64"), Column("v", "string", nullable=True)], key=["id"])


@pytest.fixture
def cluster(make_cluster: Callable[..., MiniCluster]) -> MiniCluster:
    return make_cluster(4, num_masters=1, master_flags=MASTER_FLAGS, tserver_flags=TSERVER_FLAGS)


def fully_replicated_without(cluster: MiniCluster, tablet_ids: list[str], dead: str) -> bool:
    """Every tablet's leader has a committed config of 3 voters, none of them ``dead``."""
    for tablet_id in tablet_ids:
        try:
            leader = cluster.leader_of(tablet_id, timeout_s=2)
        except NyalaError:
            return False
        config = committed_config(leader, tablet_id)
        if config is None or len(voters(config)) != 3 or dead in voters(config):
            return False
        if len(config.peers) != 3:
            return False
    return True


def write_rows(cluster: MiniCluster, tablet_ids: list[str], first: int, seq: int) -> dict[str, int]:
    """Writes 20 rows to every tablet (acknowledged); returns rows per tablet."""
    out = {}
    for i, tablet_id in enumerate(tablet_ids):
        base = first + i * 1000
        rows = {"id": pa.array(range(base, base + 20), pa.int64()), "v": ["x"] * 20}
        answer = write_to_leader(
            cluster, tablet_id, SCHEMA, rows, op="insert", client_id="rr", seq_no=seq + i
        )
        assert not answer.per_row_errors
        out[tablet_id] = 20
    return out


def test_killed_tserver_is_replaced_and_its_replicas_tombstoned(cluster: MiniCluster) -> None:
    ops.call(cluster, "CreateTable", ops.create_table_request("rr", SCHEMA, buckets=3))
    ops.wait_create_done(cluster, "rr")
    tablets = ops.locations(cluster, "rr")
    tablet_ids = [t.tablet_id for t in tablets]
    hosting: dict[str, list[str]] = {}
    for t in tablets:
        for r in t.replicas:
            hosting.setdefault(r.ts_info.permanent_uuid, []).append(t.tablet_id)
    victim_uuid = max(hosting, key=lambda u: len(hosting[u]))
    victim = next(ts for ts in cluster.tservers if ts.uuid == victim_uuid)
    affected = hosting[victim_uuid]

    expected = write_rows(cluster, tablet_ids, 0, 0)
    victim.kill()
    # Writes acknowledged while the tserver is down must survive the replacement too.
    for tablet_id, count in write_rows(cluster, tablet_ids, 100, 100).items():
        expected[tablet_id] += count

    ops.wait_until(
        lambda: fully_replicated_without(cluster, affected, victim_uuid),
        timeout_s=60,
        what="every affected tablet back to 3 voters without the dead tserver",
    )
    for tablet_id in tablet_ids:
        leader = cluster.leader_of(tablet_id)
        assert scan(leader, tablet_id, SCHEMA).num_rows == expected[tablet_id]
    # The master's record follows the replicas' reports.
    ops.wait_until(
        lambda: all(
            victim_uuid not in {r.ts_info.permanent_uuid for r in t.replicas}
            and len(t.replicas) == 3
            for t in ops.locations(cluster, "rr")
        ),
        what="master locations without the dead tserver",
    )

    victim.restart()
    ops.wait_until(
        lambda: all(
            tablet_states(victim).get(t) == metadata_pb2.TABLET_DATA_TOMBSTONED for t in affected
        ),
        timeout_s=30,
        what="stale replicas tombstoned on the returning tserver",
    )
    # The tombstoned server is live again; the tablets stay at three voters and keep serving.
    write_rows(cluster, tablet_ids, 200, 200)
    assert fully_replicated_without(cluster, tablet_ids, victim_uuid) or all(
        len(voters(committed_config(cluster.leader_of(t), t))) == 3 for t in tablet_ids
    )
