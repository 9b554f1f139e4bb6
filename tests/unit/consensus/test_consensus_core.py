"""Focused checks of ``RaftCore`` that scenarios show less directly: persistence ordering,
timeout randomization and back-off, typed refusals."""

from __future__ import annotations

import random

import pytest

from nyala.common.clock import ManualClock
from nyala.consensus import (
    MemoryCmetaStore,
    MemoryLog,
    RaftConfig,
    RaftCore,
    RaftOptions,
    RaftPeer,
    Send,
    bootstrap_cmeta,
)
from nyala.consensus.messages import AppendRequest, VoteRequest, VoteResponse
from nyala.consensus.metadata import ConsensusMetadata
from nyala.consensus.sim_cluster import SimCluster
from nyala.consensus.types import MIN_OP_ID, OpId, Role
from nyala.errors import DiskFullError, IllegalStateError, NotLeaderError, WrongServerUuidError

CONFIG = RaftConfig((RaftPeer("a", "a:1"), RaftPeer("b", "b:1"), RaftPeer("c", "c:1")))


class FailingStore(MemoryCmetaStore):
    """A cmeta store whose disk fills up on demand."""

    def __init__(self) -> None:
        super().__init__()
        self.full = False

    def save(self, meta: ConsensusMetadata) -> None:
        if self.full:
            raise DiskFullError("no space left on device")
        super().save(meta)


def make_core(store: MemoryCmetaStore | None = None, **options: int) -> RaftCore:
    store = store or MemoryCmetaStore()
    bootstrap_cmeta(store, CONFIG)
    return RaftCore(
        "b", MemoryLog(), store, ManualClock(), random.Random(1), RaftOptions(**options)
    )


def test_vote_is_durable_before_the_response_exists() -> None:
    store = MemoryCmetaStore()
    core = make_core(store)
    core.step(VoteRequest("a", "b", 3, MIN_OP_ID))
    assert store.load().current_term == 3
    assert store.load().voted_for == "a"
    sends = [e.message for e in core.drain_effects() if isinstance(e, Send)]
    assert sends == [VoteResponse("b", "a", 3, True, False)]


def test_no_vote_leaves_when_cmeta_cannot_be_written() -> None:
    store = FailingStore()
    core = make_core(store)
    store.full = True
    with pytest.raises(DiskFullError):
        core.step(VoteRequest("a", "b", 3, MIN_OP_ID))
    assert not any(isinstance(e, Send) for e in core.drain_effects())
    assert store.load().voted_for is None


def test_pre_vote_persists_nothing() -> None:
    store = MemoryCmetaStore()
    core = make_core(store)
    saves = store.saves
    core.step(VoteRequest("a", "b", 3, OpId(1, 1), pre_election=True))
    assert store.saves == saves
    assert core.term == 0
    sends = [e.message for e in core.drain_effects() if isinstance(e, Send)]
    assert sends == [VoteResponse("b", "a", 3, True, True)]


def test_election_timeouts_are_jittered_and_back_off_up_to_the_cap() -> None:
    core = make_core(heartbeat_interval_ms=100, election_backoff_max_ms=1_000)
    base = 300
    samples = []
    for _ in range(200):
        core._reset_election_timer()
        samples.append(core.election_deadline_ms)
    assert min(samples) >= base * 0.75
    assert max(samples) < base * 1.25
    assert len(set(samples)) > 50
    core._failed_elections = 1
    core._reset_election_timer()
    assert 600 * 0.75 <= core.election_deadline_ms < 600 * 1.25
    core._failed_elections = 10
    core._reset_election_timer()
    assert 1_000 * 0.75 <= core.election_deadline_ms < 1_000 * 1.25


def test_followers_of_a_silent_quiesced_leader_campaign_in_an_order_that_differs_by_group() -> None:
    """When a quiesced leader's server goes silent, its followers wake together (and so do
    all the other tablets it led). Random timeouts that fall close together split the vote;
    the first campaigns are one jitter slot apart instead, in an order drawn per group so
    that the new leaders spread over the survivors."""
    options = RaftOptions()  # base 1,500 ms, jitter 0.25: slots of 750 ms
    slot_ms = options.election_jitter_range_ms
    b_first = 0
    for g in range(200):
        clock = ManualClock()
        cores = {}
        for uuid in ("b", "c"):
            store = MemoryCmetaStore()
            bootstrap_cmeta(store, CONFIG)
            core = RaftCore(
                uuid, MemoryLog(), store, clock, random.Random(g), options, group_id=f"t{g}"
            )
            core.step(AppendRequest("a", uuid, 1, MIN_OP_ID, None, 0, 1, quiesce=True))
            assert core.quiesced
            cores[uuid] = core
        clock.advance(options.election_timeout_min_ms + 100)  # a's server went silent
        for core in cores.values():
            core.wake()
        b, c = (cores[u].election_deadline_ms for u in ("b", "c"))
        first = min(b, c)
        # The first campaigns one minimum timeout after the last sign of life, or soon after.
        assert options.election_timeout_min_ms <= first < options.election_timeout_min_ms + slot_ms
        assert abs(b - c) >= slot_ms / 2, (g, b, c)
        b_first += b < c
    assert 60 <= b_first <= 140, b_first  # each survivor goes first for about half the groups


def test_refusals_are_typed() -> None:
    core = make_core()
    with pytest.raises(NotLeaderError):
        core.propose(b"x")
    with pytest.raises(NotLeaderError):
        core.read(1)
    with pytest.raises(WrongServerUuidError):
        core.step(VoteRequest("a", "c", 1, MIN_OP_ID))


def test_a_core_whose_cmeta_write_failed_stays_stopped() -> None:
    store = FailingStore()
    core = make_core(store)
    store.full = True
    with pytest.raises(DiskFullError):
        core.step(VoteRequest("a", "b", 3, MIN_OP_ID))
    store.full = False
    with pytest.raises(IllegalStateError, match="restart it from disk"):
        core.tick()
    with pytest.raises(IllegalStateError):
        core.campaign()
    assert core.drain_effects() == []


def test_status_says_since_when_a_leader_leads() -> None:
    """``leader_since_ms`` (the servers' ``nyala_tablet_leader_for_seconds``): set when the
    replica becomes leader, kept while it leads, cleared when it steps down."""
    store = MemoryCmetaStore()
    bootstrap_cmeta(store, RaftConfig((RaftPeer("b", "b:1"),)))
    clock = ManualClock()
    core = RaftCore("b", MemoryLog(), store, clock, random.Random(1), RaftOptions())
    assert core.status().leader_since_ms is None
    clock.advance(core.election_deadline_ms - clock.now_ms() + 1)
    core.tick()
    assert core.role is Role.LEADER
    elected_at = clock.now_ms()
    assert core.status().leader_since_ms == elected_at
    clock.advance(5_000)
    core.tick()
    assert core.status().leader_since_ms == elected_at
    core.step_down()
    assert core.status().leader_since_ms is None


def test_a_leader_awaits_its_own_log_only_while_a_majority_acknowledged_more() -> None:
    """``awaits_own_durability`` (the runtime keeps a leader's log quiet unless it holds):
    true exactly while the commit index would move were the leader's own log durable."""
    cluster = SimCluster(["a", "b", "c"])
    cluster.elect("a")
    cluster.deliver_all()
    leader_node = cluster.node("a")
    leader = leader_node.running()
    assert not leader.awaits_own_durability()  # everything committed
    leader_node.auto_sync = False
    index = leader.propose(b"row").index
    cluster.process(leader_node)
    assert not leader.awaits_own_durability()  # nobody acknowledged it yet
    cluster.partition([["a", "b"], ["c"]])  # b's answer alone makes a majority with a's log
    cluster.deliver_all()  # the batch to b, which syncs at once, and its answer
    assert leader.commit_index < index  # the leader's own log holds it back
    assert leader.awaits_own_durability()
    cluster.sync("a")
    assert leader.commit_index == index
    assert not leader.awaits_own_durability()
    cluster.heal()
    for uuid in ("b", "c"):
        assert not cluster.node(uuid).running().awaits_own_durability()  # followers: never
