"""Re-replication with real processes (issue 10): a tserver killed for good is replaced.

One master, four tservers, a failure timeout of 3 s. Killing a tserver that hosts replicas must
bring every affected tablet back to three voters on the survivors (3-4-3: a NON_VOTER is
copied and promoted, then the dead voter is evicted) with no acknowledged row lost; when the
dead tserver comes back, its stale replicas are tombstoned by the master. Also: a replica whose
tablet FAILED on a tserver that stays up (its leader reports it FAILED_UNRECOVERABLE) is
replaced; the 3-2-3 mode evicts before it adds; the replicas of a table deleted while their
tserver was down are tombstoned when it comes back.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from nyala._proto import master_pb2, metadata_pb2, tserver_admin_pb2
from nyala.errors import NyalaError
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster
from nyala.testing import master_ops as ops
from nyala.testing.mini_cluster import FAST_TSERVER_FLAGS, corrupt_file, fast_master_flags
from nyala.testing.replica_ops import committed_config, tablet_states, voters
from nyala.testing.tablet_ops import scan, write_to_leader

FAILED_AFTER_S = 3
SLOW_FAILED_AFTER_S = 120
MASTER_FLAGS = fast_master_flags(
    "--background-rpc-retry-ms",
    "500",
    "--tserver-unresponsive-timeout-ms",
    str(FAILED_AFTER_S * 1000),
    "--follower-unavailable-considered-failed-sec",
    str(FAILED_AFTER_S),
)
TSERVER_FLAGS = [
    *FAST_TSERVER_FLAGS,
    "--follower-unavailable-considered-failed-sec",
    str(FAILED_AFTER_S),
]
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


def _table_and_busiest_tserver(
    cluster: MiniCluster, name: str, *, buckets: int
) -> tuple[list[Any], Any, list[str]]:
    """Creates table ``name``; (its tablet locations, the tserver hosting the most of its
    replicas, the ids of the tablets that tserver hosts)."""
    ops.call(cluster, "CreateTable", ops.create_table_request(name, SCHEMA, buckets=buckets))
    ops.wait_create_done(cluster, name)
    tablets = ops.locations(cluster, name)
    hosting: dict[str, list[str]] = {}
    for t in tablets:
        for r in t.replicas:
            hosting.setdefault(r.ts_info.permanent_uuid, []).append(t.tablet_id)
    busiest = max(hosting, key=lambda u: len(hosting[u]))
    server = next(ts for ts in cluster.tservers if ts.uuid == busiest)
    return tablets, server, hosting[busiest]


def test_killed_tserver_is_replaced_and_its_replicas_tombstoned(cluster: MiniCluster) -> None:
    tablets, victim, affected = _table_and_busiest_tserver(cluster, "rr", buckets=3)
    tablet_ids = [t.tablet_id for t in tablets]
    victim_uuid = str(victim.uuid)

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


def _peer_sets(cluster: MiniCluster, tablet_id: str) -> tuple[set[str], int] | None:
    """(voters, number of peers) of the leader's committed config, or None."""
    try:
        leader = cluster.leader_of(tablet_id, timeout_s=2)
    except NyalaError:
        return None
    config = committed_config(leader, tablet_id)
    return None if config is None else (voters(config), len(config.peers))


def test_replica_failed_on_a_live_tserver_is_replaced(
    make_cluster: Callable[..., MiniCluster],
) -> None:
    # A failure timeout far longer than the test: the restarted tserver is never "dead", and
    # the broken replica is replaced because it is reported FAILED (by its tserver, and as
    # FAILED_UNRECOVERABLE by its leader), not because anything timed out.
    slow = str(SLOW_FAILED_AFTER_S)
    cluster = make_cluster(
        3,
        num_masters=1,
        master_flags=[*MASTER_FLAGS, "--follower-unavailable-considered-failed-sec", slow],
        tserver_flags=[*TSERVER_FLAGS, "--follower-unavailable-considered-failed-sec", slow],
    )
    ops.call(cluster, "CreateTable", ops.create_table_request("rf", SCHEMA, buckets=2))
    ops.wait_create_done(cluster, "rf")
    tablet_ids = [t.tablet_id for t in ops.locations(cluster, "rf")]
    broken, intact = tablet_ids
    expected = write_rows(cluster, tablet_ids, 0, 0)
    leader = cluster.leader_of(broken)
    victim = next(ts for ts in cluster.tservers if ts.uuid != leader.uuid)
    victim_uuid = str(victim.uuid)

    victim.kill()
    corrupt_file(victim.fs_root / "tablet-meta" / broken)
    victim.restart()
    states = {s.tablet_status.tablet_id: s.tablet_status.state for s in _listed(victim)}
    assert states[broken] == metadata_pb2.FAILED
    assert states[intact] == metadata_pb2.RUNNING

    # The leader reports the peer FAILED_UNRECOVERABLE (its /tablets page shows what its tablet
    # report carries). With no fourth tserver to copy to, 3-4-3 evicts nothing meanwhile.
    ops.wait_until(
        lambda: _leader_health(cluster, broken).get(victim_uuid) == "FAILED_UNRECOVERABLE",
        what="the leader reporting the failed replica FAILED_UNRECOVERABLE",
    )
    for tablet_id, count in write_rows(cluster, tablet_ids, 100, 100).items():
        expected[tablet_id] += count
    assert victim_uuid in voters(committed_config(cluster.leader_of(broken), broken))

    cluster.add_tserver()
    ops.wait_until(
        lambda: fully_replicated_without(cluster, [broken], victim_uuid),
        timeout_s=SLOW_FAILED_AFTER_S / 2,
        what="the broken tablet back to 3 voters without the failed replica",
    )
    # The tserver stayed up and heartbeating all along: only the failed replica was replaced.
    assert victim.is_running()
    assert victim_uuid in {ts.ts_info.permanent_uuid for ts in _live_tservers(cluster)}
    assert victim_uuid in voters(committed_config(cluster.leader_of(intact), intact))
    for tablet_id in tablet_ids:
        assert scan(cluster.leader_of(tablet_id), tablet_id, SCHEMA).num_rows == expected[tablet_id]


def _leader_health(cluster: MiniCluster, tablet_id: str) -> dict[str, str]:
    """Follower uuid -> health, from the ``/tablets`` page of the tablet's leader."""
    try:
        leader = cluster.leader_of(tablet_id, timeout_s=2)
        with urllib.request.urlopen(f"http://{leader.http_addr}/tablets", timeout=2) as page:
            listed = json.load(page)["tablets"]
    except (NyalaError, OSError):
        return {}
    entry = next((t for t in listed if t["tablet_id"] == tablet_id), None)
    if entry is None:
        return {}
    return {uuid: h["health"] for uuid, h in entry["peer_health"].items()}


def test_3_2_3_mode_evicts_before_adding(make_cluster: Callable[..., MiniCluster]) -> None:
    cluster = make_cluster(
        4,
        num_masters=1,
        master_flags=[*MASTER_FLAGS, "--no-prepare-replacement-before-eviction"],
        tserver_flags=TSERVER_FLAGS,
    )
    ops.call(cluster, "CreateTable", ops.create_table_request("ev", SCHEMA, buckets=1))
    ops.wait_create_done(cluster, "ev")
    tablet_id = ops.locations(cluster, "ev")[0].tablet_id
    expected = write_rows(cluster, [tablet_id], 0, 0)[tablet_id]
    leader = cluster.leader_of(tablet_id)
    members = voters(committed_config(leader, tablet_id))
    victim = next(ts for ts in cluster.tservers if ts.uuid in members - {leader.uuid})
    victim.kill()
    expected += write_rows(cluster, [tablet_id], 100, 100)[tablet_id]

    seen: list[tuple[set[str], int]] = []

    def watch() -> bool:
        now = _peer_sets(cluster, tablet_id)
        if now is not None and (not seen or seen[-1] != now):
            seen.append(now)
        return now is not None and len(now[0]) == 3 and victim.uuid not in now[0] and now[1] == 3

    ops.wait_until(watch, timeout_s=60, what="3-2-3: back to 3 voters without the dead one")
    # Evicted first: the two survivors were the only voters for a while (alone, then with the
    # replacement as a NON_VOTER being copied), and there were never four peers at once. In
    # 3-4-3 the survivors are never the only voters: the dead one goes once the new one votes.
    assert any(v == members - {victim.uuid} for v, _ in seen), seen
    assert all(peers <= 3 for _, peers in seen), seen
    assert scan(cluster.leader_of(tablet_id), tablet_id, SCHEMA).num_rows == expected


def test_replicas_of_a_table_deleted_while_down_are_tombstoned(cluster: MiniCluster) -> None:
    tablets, victim, held = _table_and_busiest_tserver(cluster, "gone", buckets=2)
    write_rows(cluster, [t.tablet_id for t in tablets], 0, 0)

    victim.kill()
    ops.call(cluster, "DeleteTable", master_pb2.DeleteTableRequestPB(table=ops.table_ident("gone")))
    victim.restart()
    ops.wait_until(
        lambda: all(
            tablet_states(victim).get(t) == metadata_pb2.TABLET_DATA_TOMBSTONED for t in held
        ),
        timeout_s=30,
        what="the returning tserver's replicas of the deleted table tombstoned",
    )
    # And every other replica of the table too (none was resurrected by the returning one).
    ops.wait_until(
        lambda: all(
            tablet_states(ts).get(t.tablet_id, metadata_pb2.TABLET_DATA_TOMBSTONED)
            == metadata_pb2.TABLET_DATA_TOMBSTONED
            for ts in cluster.tservers
            for t in tablets
        ),
        timeout_s=30,
        what="no replica of the deleted table left READY",
    )


def _listed(ts: Any) -> list[Any]:
    with ts.proxy() as proxy:
        answer = proxy.call(
            proxy.admin.ListTablets, tserver_admin_pb2.ListTabletsRequestPB(dest_uuid=ts.uuid)
        )
    return list(answer.status_and_schema)


def _live_tservers(cluster: MiniCluster) -> list[Any]:
    answer = ops.call(cluster, "ListTabletServers", master_pb2.ListTabletServersRequestPB())
    return [s for s in answer.servers if s.live]
