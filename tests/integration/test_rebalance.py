"""``nyala cluster rebalance`` with real processes: two tservers join, replicas spread out.

One master, three tservers, a table of two tablets (six replicas, two per tserver). After two
more tservers join, the rebalancer moves replicas one at a time until the five tservers differ
by at most one replica of the table; every tablet keeps three voters and every row, and ksck is
healthy afterwards.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import pyarrow as pa
import pytest

from nyala.schema import Column, Schema
from nyala.testing import MiniCluster
from nyala.testing import master_ops as ops
from nyala.testing.mini_cluster import FAST_TSERVER_FLAGS, fast_master_flags, run_nyala
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
    return make_cluster(3, num_masters=1, master_flags=MASTER_FLAGS, tserver_flags=TSERVER_FLAGS)


def nyala(*args: str) -> subprocess.CompletedProcess[str]:
    """Runs the ``nyala`` program."""
    return run_nyala(*args, timeout_s=120)


@pytest.mark.slow
def test_rebalance_after_adding_two_tservers(cluster: MiniCluster) -> None:
    ops.call(cluster, "CreateTable", ops.create_table_request("rb", SCHEMA, buckets=2))
    ops.wait_create_done(cluster, "rb")
    tablet_ids = [t.tablet_id for t in ops.locations(cluster, "rb")]
    for i, tablet_id in enumerate(tablet_ids):
        rows = {"id": pa.array(range(i * 100, i * 100 + 50), pa.int64()), "v": ["r"] * 50}
        write_to_leader(cluster, tablet_id, SCHEMA, rows, op="insert", client_id="rb", seq_no=i)
    cluster.add_tserver()
    cluster.add_tserver()
    masters = ",".join(cluster.master_addrs)
    ops.wait_until(
        lambda: (
            sum(1 for s in ops.call(cluster, "ListTabletServers", _list()).servers if s.live) == 5
        ),
        what="five live tservers",
    )
    dry = nyala("cluster", "rebalance", "-m", masters, "--dry-run", "--format", "json")
    assert dry.returncode == 0, dry.stderr
    assert len(json.loads(dry.stdout)["moves"]) == 1

    done = nyala("cluster", "rebalance", "-m", masters, "--format", "json")
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["moves"]) >= 1

    counts = {str(ts.uuid): 0 for ts in cluster.tservers}
    for tablet_id in tablet_ids:
        leader = cluster.leader_of(tablet_id)
        members = voters(committed_config(leader, tablet_id))
        assert len(members) == 3
        for uuid in members:
            counts[uuid] += 1
        assert scan(leader, tablet_id, SCHEMA).num_rows == 50
    assert max(counts.values()) - min(counts.values()) <= 1
    again = nyala("cluster", "rebalance", "-m", masters, "--format", "json")
    assert json.loads(again.stdout)["moves"] == []
    ops.wait_until(
        lambda: nyala("cluster", "ksck", "-m", masters).returncode == 0,
        what="a healthy ksck after rebalancing",
    )


def _list() -> object:
    from nyala._proto import master_pb2

    return master_pb2.ListTabletServersRequestPB()
