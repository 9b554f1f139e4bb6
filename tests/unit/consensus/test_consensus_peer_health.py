"""The leader's per-peer health (what its tablet report tells the master): HEALTHY while a
follower answers, FAILED after the failure timeout without any answer, FAILED_UNRECOVERABLE
once the follower says its replica is FAILED, and HEALTHY again when it answers with a log."""

from __future__ import annotations

from nyala.consensus.progress import PeerHealth, PeerProgress
from nyala.consensus.sim_cluster import SimCluster

FAILED_AFTER_MS = 3_000


def _leader_cluster() -> SimCluster:
    cluster = SimCluster(["a", "b", "c"])
    cluster.elect("a")
    return cluster


def _run(cluster: SimCluster, total_ms: int, step_ms: int = 100) -> None:
    for _ in range(total_ms // step_ms):
        cluster.tick(step_ms)
        cluster.deliver_all()


def test_followers_are_healthy_then_failed_when_silent() -> None:
    cluster = _leader_cluster()
    leader = cluster.node("a").running()
    _run(cluster, 1_000)
    assert leader.peer_health(FAILED_AFTER_MS) == {
        "b": PeerHealth.HEALTHY,
        "c": PeerHealth.HEALTHY,
    }
    cluster.partition([["a", "b"], ["c"]])
    _run(cluster, FAILED_AFTER_MS // 2)
    assert leader.peer_health(FAILED_AFTER_MS)["c"] is PeerHealth.HEALTHY  # not yet
    _run(cluster, FAILED_AFTER_MS)
    assert leader.peer_health(FAILED_AFTER_MS) == {
        "b": PeerHealth.HEALTHY,
        "c": PeerHealth.FAILED,
    }
    cluster.heal()
    _run(cluster, 1_000)
    assert leader.peer_health(FAILED_AFTER_MS)["c"] is PeerHealth.HEALTHY
    # Only a leader reports health.
    assert cluster.node("b").running().peer_health(FAILED_AFTER_MS) == {}


def test_a_follower_whose_replica_failed_is_unrecoverable_until_it_answers_with_a_log() -> None:
    cluster = _leader_cluster()
    leader = cluster.node("a").running()
    _run(cluster, 500)
    leader.peer_failed("c", "tablet failed: superblock unreadable")
    assert leader.peer_health(FAILED_AFTER_MS)["c"] is PeerHealth.FAILED_UNRECOVERABLE
    progress = leader.peer_progress("c")
    assert progress is not None
    assert progress.unrecoverable == "tablet failed: superblock unreadable"
    _run(cluster, 1_000)  # c answers again (here its replica was fine all along)
    assert leader.peer_health(FAILED_AFTER_MS)["c"] is PeerHealth.HEALTHY
    leader.peer_failed("nobody", "not a member")  # ignored
    assert "nobody" not in leader.peer_health(FAILED_AFTER_MS)


def test_unknown_until_heard_or_timed_out() -> None:
    progress = PeerProgress(uuid="x", next_index=1, tracked_since_ms=1_000)
    assert progress.health(1_500, FAILED_AFTER_MS) is PeerHealth.UNKNOWN
    assert progress.health(1_000 + FAILED_AFTER_MS + 1, FAILED_AFTER_MS) is PeerHealth.FAILED
    progress.last_contact_ms = 4_000
    assert progress.health(4_100, FAILED_AFTER_MS) is PeerHealth.HEALTHY
