"""``RequestTracker``: the lowest outstanding sequence number, as every write request carries
it (``first_incomplete_seq_no``: the servers trim their outcome caches below it)."""

from __future__ import annotations

import random

import pytest

from nyala.client.write import _TRACKER_SLACK, RequestTracker


@pytest.mark.parametrize("seed", range(5))
def test_first_incomplete_is_the_lowest_outstanding_number(seed: int) -> None:
    rng = random.Random(seed)
    tracker = RequestTracker()
    outstanding: set[int] = set()
    for _ in range(20_000):
        if outstanding and rng.random() < 0.5:
            # Answers come in any order, not the order sent.
            seq_no = rng.choice(sorted(outstanding)[:50] + sorted(outstanding)[-50:])
            tracker.done(seq_no)
            outstanding.discard(seq_no)
        else:
            outstanding.add(tracker.new())
        assert tracker.first_incomplete(-1) == min(outstanding, default=-1)
        assert tracker.outstanding == len(outstanding)


def test_one_request_never_answered_does_not_grow_the_tracker_without_bound() -> None:
    tracker = RequestTracker()
    stuck = tracker.new()
    for _ in range(50_000):
        seq_no = tracker.new()
        tracker.done(seq_no)
        assert tracker.first_incomplete(0) == stuck
    assert len(tracker._order) <= 2 * tracker.outstanding + _TRACKER_SLACK + 1
    tracker.done(stuck)
    assert tracker.first_incomplete(12_345) == 12_345
    # Done twice, or a number never handed out: nothing changes.
    tracker.done(stuck)
    tracker.done(10**9)
    assert tracker.first_incomplete(7) == 7
