"""The raw write-ahead log driven from Python: a typed wrapper over ``nyala._native.Log`` (Rust)
for the WAL's own tests (``tests/unit/test_wal.py``), its benchmarks (``benches/wal_bench.py``)
and the chaos suite's torn-tail checks.

Servers never use it: a replica's log is ``nyala.consensus.runtime.wal_log.WalLog``, the WAL
plus its log cache. This module drives the bare WAL from threads and asyncio to measure and
test group commit, durability waits and failure injection on their own. The log itself
(segments, group commit, recovery, GC) lives in ``rust/wal``; nothing here touches files.

Durability from asyncio costs no thread and no polling: the native log exposes an eventfd
that becomes readable whenever the durable point moves; the event loop watches it with
``add_reader`` and resolves every future whose ticket is now durable.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import heapq
import itertools
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Self, TypeAlias

from nyala import _native
from nyala.consensus.types import EntryKind
from nyala.errors import IllegalStateError

if TYPE_CHECKING:
    from typing_extensions import Buffer

_get_ident = threading.get_ident

# A future's pending done callbacks, as ``asyncio.Future._callbacks`` lists them.
_Callbacks: TypeAlias = "list[tuple[Callable[[Any], object], contextvars.Context]]"


def _resolve(
    future: asyncio.Future[Any],
    result: object,
    waking: list[tuple[asyncio.Future[Any], _Callbacks]],
) -> None:
    """Completes ``future`` with ``result``, first taking its done callbacks off it (into
    ``waking``) so that ``set_result`` does not schedule them; the watcher runs them."""
    callbacks: _Callbacks | None = getattr(future, "_callbacks", None)
    if callbacks:
        for callback, _ in callbacks:
            future.remove_done_callback(callback)
        waking.append((future, callbacks))
    future.set_result(result)


__all__ = [
    "AppendTicket",
    "Entry",
    "GcReport",
    "Log",
    "LogOptions",
    "WalCounters",
]


class Entry(NamedTuple):
    """One log entry. The payload is opaque to the log.

    A named tuple, so the native log reads it as the 4-tuple it takes: an append builds no
    second object per entry (this is on every write's path)."""

    term: int
    # Shadows tuple.index(), which no caller of a log entry wants; the op index is the name
    # every other part of nyala uses.
    index: int  # type: ignore[assignment]
    entry_type: EntryKind
    payload: bytes


EntryLike: TypeAlias = "Entry | tuple[int, int, int, Buffer]"


class AppendTicket(NamedTuple):
    """What an append returns: the ticket to await and the last index appended."""

    ticket: int
    last_index: int


class GcReport(NamedTuple):
    """What one GC pass removed, and the first index still in the log."""

    segments_deleted: int
    segments_recycled: int
    first_index: int


@dataclass(frozen=True, slots=True)
class LogOptions:
    """Settings of a log (defaults: DESIGN.md §8 and docs/wal-format.md)."""

    segment_size_bytes: int = 8 << 20
    sync: Literal["group", "none"] = "group"
    # Group syncs that may run at once: the next group is written while earlier ones sync;
    # durability is still reported in order (docs/wal-format.md, "Group commit latency").
    syncs_in_flight_max: int = 1
    queue_bytes_max: int = 64 << 20
    min_segments_to_retain: int = 1
    preallocation: Literal["fallocate", "recycle", "zero_fill"] = "recycle"
    recycle_pool_segments_max: int = 2


@dataclass(frozen=True, slots=True)
class WalCounters:
    """Counters of a log since it was opened. Histograms have power-of-two buckets: bucket
    ``i`` counts values in ``[2**i, 2**(i+1))``."""

    entries_appended: int
    batches_appended: int
    truncations: int
    bytes_written: int
    groups: int
    group_entries_max: int
    syncs: int
    sync_micros_total: int
    sync_micros_max: int
    syncs_overlapped: int
    sync_threads: int
    segments_created: int
    segments_zero_filled: int
    segments_recycled: int
    segments_deleted: int
    fallocate_fallbacks: int
    rollover_waits: int
    rollover_wait_micros_total: int
    append_backpressure_waits: int
    group_entries_histogram: tuple[int, ...]
    sync_micros_histogram: tuple[int, ...]

    @classmethod
    def from_dict(cls, raw: dict[str, int | list[int]]) -> WalCounters:
        values: dict[str, int | tuple[int, ...]] = {}
        for field in fields(cls):
            value = raw[field.name]
            values[field.name] = tuple(value) if isinstance(value, list) else value
        return cls(**values)  # type: ignore[arg-type]


class _DurabilityWatcher:
    """Resolves futures for tickets on one event loop when the log's eventfd fires."""

    def __init__(self, native: _native.Log, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        # The thread `loop` runs in (the watcher is created from inside it).
        self.thread = threading.get_ident()
        self._native = native
        # The log's error once this watcher has seen it (checked per eventfd wake-up, not
        # per wait: a failure signals the eventfd too).
        self._failure = native.failure()
        self._fd = native.notification_fd()
        # Waits arrive in ticket order almost always (an append, then its wait, with no await
        # in between), so they queue in a FIFO: O(1) each way, no tie-breaking tuples. A wait
        # for an older ticket than the FIFO's last goes to a heap instead.
        # (ticket, future, the future's result)
        self._fifo: collections.deque[tuple[int, asyncio.Future[Any], int | None]] = (
            collections.deque()
        )
        self._fifo_last = 0
        # A future of this loop. asyncio's own loops make one in a Python-level method; the
        # C type called directly is the same future one frame cheaper (once per append).
        # Loops that override create_future (uvloop, ...) keep theirs.
        self.new_future: Callable[[], asyncio.Future[Any]]
        if type(loop).create_future is asyncio.BaseEventLoop.create_future:
            self.new_future = functools.partial(asyncio.Future, loop=loop)
        else:
            self.new_future = loop.create_future
        # (ticket, tie-breaker, future, result)
        self._out_of_order: list[tuple[int, int, asyncio.Future[Any], int | None]] = []
        self._counter = itertools.count()
        loop.add_reader(self._fd, self._on_readable)

    def wait(self, ticket: int) -> asyncio.Future[None]:
        """A future for ``ticket``, done at once if it is durable already."""
        future = self.new_future()
        if self._native.durable_ticket() >= ticket:
            future.set_result(None)
            return future
        self.enqueue(ticket, future, None)
        return future

    def enqueue(self, ticket: int, future: asyncio.Future[Any], result: int | None) -> None:
        """Resolves ``future`` to ``result`` once ``ticket`` is durable (fails it once the
        log failed). ``Log.append_async`` inlines the common case; keep the two alike."""
        if self._failure is not None:
            future.set_exception(self._failure)
            return
        # A durable change or a failure after the checks above signals the eventfd after
        # publishing, so `_on_readable` runs later and sees this future: no lost wake-up.
        if ticket >= self._fifo_last:
            self._fifo.append((ticket, future, result))
            self._fifo_last = ticket
        else:
            heapq.heappush(self._out_of_order, (ticket, next(self._counter), future, result))

    def _on_readable(self) -> None:
        self._native.drain_notifications()
        durable = self._native.durable_ticket()
        # Tasks waiting on the futures made durable now, resumed below in ticket order.
        waking: list[tuple[asyncio.Future[Any], _Callbacks]] = []
        fifo = self._fifo
        while fifo and fifo[0][0] <= durable:
            _, future, result = fifo.popleft()
            if not future.done():
                _resolve(future, result, waking)
        heap = self._out_of_order
        while heap and heap[0][0] <= durable:
            _, _, future, result = heapq.heappop(heap)
            if not future.done():
                _resolve(future, result, waking)
        if waking:
            self._resume(waking)
        if self._failure is None:
            self._failure = self._native.failure()
        if self._failure is not None:
            self._fail_pending()

    def _resume(self, waking: list[tuple[asyncio.Future[Any], _Callbacks]]) -> None:
        """Runs the done callbacks taken from durable futures: a task's wake-up at once,
        anything else through ``call_soon`` as asyncio would.

        A future's ``set_result`` schedules each callback with ``call_soon``, so every
        awaiting task costs a ``Handle`` and a turn of ``_run_once`` (Python code in 3.11)
        before it runs, the largest part of the event loop's time per append with 64
        writers. Resumed here, the tasks of a group commit run back to back in this
        callback: with 64 writers, 26 % more records per second and p99 a fifth lower
        (docs/wal-format.md, session 13). Only outside any task (this is a reader callback,
        so always in practice): a wake-up runs the task's next step, which asyncio does not
        allow inside another task's."""
        loop = self.loop
        direct = asyncio.current_task(loop) is None
        pending = [(c, ctx, future) for future, callbacks in waking for c, ctx in callbacks]
        for at, (callback, context, future) in enumerate(pending):
            if not (direct and isinstance(getattr(callback, "__self__", None), asyncio.Task)):
                loop.call_soon(callback, future, context=context)
                continue
            try:
                context.run(callback, future)
            except (SystemExit, KeyboardInterrupt):
                # The rest still get their wake-ups, or their tasks would wait forever.
                for later, later_context, later_future in pending[at + 1 :]:
                    loop.call_soon(later, later_future, context=later_context)
                raise
            except BaseException as exc:  # reported as asyncio's Handle reports it
                loop.call_exception_handler(
                    {
                        "message": "Exception resuming a task after a WAL append",
                        "exception": exc,
                        "future": future,
                    }
                )

    def _take_pending(self) -> list[asyncio.Future[Any]]:
        futures = [future for _, future, _ in self._fifo]
        futures += [future for _, _, future, _ in self._out_of_order]
        self._fifo.clear()
        self._out_of_order.clear()
        return futures

    def _fail_pending(self) -> None:
        failure = self._failure or IllegalStateError("the log failed")
        for future in self._take_pending():
            if not future.done():
                future.set_exception(failure)

    def close(self) -> None:
        if not self.loop.is_closed():
            self.loop.remove_reader(self._fd)
        for future in self._take_pending():
            if not future.done() and not future.get_loop().is_closed():
                future.set_exception(IllegalStateError("the log was closed"))


class Log:
    """The write-ahead log of one tablet.

    Appends reserve their place and return at once (blocking only while the bounded queue is
    full); durability is awaited per ticket: ``wait`` from threads, ``append_async`` /
    ``wait_async`` from asyncio. All disk work runs in Rust with the GIL released.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        tablet_id: str,
        options: LogOptions | None = None,
    ) -> None:
        opts = options or LogOptions()
        self._native = _native.Log(
            os.fspath(directory),
            tablet_id,
            segment_size_bytes=opts.segment_size_bytes,
            sync=opts.sync,
            syncs_in_flight_max=opts.syncs_in_flight_max,
            queue_bytes_max=opts.queue_bytes_max,
            min_segments_to_retain=opts.min_segments_to_retain,
            preallocation=opts.preallocation,
            recycle_pool_segments_max=opts.recycle_pool_segments_max,
        )
        self._watcher: _DurabilityWatcher | None = None

    # --- appending ----------------------------------------------------------------------

    def append(self, entries: Iterable[EntryLike]) -> AppendTicket:
        """Queues contiguous entries that continue the log; does not wait for the disk."""
        return AppendTicket(*self._native.append(entries))

    def append_durable(self, entries: Iterable[EntryLike]) -> int:
        """Appends and blocks until durable; returns the last index."""
        ticket = self.append(entries)
        self.wait(ticket.ticket)
        return ticket.last_index

    def append_async(self, entries: Iterable[EntryLike]) -> asyncio.Future[int]:
        """Appends and returns a future of the running loop that resolves to the last index
        once the entries are durable (or fails with the log's error). Call it from a
        coroutine and await the result; append errors are raised by the call itself.

        A method that returns a future rather than a coroutine: an awaiting writer then
        blocks on the future directly, without a coroutine object and its frame per append
        (3–4 % of an event loop's CPU per append with 64 writers, docs/wal-format.md)."""
        # `wait_async`'s watcher lookup and the watcher's `enqueue` inlined for the usual case
        # (no failure, tickets in order): this runs once per append, and each Python call it
        # saves was about 3 % of an event loop's time with 64 writers. No need to ask whether
        # the ticket is durable already: its publication (and the eventfd signal after it)
        # comes later. The loop is found first, so a call outside one appends nothing.
        watcher = self._watcher
        if watcher is None or watcher.thread != _get_ident() or not watcher.loop.is_running():
            watcher = self._watcher_for_running_loop()
        ticket, last_index = self._native.append(entries)
        future: asyncio.Future[int] = watcher.new_future()
        if watcher._failure is None and ticket >= watcher._fifo_last:
            watcher._fifo.append((ticket, future, last_index))
            watcher._fifo_last = ticket
        else:
            watcher.enqueue(ticket, future, last_index)
        return future

    def truncate_after(self, last_kept: int) -> int:
        """Discards entries after ``last_kept`` (ordered after queued appends); a ticket."""
        return self._native.truncate_after(last_kept)

    def truncate_and_append(self, last_kept: int, entries: Iterable[EntryLike]) -> AppendTicket:
        """Truncates after ``last_kept`` and appends ``entries`` with nothing in between."""
        return AppendTicket(*self._native.truncate_and_append(last_kept, entries))

    # --- durability ---------------------------------------------------------------------

    def wait(self, ticket: int, timeout_s: float | None = None) -> bool:
        """Blocks until ``ticket`` is durable; ``False`` if ``timeout_s`` passed first.
        Raises the log's error (e.g. ``DiskFullError``) if a sync failed before it."""
        return self._native.wait(ticket, timeout_s)

    def wait_async(self, ticket: int) -> asyncio.Future[None]:
        """A future on the running loop that completes when ``ticket`` is durable."""
        watcher = self._watcher
        # While the watcher's loop runs in this thread it is the running loop (a thread runs
        # one loop at a time). Checking that is cheaper than asyncio.get_running_loop(),
        # which makes a getpid() system call per call on Python 3.11 (every append).
        if watcher is None or watcher.thread != _get_ident() or not watcher.loop.is_running():
            watcher = self._watcher_for_running_loop()
        return watcher.wait(ticket)

    def _watcher_for_running_loop(self) -> _DurabilityWatcher:
        loop = asyncio.get_running_loop()
        watcher = self._watcher
        if watcher is not None and watcher.loop is loop:
            # The same loop, now run by another thread.
            watcher.thread = _get_ident()
            return watcher
        if watcher is not None:
            watcher.close()
        watcher = self._watcher = _DurabilityWatcher(self._native, loop)
        return watcher

    @property
    def durable_ticket(self) -> int:
        return self._native.durable_ticket()

    @property
    def durable_index(self) -> int:
        """Index of the last durable entry (what a follower reports)."""
        return self._native.durable_index()

    @property
    def last_op_id(self) -> tuple[int, int]:
        """``(term, index)`` of the last appended entry, durable or not."""
        return self._native.last_op_id()

    @property
    def first_index(self) -> int:
        """The first index still in the log (earlier ones were garbage-collected)."""
        return self._native.first_index()

    def term_at(self, index: int) -> int | None:
        """The term of ``index`` (0 for index 0); ``None`` if the log does not hold it."""
        return self._native.term_at(index)

    # --- reading ------------------------------------------------------------------------

    def read(self, from_index: int, to_index: int, max_bytes: int = 1 << 20) -> list[Entry]:
        """Written entries ``from_index..=to_index`` up to ``max_bytes`` (at least one)."""
        return [
            Entry(term, index, EntryKind(kind), payload)
            for term, index, kind, payload in self._native.read(from_index, to_index, max_bytes)
        ]

    def entries(self, from_index: int | None = None, chunk_bytes: int = 4 << 20) -> Iterator[Entry]:
        """Every written entry from ``from_index`` (default: the first retained) on."""
        next_index = self.first_index if from_index is None else from_index
        while True:
            chunk = self.read(next_index, 2**63, chunk_bytes)
            if not chunk:
                return
            yield from chunk
            next_index = chunk[-1].index + 1

    # --- anchors and GC -----------------------------------------------------------------

    def register_anchor(self, index: int) -> int:
        """Keeps entries at or after ``index`` until released; returns the anchor id."""
        return self._native.register_anchor(index)

    def update_anchor(self, anchor: int, index: int) -> None:
        self._native.update_anchor(anchor, index)

    def release_anchor(self, anchor: int) -> None:
        self._native.release_anchor(anchor)

    def gc(self) -> GcReport:
        """Removes whole closed segments below the lowest anchor and the durable index."""
        return GcReport(*self._native.gc())

    # --- observation and life cycle -----------------------------------------------------

    def counters(self) -> WalCounters:
        return WalCounters.from_dict(self._native.metrics())

    def segment_paths(self) -> list[str]:
        return [os.fspath(p) for p in self._native.segment_paths()]

    def failure(self) -> BaseException | None:
        """The error the log failed with (it then refuses appends), or ``None``."""
        return self._native.failure()

    def close(self) -> None:
        """Writes what is queued, closes the active segment and stops the log's threads."""
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        self._native.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- fault injection (tests and chaos runs only) ------------------------------------

    def inject_sync_failures(self, count: int, errno: int) -> None:
        """FAULT INJECTION, not for production: the next ``count`` syncs fail with ``errno``."""
        self._native._inject_sync_failures(count, errno)

    def inject_fallocate_unsupported(self, unsupported: bool = True) -> None:
        """FAULT INJECTION, not for production: preallocate as if ``fallocate`` failed."""
        self._native._inject_fallocate_unsupported(unsupported)

    def inject_sync_delays(self, count: int, delay_s: float) -> None:
        """FAULT INJECTION, not for production: the next ``count`` syncs first sleep
        ``delay_s`` (a slow device; benchmarks use it to take another process's disk
        traffic out of a CPU-side comparison)."""
        self._native._inject_sync_delays(count, delay_s)
