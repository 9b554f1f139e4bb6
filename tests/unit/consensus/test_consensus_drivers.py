"""The membership drivers against a simulated cluster: add (with promotion), remove (also the
leader), move (3-4-3), idempotence, and timing out when the new replica cannot catch up."""

from __future__ import annotations

import asyncio

import pytest

from nyala.consensus import ConfigChange, OpId, RaftConfig, RaftPeer, Role
from nyala.consensus.core import RaftCore
from nyala.consensus.drivers import add_replica, move_replica, remove_replica
from nyala.consensus.local_cluster import LocalCluster
from nyala.consensus.types import EntryKind
from nyala.errors import NotLeaderError, TimedOutError

STEP_MS = 50


class SimulatedAdmin:
    """``ConsensusAdmin`` over a ``LocalCluster``: finds the leader like a client would."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.changes = 0

    def _leader(self) -> RaftCore:
        leaders = self.cluster.leaders()
        if not leaders:
            raise NotLeaderError("no leader right now")
        return self.cluster.node(leaders[-1]).running()

    async def committed_config(self) -> RaftConfig:
        return self._leader().committed_config

    async def change_config(self, change: ConfigChange) -> OpId:
        core = self._leader()
        try:
            op_id = core.change_config(change)
            self.changes += 1
            return op_id
        finally:
            self.cluster.process(self.cluster.node(core.uuid))

    async def sleep(self, delay_ms: int) -> None:
        for _ in range(max(1, delay_ms // STEP_MS)):
            self.cluster.tick(STEP_MS)
            self.cluster.deliver_all()


def started_cluster() -> tuple[LocalCluster, SimulatedAdmin]:
    cluster = LocalCluster(["a", "b", "c"])
    cluster.node("a").running().campaign()
    cluster.process(cluster.node("a"))
    cluster.deliver_all()
    assert cluster.leaders() == ["a"]
    return cluster, SimulatedAdmin(cluster)


def test_add_replica_waits_for_promotion() -> None:
    cluster, admin = started_cluster()
    cluster.add_node("d")
    config = asyncio.run(
        add_replica(admin, RaftPeer("d", "d:7050"), clock=cluster.clock, sleep=admin.sleep)
    )
    assert config.voters() == ("a", "b", "c", "d")
    assert cluster.node("d").running().role is Role.FOLLOWER
    # Idempotent: a retry of the same request changes nothing.
    again = asyncio.run(
        add_replica(admin, RaftPeer("d", "d:7050"), clock=cluster.clock, sleep=admin.sleep)
    )
    assert again == config
    assert admin.changes == 1  # the ADD; the promotion was the leader's own change


def test_remove_the_leader_goes_through_a_transfer() -> None:
    cluster, admin = started_cluster()
    config = asyncio.run(remove_replica(admin, "a", clock=cluster.clock, sleep=admin.sleep))
    assert config.voters() == ("b", "c")
    assert cluster.leaders()[-1] in ("b", "c")


def test_move_replica_is_add_then_remove() -> None:
    cluster, admin = started_cluster()
    cluster.add_node("d")
    config = asyncio.run(
        move_replica(admin, "c", RaftPeer("d", "d:7050"), clock=cluster.clock, sleep=admin.sleep)
    )
    assert config.voters() == ("a", "b", "d")
    kinds = [e.kind for e in cluster.node("a").log.entries()]
    assert kinds.count(EntryKind.CONFIG_CHANGE) == 3  # add d, promote d, remove c


def test_add_replica_times_out_when_the_replica_cannot_catch_up() -> None:
    cluster, admin = started_cluster()
    cluster.add_node("d")
    cluster.partition([["d"]])
    with pytest.raises(TimedOutError, match="promotion of d"):
        asyncio.run(
            add_replica(
                admin,
                RaftPeer("d", "d:7050"),
                clock=cluster.clock,
                sleep=admin.sleep,
                timeout_ms=3_000,
            )
        )
    committed = cluster.node("a").running().committed_config
    peer = committed.peer("d")
    assert peer is not None
    assert not peer.is_voter
