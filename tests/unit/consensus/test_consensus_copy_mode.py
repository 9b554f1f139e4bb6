"""A leader's copy mode (auto-vivification by tablet copy): a follower reported TABLET_NOT_FOUND
gets no entries, only a StartTabletCopy request and an empty probe at the leader's last OpId per
heartbeat interval, and leaves copy mode once it answers with a log."""

from __future__ import annotations

from nyala.consensus.effects import Send, StartTabletCopy
from nyala.consensus.messages import AppendRequest
from nyala.consensus.sim_cluster import SimCluster


def _leader_cluster() -> SimCluster:
    cluster = SimCluster(["a", "b", "c"])
    cluster.elect("a")
    return cluster


def test_copy_mode_sends_only_probes_and_copy_requests_until_the_follower_has_a_log() -> None:
    cluster = _leader_cluster()
    leader = cluster.node("a").running()
    for i in range(3):
        leader.propose(f"op-{i}".encode())
    cluster.process(cluster.node("a"))
    cluster.deliver_all()

    leader.peer_needs_copy("c")
    effects = leader.drain_effects()
    assert StartTabletCopy("c", leader.term) in effects
    progress = leader.peer_progress("c")
    assert progress is not None
    assert progress.copy_needed
    assert progress.match_index == 0  # nothing known of a log about to be replaced

    # New entries go to b only; the heartbeat round asks c for a copy again and probes it.
    leader.propose(b"while-copying")
    leader.tick()
    cluster.clock.advance(leader._opts.heartbeat_interval_ms)
    leader.tick()
    effects = leader.drain_effects()
    to_c = [e.message for e in effects if isinstance(e, Send) and e.message.dest == "c"]
    assert to_c
    assert all(isinstance(m, AppendRequest) and m.entries is None for m in to_c)
    assert all(m.preceding == leader.status().last_op_id for m in to_c)
    assert StartTabletCopy("c", leader.term) in effects

    # c answers the probe with its log (here: it never lost it): copy mode ends, it catches up.
    cluster.queue.extend(to_c)
    cluster.queue.extend(
        e.message for e in effects if isinstance(e, Send) and e.message.dest != "c"
    )
    for _ in range(5):
        cluster.deliver_all()
        cluster.tick(leader._opts.heartbeat_interval_ms)
    progress = leader.peer_progress("c")
    assert progress is not None
    assert not progress.copy_needed
    assert progress.match_index == leader.status().last_op_id.index
