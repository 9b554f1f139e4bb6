"""The hybrid clock (issue 34): timestamps never repeat or go backwards, move past what a
server is shown, refuse what is too far ahead, and convert to and from dates."""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from nyala.common.clock import (
    HYBRID_LOGICAL_BITS,
    HybridClock,
    hybrid_time,
    physical_us,
    timestamp_from_datetime,
    timestamp_to_datetime,
)


class _Wall:
    """A wall clock a test sets (microseconds since the epoch); it may go backwards."""

    def __init__(self, us: int) -> None:
        self.us = us

    def __call__(self) -> int:
        return self.us


def test_now_rises_even_when_the_wall_clock_stands_still_or_steps_back() -> None:
    wall = _Wall(1_000_000)
    clock = HybridClock(wall_us=wall)
    first = clock.now()
    assert first == hybrid_time(1_000_000)
    second = clock.now()  # same microsecond: the logical counter moves
    assert second == first + 1
    wall.us = 999_000  # NTP stepped the wall clock back
    third = clock.now()
    assert third > second
    wall.us = 2_000_000
    assert clock.now() == hybrid_time(2_000_000)


def test_update_moves_past_a_seen_timestamp_and_refuses_one_too_far_ahead() -> None:
    wall = _Wall(5_000_000)
    clock = HybridClock(max_clock_error_us=1_000_000, wall_us=wall)
    seen = hybrid_time(5_500_000, 7)  # another server's clock, half a second ahead
    clock.update(seen)
    assert clock.peek() == seen
    assert clock.now() == seen + 1
    with pytest.raises(ValueError, match="maximum clock error"):
        clock.update(hybrid_time(6_600_000))
    assert clock.now() == seen + 2  # the refused timestamp moved nothing
    clock.update(0)  # "none observed" is ignored
    assert clock.ahead_us(hybrid_time(5_400_000)) < 0


def test_timestamps_from_many_threads_are_unique() -> None:
    clock = HybridClock()
    seen: list[list[int]] = [[] for _ in range(4)]

    def take(out: list[int]) -> None:
        for _ in range(5000):
            out.append(clock.now())

    threads = [threading.Thread(target=take, args=(out,)) for out in seen]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    merged = [ts for out in seen for ts in out]
    assert len(set(merged)) == len(merged)
    for out in seen:
        assert out == sorted(out)


def test_datetime_round_trip() -> None:
    when = dt.datetime(2026, 11, 26, 20, 30, 1, 123456, tzinfo=dt.UTC)
    ts = timestamp_from_datetime(when)
    assert physical_us(ts) == int(when.timestamp()) * 1_000_000 + 123456
    assert ts & ((1 << HYBRID_LOGICAL_BITS) - 1) == 0
    assert timestamp_to_datetime(ts) == when
    assert timestamp_to_datetime(ts + 5) == when  # the logical part is below a microsecond
    naive = when.replace(tzinfo=None)
    assert timestamp_from_datetime(naive) == ts  # naive means UTC
    berlin = when.astimezone(dt.timezone(dt.timedelta(hours=1)))
    assert timestamp_from_datetime(berlin) == ts
    with pytest.raises(ValueError, match="bad hybrid time"):
        hybrid_time(-1)
