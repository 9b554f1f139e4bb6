"""Elections and the master's view of them, on real processes: a sole voter leads at once (no
election timeout), and tablet servers report a leadership change to the masters at once."""

from __future__ import annotations

import time

import nyala
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster
from nyala.testing import master_ops as ops
from nyala.testing.mini_cluster import FAST_RAFT_FLAGS, fast_master_flags

SCHEMA = Schema([Column("id", "int64")], ["id"])
# Long Raft heartbeats: the shortest election timeout is 3 * 2000 * 0.75 = 4.5 s, so a leader
# within LEADER_WITHIN_S can only come from the sole voter's immediate election.
SLOW_RAFT = ["--heartbeat-interval-ms", "2000"]
LEADER_WITHIN_S = 2.0


def test_a_sole_voter_leads_at_once_and_again_after_a_restart() -> None:
    with MiniCluster(1, tserver_flags=SLOW_RAFT) as cluster:
        tablet = "a" * 32
        start = time.monotonic()
        cluster.create_tablet(tablet, SCHEMA)
        cluster.leader_of(tablet, timeout_s=LEADER_WITHIN_S)
        created_s = time.monotonic() - start

        ts = cluster.tserver(0)
        ts.restart()
        start = time.monotonic()
        cluster.leader_of(tablet, timeout_s=LEADER_WITHIN_S)
        restarted_s = time.monotonic() - start
    assert created_s < LEADER_WITHIN_S, created_s
    assert restarted_s < LEADER_WITHIN_S, restarted_s


# Slow master heartbeats (3 s): without the report sent at the election, the master would name
# the new leader only 0-3 s later; with it, within a round trip.
SLOW_REPORTS = [*FAST_RAFT_FLAGS, "--master-heartbeat-interval-ms", "3000"]
REPORTED_WITHIN_S = 1.0


def _leader_in_master(cluster: MiniCluster, tablet_id: str) -> str:
    (location,) = [t for t in ops.locations(cluster, "t") if t.tablet_id == tablet_id]
    return location.leader_uuid


def test_a_new_leader_is_reported_to_the_master_at_once() -> None:
    flags = fast_master_flags()
    with MiniCluster(3, num_masters=1, master_flags=flags, tserver_flags=SLOW_REPORTS) as cluster:
        ops.call(cluster, "CreateTable", ops.create_table_request("t", SCHEMA, replicas=3))
        ops.wait_create_done(cluster, "t")
        (tablet,) = [t.tablet_id for t in ops.locations(cluster, "t")]
        old = cluster.leader_of(tablet)
        ops.wait_until(lambda: _leader_in_master(cluster, tablet) == old.uuid, what="report")
        old.kill()
        new = cluster.leader_of(tablet)  # polled every 50 ms: the election just happened
        elected_s = time.monotonic()
        ops.wait_until(
            lambda: _leader_in_master(cluster, tablet) == new.uuid,
            timeout_s=10,
            what="the new leader in the master's locations",
        )
        reported_s = time.monotonic() - elected_s
    assert reported_s < REPORTED_WITHIN_S, reported_s


def test_a_killed_tserver_is_unresponsive_within_two_heartbeat_intervals() -> None:
    flags = fast_master_flags()
    with (
        MiniCluster(3, num_masters=1, master_flags=flags) as cluster,
        nyala.connect(cluster.master_addrs) as client,
    ):
        victim = cluster.tserver(0)
        states = {s["uuid"]: s for s in client.list_tablet_servers()}
        assert states[victim.uuid]["state"] == "LIVE"
        assert states[victim.uuid]["live"]
        victim.kill()
        killed_s = time.monotonic()

        def unresponsive() -> bool:
            server = {s["uuid"]: s for s in client.list_tablet_servers()}[victim.uuid]
            return server["state"] == "UNRESPONSIVE" and not server["live"]

        ops.wait_until(unresponsive, timeout_s=10, what="the killed tserver UNRESPONSIVE")
        seen_s = time.monotonic() - killed_s
        others = [s for s in client.list_tablet_servers() if s["uuid"] != victim.uuid]
    # The tservers heartbeat every 1 s: overdue 1.5 s after the last one, seen by the next poll.
    assert seen_s < 2.5, seen_s
    assert [s["state"] for s in others] == ["LIVE", "LIVE"]
