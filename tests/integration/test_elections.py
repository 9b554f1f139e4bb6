"""Elections and the master's view of them, on real processes: a sole voter leads at once (no
election timeout), and tablet servers report a leadership change to the masters at once."""

from __future__ import annotations

import time

from nyala.schema import Column, Schema
from nyala.testing import MiniCluster

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
