"""The clock: the one module in nyala that reads the time (STYLE.md 6).

Everything that needs the time takes a ``Clock``. Servers pass ``RealClock``; scenario tests and
simulations pass ``ManualClock`` and move time forward themselves, which is what makes them
deterministic. Times are integer milliseconds on a monotonic scale with an arbitrary origin:
they order events and measure intervals, they are never wall-clock dates.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A monotonic millisecond clock."""

    def now_ms(self) -> int:
        """Milliseconds since an arbitrary, fixed origin; never goes backwards."""
        ...


class RealClock:
    """The operating system's monotonic clock."""

    def now_ms(self) -> int:
        """Milliseconds of ``time.monotonic_ns``."""
        return time.monotonic_ns() // 1_000_000


class ManualClock:
    """A clock that only moves when told to (tests, scenarios, simulations)."""

    def __init__(self, start_ms: int = 0) -> None:
        if start_ms < 0:
            raise ValueError(f"start_ms must be >= 0, got {start_ms}")
        self._now_ms = start_ms

    def now_ms(self) -> int:
        """The time last set by ``advance``."""
        return self._now_ms

    def advance(self, delta_ms: int) -> int:
        """Moves the time forward by ``delta_ms`` and returns the new time."""
        if delta_ms < 0:
            raise ValueError(f"a clock never goes backwards (delta_ms={delta_ms})")
        self._now_ms += delta_ms
        return self._now_ms
