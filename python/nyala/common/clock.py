"""The clock: the one module in nyala that reads the time (STYLE.md 6).

Everything that needs the time takes a ``Clock``. Servers pass ``RealClock``; scenario tests and
simulations pass ``ManualClock`` and move time forward themselves, which is what makes them
deterministic. Times are integer milliseconds on a monotonic scale with an arbitrary origin:
they order events and measure intervals, they are never wall-clock dates.

The exception is ``HybridClock`` (issue 34, docs/consistency.md): the timestamps that order
row versions for snapshot reads are wall-clock microseconds with a logical counter, so that a
user can ask for "the table as of" a date and two servers' timestamps are comparable.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable
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


# --- hybrid time (issue 34) -------------------------------------------------------------------

#: Bits of a hybrid timestamp below the physical microseconds: a logical counter that orders
#: events within one microsecond (Kudu's layout: ``physical_us << 12 | logical``).
HYBRID_LOGICAL_BITS = 12
_LOGICAL_MASK = (1 << HYBRID_LOGICAL_BITS) - 1
#: How far ahead of a server's clock a timestamp it is shown may be (Kudu's
#: ``max_clock_sync_error_usec``, 10 s): a propagated or snapshot timestamp further ahead is
#: refused rather than dragging the clock (and every later write) into the future.
MAX_CLOCK_ERROR_US_DEFAULT = 10_000_000


def hybrid_time(physical_us: int, logical: int = 0) -> int:
    """The hybrid timestamp of ``physical_us`` microseconds since the epoch (UTC)."""
    if physical_us < 0 or not 0 <= logical <= _LOGICAL_MASK:
        raise ValueError(f"bad hybrid time parts ({physical_us}, {logical})")
    return (physical_us << HYBRID_LOGICAL_BITS) | logical


def physical_us(timestamp: int) -> int:
    """The microseconds since the epoch of a hybrid timestamp."""
    return timestamp >> HYBRID_LOGICAL_BITS


class HybridClock:
    """A server's hybrid clock (Kudu's HybridClock): the wall clock in microseconds with a
    logical counter below it, so that ``now()`` never repeats or goes backwards even when the
    wall clock does, and ``update`` moves it past any timestamp the server has seen (from a
    client, or from another server's WAL entries). Timestamps of one server are therefore
    ordered with the events that caused them (Lamport), and stay within the clock error of
    real time. Thread-safe: tablets' leaders on several threads share one clock."""

    def __init__(
        self,
        max_clock_error_us: int = MAX_CLOCK_ERROR_US_DEFAULT,
        wall_us: Callable[[], int] | None = None,
    ) -> None:
        if max_clock_error_us <= 0:
            raise ValueError(f"max_clock_error_us must be > 0, got {max_clock_error_us}")
        self.max_clock_error_us = max_clock_error_us
        self._wall_us = wall_us or (lambda: time.time_ns() // 1000)
        self._last = 0
        self._lock = threading.Lock()

    def now(self) -> int:
        """A timestamp greater than every one returned or seen before."""
        physical = hybrid_time(self._wall_us())
        with self._lock:
            self._last = max(self._last + 1, physical)
            return self._last

    def peek(self) -> int:
        """The largest timestamp returned or seen so far, or the wall clock's if larger;
        unlike ``now`` it does not consume a timestamp."""
        physical = hybrid_time(self._wall_us())
        with self._lock:
            return max(self._last, physical)

    def update(self, seen: int) -> None:
        """Moves the clock past ``seen`` (a timestamp from a client or another server).
        ``ValueError`` if ``seen`` is further ahead of the wall clock than the clock error
        allows (a broken or hostile clock must not pull this server into the future)."""
        if seen <= self._last:
            # Already past it (and so not ahead): every write that carries the timestamp of
            # the client's previous answer. ``_last`` only rises; a stale read takes the
            # slow path below.
            return
        self.check_not_ahead(seen)
        with self._lock:
            self._last = max(self._last, seen)

    def ahead_us(self, timestamp: int) -> int:
        """How many microseconds ``timestamp`` is ahead of this clock (<= 0: not ahead)."""
        return physical_us(timestamp) - physical_us(self.peek())

    def check_not_ahead(self, timestamp: int) -> None:
        """``ValueError`` if ``timestamp`` is beyond this clock plus the clock error."""
        ahead = self.ahead_us(timestamp)
        if ahead > self.max_clock_error_us:
            raise ValueError(
                f"timestamp {timestamp} is {ahead} us ahead of this server's clock, beyond "
                f"the maximum clock error of {self.max_clock_error_us} us"
            )


def timestamp_from_datetime(when: datetime.datetime) -> int:
    """The hybrid timestamp of a moment (``Table.scan(read_mode="snapshot", snapshot_ts=...)``
    reads the table as of it). A naive datetime is taken as UTC."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    delta = when - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    return hybrid_time((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds)


def timestamp_to_datetime(timestamp: int) -> datetime.datetime:
    """The moment (UTC, microseconds) of a hybrid timestamp, e.g. ``WriteResult.timestamp``."""
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    return epoch + datetime.timedelta(microseconds=physical_us(timestamp))
