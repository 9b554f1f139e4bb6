"""The clock module: the manual clock moves only forward, the real one is monotonic."""

from __future__ import annotations

import pytest

from nyala.common.clock import Clock, ManualClock, RealClock


def test_manual_clock_moves_only_when_told() -> None:
    clock: Clock = ManualClock(10)
    assert clock.now_ms() == 10
    assert isinstance(clock, ManualClock)
    assert clock.advance(5) == 15
    assert clock.now_ms() == 15
    with pytest.raises(ValueError, match="never goes backwards"):
        clock.advance(-1)


def test_real_clock_is_monotonic() -> None:
    clock = RealClock()
    readings = [clock.now_ms() for _ in range(100)]
    assert readings == sorted(readings)
