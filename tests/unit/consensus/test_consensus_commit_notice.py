"""When a leader tells its followers a new commit index (``commit_notice_delay_ms``).

At 0 (the default, Kudu's and etcd's behaviour) a commit that finds a follower with nothing in
flight sends it an empty AppendEntries at once. The tablet server sets a delay: the next batch
carries the commit index anyway, and a lone writer's every write cost each follower, and the
leader, one more exchange (issue 28). Once the delay has passed, an idle follower that no
batch told hears it."""

from __future__ import annotations

from nyala.consensus.messages import AppendRequest, Message
from nyala.consensus.options import RaftOptions
from nyala.consensus.sim_cluster import SimCluster

DELAY_MS = 20


def _commit_notices(queue: list[Message]) -> list[AppendRequest]:
    return [m for m in queue if isinstance(m, AppendRequest) and not m.entries]


def _one_committed_write(delay_ms: int) -> tuple[SimCluster, int]:
    """Leader ``a`` of three; one entry proposed, replicated and answered by both followers,
    so the leader has just committed it. Returns the cluster and the entry's index."""
    cluster = SimCluster(["a", "b", "c"], options=RaftOptions(commit_notice_delay_ms=delay_ms))
    cluster.elect("a")
    cluster.tick(delay_ms + 1)
    cluster.deliver_all()  # the no-op's commit is told too, by now
    assert not cluster.queue
    index = cluster.node("a").running().propose(b"row").index
    cluster.process(cluster.node("a"))
    while any(isinstance(m, AppendRequest) and m.entries for m in cluster.queue):
        cluster.deliver_one()  # the batches to b and c
    while cluster.queue and not isinstance(cluster.queue[0], AppendRequest):
        cluster.deliver_one()  # their answers: the leader commits
    assert cluster.node("a").running().commit_index == index
    return cluster, index


def test_without_a_delay_an_idle_follower_is_told_at_once() -> None:
    cluster, index = _one_committed_write(0)
    # b's answer committed the entry; c's was still to come (its batch in flight then).
    notices = _commit_notices(cluster.queue)
    assert [(m.dest, m.committed_index) for m in notices] == [("b", index)]


def test_with_a_delay_idle_followers_are_told_once_it_passed() -> None:
    cluster, index = _one_committed_write(DELAY_MS)
    assert _commit_notices(cluster.queue) == []
    assert cluster.node("a").running().next_timer_ms() == cluster.clock.now_ms() + DELAY_MS
    cluster.tick(DELAY_MS - 1, ["a"])
    assert _commit_notices(cluster.queue) == []
    cluster.tick(1, ["a"])
    notices = _commit_notices(cluster.queue)
    assert sorted(m.dest for m in notices) == ["b", "c"]
    assert all(m.committed_index == index for m in notices)
    cluster.deliver_all()
    assert [len(cluster.node(u).applied) for u in "abc"] == [index] * 3


def test_a_batch_sent_within_the_delay_carries_the_commit_index_instead() -> None:
    cluster, index = _one_committed_write(DELAY_MS)
    cluster.node("a").running().propose(b"next")
    cluster.process(cluster.node("a"))
    batches = [m for m in cluster.queue if isinstance(m, AppendRequest) and m.entries]
    assert sorted(m.dest for m in batches) == ["b", "c"]
    assert all(m.committed_index == index for m in batches)
    cluster.queue.clear()  # neither is delivered: nothing else is owed to them
    cluster.tick(DELAY_MS, ["a"])
    assert _commit_notices(cluster.queue) == []


def test_a_follower_that_a_batch_told_gets_no_notice() -> None:
    # Five voters, so that one follower's answer does not commit the next entry: the commit
    # index that entry's batch carried is still the latest when the delay has passed.
    options = RaftOptions(commit_notice_delay_ms=DELAY_MS)
    cluster = SimCluster(["a", "b", "c", "d", "e"], options=options)
    cluster.elect("a")
    cluster.tick(DELAY_MS + 1)
    cluster.deliver_all()
    leader = cluster.node("a").running()

    def deliver_to(dest: str) -> None:
        cluster.deliver_one(next(i for i, m in enumerate(cluster.queue) if m.dest == dest))

    first = leader.propose(b"first").index
    cluster.process(cluster.node("a"))
    for follower in "bc":
        deliver_to(follower)
        deliver_to("a")
    assert leader.commit_index == first  # a notice is due: b and c have nothing in flight
    leader.propose(b"second")
    cluster.process(cluster.node("a"))
    deliver_to("b")  # b gets the second entry with the commit index of the first
    deliver_to("a")
    assert leader.commit_index == first
    cluster.tick(DELAY_MS, ["a"])
    # c, d and e have batches in flight; b was told by its batch.
    assert [m.dest for m in _commit_notices(cluster.queue)] == []
