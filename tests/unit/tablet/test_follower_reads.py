"""The staleness rule of follower reads: a real ``RaftCore`` on a manual clock says when it last
held everything its leader had committed, and ``follower_read_refusal`` turns that into serve or
refuse (DESIGN.md §5)."""

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
    bootstrap_cmeta,
)
from nyala.consensus.core import LeaderContact
from nyala.consensus.messages import AppendRequest, VoteRequest
from nyala.consensus.types import MIN_OP_ID
from nyala.tablet.replica import follower_read_refusal

CONFIG = RaftConfig((RaftPeer("a", "a:1"), RaftPeer("b", "b:1"), RaftPeer("c", "c:1")))


def follower() -> tuple[RaftCore, ManualClock]:
    store = MemoryCmetaStore()
    bootstrap_cmeta(store, CONFIG)
    clock = ManualClock(1_000)
    return RaftCore("b", MemoryLog(), store, clock, random.Random(1), RaftOptions()), clock


def heartbeat(term: int, committed_index: int, seq: int = 1) -> AppendRequest:
    return AppendRequest("a", "b", term, MIN_OP_ID, None, committed_index, seq)


@pytest.mark.parametrize(
    ("contact", "bound_ms", "applied", "refused_because"),
    [
        (LeaderContact(1, "a", 7, 100), 500, 7, None),
        (LeaderContact(1, "a", 7, 500), 500, 9, None),  # exactly at the bound still serves
        (LeaderContact(1, "a", 7, 501), 500, 9, "over the staleness bound"),
        (LeaderContact(1, "a", 7, 10), 500, 6, "behind the leader's commit index 7"),
        (None, 500, 9, "no leader of the current term"),
        (LeaderContact(1, "a", 7, 0), 0, 9, "needs a staleness bound"),
    ],
)
def test_the_staleness_rule(
    contact: LeaderContact | None, bound_ms: int, applied: int, refused_because: str | None
) -> None:
    refusal = follower_read_refusal(contact, bound_ms, applied)
    if refused_because is None:
        assert refusal is None
    else:
        assert refusal is not None
        assert refused_because in refusal


def test_a_follower_reports_its_last_caught_up_contact_with_the_leader() -> None:
    core, clock = follower()
    assert core.leader_contact() is None  # never heard a leader
    core.step(heartbeat(1, 0))
    assert core.leader_contact() == LeaderContact(1, "a", 0, 0)
    clock.advance(400)
    contact = core.leader_contact()
    assert contact is not None
    assert contact.age_ms == 400
    assert follower_read_refusal(contact, 300, core.last_applied) is not None
    assert follower_read_refusal(contact, 500, core.last_applied) is None
    # A heartbeat this replica cannot follow up to the leader's commit index (it lacks the
    # entries) is a contact, but not a caught-up one: the age keeps growing.
    core.step(heartbeat(1, 3, seq=2))
    contact = core.leader_contact()
    assert contact is not None
    assert contact.age_ms == 400
    clock.advance(100)
    core.step(heartbeat(1, 0, seq=3))
    assert core.leader_contact() == LeaderContact(1, "a", 0, 0)


def test_a_new_term_forgets_the_old_leader_contact() -> None:
    core, clock = follower()
    core.step(heartbeat(1, 0))
    clock.advance(10_000)  # the old leader went quiet; c asks for votes in term 2
    core.step(VoteRequest("c", "b", 2, MIN_OP_ID))
    assert core.term == 2
    assert core.leader_contact() is None
    core.step(AppendRequest("c", "b", 2, MIN_OP_ID, None, 0, 1))
    assert core.leader_contact() == LeaderContact(2, "c", 0, 0)
