"""When a leader sends a batch again: an unanswered batch is resent after
``unanswered_resend_after_ms`` (one heartbeat interval by default), or at once when the
runtime reports it lost (``RaftCore.append_lost``: its stream broke, the peer refused it).

Resending on age alone made a busy server busier: a batch merely slow behind a stalled event
loop was read from the WAL and sent a second time at every heartbeat round (docs/consensus.md,
"Measured, and what is still open")."""

from __future__ import annotations

from nyala.consensus.messages import AppendRequest, Message
from nyala.consensus.options import RaftOptions
from nyala.consensus.sim_cluster import SimCluster

HEARTBEAT_MS = 500


def _batches_to(queue: list[Message], dest: str) -> list[AppendRequest]:
    return [m for m in queue if isinstance(m, AppendRequest) and m.dest == dest and m.entries]


def _leader_with_a_batch_out_to_c(resend_after_ms: int) -> tuple[SimCluster, int]:
    """Leader ``a``; one entry proposed whose batch to ``c`` stays in the queue, unanswered
    (``b`` gets everything); returns the cluster and the entry's index."""
    options = RaftOptions(
        heartbeat_interval_ms=HEARTBEAT_MS, unanswered_resend_after_ms=resend_after_ms
    )
    cluster = SimCluster(["a", "b", "c"], options=options)
    cluster.elect("a")
    leader = cluster.node("a").running()
    index = leader.propose(b"row").index
    cluster.process(cluster.node("a"))
    assert len(_batches_to(cluster.queue, "c")) == 1
    return cluster, index


def _run_holding_c(cluster: SimCluster, total_ms: int) -> None:
    """Heartbeat rounds for ``total_ms``; every message is delivered except those to ``c``."""
    for _ in range(total_ms // 100):
        cluster.tick(100)
        position = 0
        while position < len(cluster.queue):
            if cluster.queue[position].dest == "c":
                position += 1
            else:
                cluster.deliver_one(position)


def test_a_slow_batch_is_not_sent_again_before_the_resend_timeout() -> None:
    cluster, _ = _leader_with_a_batch_out_to_c(resend_after_ms=5_000)
    _run_holding_c(cluster, 4 * HEARTBEAT_MS)
    assert len(_batches_to(cluster.queue, "c")) == 1  # heartbeats only meanwhile
    _run_holding_c(cluster, 5_000)
    assert len(_batches_to(cluster.queue, "c")) == 2  # the backstop for silent losses


def test_by_default_an_unanswered_batch_is_resent_after_a_heartbeat_interval() -> None:
    cluster, _ = _leader_with_a_batch_out_to_c(resend_after_ms=0)
    _run_holding_c(cluster, 2 * HEARTBEAT_MS)
    assert len(_batches_to(cluster.queue, "c")) >= 2


def test_a_batch_reported_lost_is_resent_at_the_next_round() -> None:
    cluster, index = _leader_with_a_batch_out_to_c(resend_after_ms=60_000)
    leader = cluster.node("a").running()
    leader.append_lost("c", leader.term - 1, index)  # another term's loss: not this batch
    leader.append_lost("b", leader.term, index)  # b answered it: nothing in flight to b
    _run_holding_c(cluster, HEARTBEAT_MS)
    assert len(_batches_to(cluster.queue, "c")) == 1
    leader.append_lost("c", leader.term, index)
    _run_holding_c(cluster, HEARTBEAT_MS)
    resent = _batches_to(cluster.queue, "c")
    assert len(resent) == 2
    assert resent[1].preceding == resent[0].preceding  # from the oldest unanswered entry
    cluster.deliver_all()
    progress = leader.peer_progress("c")
    assert progress is not None
    assert progress.match_index == index
