"""Master replica admin operations with real processes (issue 10), through ``client.admin``.

One master, four tservers, one tablet of three replicas. A replica is moved onto the fourth
tserver while a writer keeps inserting (every acknowledged row must be there afterwards); the
move repeated is answered done at once (idempotent); the tserver it moved to is retired, which
moves the replica back off it and tombstones what it held.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable

import pyarrow as pa
import pytest

import nyala
from nyala import _native
from nyala._proto import metadata_pb2
from nyala.consensus.types import EntryKind
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster
from nyala.testing import master_ops as ops
from nyala.testing.mini_cluster import FAST_TSERVER_FLAGS, ServerProcess, fast_master_flags
from nyala.testing.replica_ops import committed_config, tablet_states, voters
from nyala.testing.tablet_ops import scan, write_to_leader

MASTER_FLAGS = fast_master_flags(
    "--background-rpc-retry-ms",
    "500",
)
TSERVER_FLAGS = FAST_TSERVER_FLAGS
SCHEMA = Schema([Column("id", "int64"), Column("v", "string", nullable=True)], key=["id"])


@pytest.fixture
def cluster(make_cluster: Callable[..., MiniCluster]) -> MiniCluster:
    return make_cluster(4, num_masters=1, master_flags=MASTER_FLAGS, tserver_flags=TSERVER_FLAGS)


class Writer(threading.Thread):
    """Inserts batches of 10 rows until stopped; counts the acknowledged ones."""

    def __init__(self, cluster: MiniCluster, tablet_id: str) -> None:
        super().__init__(daemon=True)
        self.cluster, self.tablet_id = cluster, tablet_id
        self.acked = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        seq = 0
        try:
            while not self.stop.is_set():
                base = seq * 10
                rows = {"id": pa.array(range(base, base + 10), pa.int64()), "v": ["w"] * 10}
                answer = write_to_leader(
                    self.cluster,
                    self.tablet_id,
                    SCHEMA,
                    rows,
                    op="insert",
                    client_id="w",
                    seq_no=seq,
                )
                assert not answer.per_row_errors
                self.acked += 10
                seq += 1
        except BaseException as exc:  # reported by the test
            self.error = exc


def _config_entries(ts: ServerProcess, tablet_id: str) -> int:
    """How many config entries ``ts``'s WAL of the tablet holds (read-only, from its files)."""
    indexes = set()
    for path in sorted((ts.fs_root / "wals" / tablet_id).glob("wal-0*")):
        for _, _, entries, _ in _native.wal_dump_segment(str(path))[5]:
            indexes.update(i for _, i, kind, _ in entries if kind == EntryKind.CONFIG_CHANGE)
    return len(indexes)


def test_move_replica_under_load_then_retire_the_target(cluster: MiniCluster) -> None:
    ops.call(cluster, "CreateTable", ops.create_table_request("mv", SCHEMA, buckets=1))
    ops.wait_create_done(cluster, "mv")
    tablet_id = ops.locations(cluster, "mv")[0].tablet_id
    leader = cluster.leader_of(tablet_id)
    members = voters(committed_config(leader, tablet_id))
    spare = next(ts for ts in cluster.tservers if ts.uuid not in members)
    source = next(u for u in members if u != leader.uuid)

    writer = Writer(cluster, tablet_id)
    writer.start()
    with nyala.connect(",".join(cluster.master_addrs)) as client:
        client.admin.move_replica(tablet_id, source, str(spare.uuid), timeout_s=60)
        writer.stop.set()
        writer.join(60)
        assert writer.error is None, writer.error
        assert writer.acked > 0
        leader = cluster.leader_of(tablet_id)
        config = committed_config(leader, tablet_id)
        assert config is not None
        assert voters(config) == (members - {source}) | {str(spare.uuid)}
        assert len(config.peers) == 3
        assert scan(leader, tablet_id, SCHEMA).num_rows == writer.acked
        # Three config entries: the new replica added with the old one marked (one entry, so
        # the new one cannot be promoted before the old one is marked), the promotion, the
        # eviction. (Read from a replica that was there throughout: a copy's log may start
        # later.)
        stayed = next(ts for ts in cluster.tservers if str(ts.uuid) in members - {source})
        assert _config_entries(stayed, tablet_id) == 3
        # Idempotent: the same move again is done at once, and changes nothing.
        message = client.admin.move_replica(tablet_id, source, str(spare.uuid), wait=False)
        assert "moved" in message
        again = committed_config(leader, tablet_id)
        assert again is not None
        assert again.opid_index == config.opid_index

        client.admin.retire_tserver(str(spare.uuid), timeout_s=60)
        leader = cluster.leader_of(tablet_id)
        assert str(spare.uuid) not in voters(committed_config(leader, tablet_id))
        assert len(voters(committed_config(leader, tablet_id))) == 3
        assert scan(leader, tablet_id, SCHEMA).num_rows == writer.acked
    ops.wait_until(
        lambda: tablet_states(spare).get(tablet_id) == metadata_pb2.TABLET_DATA_TOMBSTONED,
        what="the retired tserver's replica tombstoned",
    )

    # The same operations from the command line: demote a follower and make it a voter again.
    leader = cluster.leader_of(tablet_id)
    follower = next(u for u in voters(committed_config(leader, tablet_id)) if u != leader.uuid)
    masters = ",".join(cluster.master_addrs)
    for kind, expected_voters in (("NON_VOTER", 2), ("VOTER", 3)):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "nyala.cli",
                "tablet",
                "change-replica-type",
                tablet_id,
                follower,
                kind,
                "-m",
                masters,
                "--timeout-s",
                "60",
            ],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        config = committed_config(cluster.leader_of(tablet_id), tablet_id)
        assert len(voters(config)) == expected_voters
