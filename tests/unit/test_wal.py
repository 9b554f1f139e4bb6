"""The write-ahead log through the binding: append, await, read, reopen, errors, counters."""

from __future__ import annotations

import asyncio
import contextvars
import errno
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from nyala import _native, errors
from nyala.consensus.types import EntryKind
from nyala.testing.wal import Entry, Log, LogOptions

SMALL = LogOptions(segment_size_bytes=64 << 10)


def make_entries(term: int, first: int, last: int) -> list[Entry]:
    return [
        Entry(term, i, EntryKind.WRITE, f"payload-{i}".encode() * (i % 5 + 1))
        for i in range(first, last + 1)
    ]


def test_append_wait_read_and_reopen(tmp_path: Path) -> None:
    written = make_entries(1, 1, 20)
    with Log(tmp_path, "tablet-1", SMALL) as log:
        ticket = log.append(written[:10])
        assert ticket.last_index == 10
        assert log.wait(ticket.ticket)
        assert log.append_durable(written[10:]) == 20
        assert log.durable_index == 20
        assert log.last_op_id == (1, 20)
        assert log.term_at(20) == 1
        assert log.term_at(21) is None
        assert log.read(5, 7) == written[4:7]
        noop = Entry(2, 21, EntryKind.NO_OP, b"")
        log.append_durable([noop])
    with Log(tmp_path, "tablet-1", SMALL) as log:
        assert list(log.entries()) == [*written, noop]
        assert log.last_op_id == (2, 21)


def test_buffers_of_every_kind_are_accepted(tmp_path: Path) -> None:
    mutable = bytearray(b"mutable")
    with Log(tmp_path, "t", SMALL) as log:
        log.append_durable(
            [
                (1, 1, 1, b"bytes"),
                (1, 2, 1, mutable),
                (1, 3, 3, memoryview(b"view")),
            ]
        )
        mutable[:] = b"changed"  # the log copied it before releasing the GIL
        payloads = [e.payload for e in log.read(1, 3)]
        assert payloads == [b"bytes", b"mutable", b"view"]
        assert log.read(3, 3)[0].entry_type is EntryKind.CONFIG_CHANGE


def test_typed_errors(tmp_path: Path) -> None:
    with Log(tmp_path, "t", SMALL) as log:
        log.append_durable(make_entries(2, 1, 3))
        with pytest.raises(errors.InvalidArgumentError, match="expected index 4"):
            log.append(make_entries(2, 6, 6))
        with pytest.raises(errors.InvalidArgumentError, match="term"):
            log.append(make_entries(1, 4, 4))
        with pytest.raises(errors.InvalidArgumentError, match="entry type"):
            log.append([(2, 4, 99, b"")])
        with pytest.raises(errors.InvalidArgumentError):
            Log(tmp_path / "other", "t", LogOptions(sync="sometimes"))  # type: ignore[arg-type]
    with pytest.raises(errors.IllegalStateError):
        log.append(make_entries(2, 4, 4))


def test_truncation_for_a_conflicting_suffix(tmp_path: Path) -> None:
    with Log(tmp_path, "t", SMALL) as log:
        log.append_durable(make_entries(1, 1, 10))
        replacement = make_entries(2, 6, 8)
        ticket = log.truncate_and_append(5, replacement)
        log.wait(ticket.ticket)
        assert log.last_op_id == (2, 8)
        assert log.durable_index == 8
        assert [e.term for e in log.entries()] == [1] * 5 + [2] * 3
        log.wait(log.truncate_after(6))
        assert log.last_op_id == (2, 6)
    with Log(tmp_path, "t", SMALL) as log:
        assert [e.index for e in log.entries()] == [1, 2, 3, 4, 5, 6]


def test_corruption_in_a_closed_segment_is_reported(tmp_path: Path) -> None:
    with Log(tmp_path, "t", LogOptions(segment_size_bytes=8 << 10)) as log:
        for i in range(1, 200):
            log.append_durable(make_entries(1, i, i))
        first = Path(log.segment_paths()[0])
    data = bytearray(first.read_bytes())
    data[300] ^= 0xFF
    first.write_bytes(bytes(data))
    with pytest.raises(errors.CorruptionError, match=first.name):
        Log(tmp_path, "t", LogOptions(segment_size_bytes=8 << 10))
    assert first.read_bytes() == bytes(data), "nothing was repaired or deleted"


def test_anchors_and_gc(tmp_path: Path) -> None:
    opts = LogOptions(segment_size_bytes=8 << 10, min_segments_to_retain=1)
    with Log(tmp_path, "t", opts) as log:
        anchor = log.register_anchor(1)
        for i in range(1, 301):
            log.append_durable(make_entries(1, i, i))
        first = log.gc()
        assert first.segments_deleted + first.segments_recycled == 0
        log.update_anchor(anchor, 250)
        # Finished segments are closed by the background thread; give it a moment if it lags.
        deleted = 0
        for _ in range(200):
            report = log.gc()
            deleted += report.segments_deleted + report.segments_recycled
            if deleted:
                break
            time.sleep(0.01)
        assert deleted > 0
        assert 1 < log.first_index <= 250
        with pytest.raises(errors.NotFoundError):
            log.read(1, 2)
        log.release_anchor(anchor)
        with pytest.raises(errors.InvalidArgumentError):
            log.release_anchor(anchor)


def test_many_concurrent_asyncio_appenders(tmp_path: Path) -> None:
    writers = 500

    async def main(log: Log) -> list[int]:
        next_index = 1

        async def writer(w: int) -> int:
            nonlocal next_index
            # Index assignment and append happen without an await in between, so the
            # event loop keeps them contiguous (as the leader's lock would).
            index = next_index
            next_index += 1
            return await log.append_async([Entry(1, index, EntryKind.WRITE, b"w%d" % w)])

        return await asyncio.gather(*(writer(w) for w in range(writers)))

    with Log(tmp_path, "t", SMALL) as log:
        indexes = asyncio.run(main(log))
        assert sorted(indexes) == list(range(1, writers + 1))
        assert log.durable_index == writers
        counters = log.counters()
        assert counters.entries_appended == writers
        assert counters.syncs < writers, "group commit shared syncs between appenders"
        assert counters.group_entries_max > 1

        # A second event loop gets its own watcher.
        async def one_more() -> int:
            return await log.append_async(make_entries(1, writers + 1, writers + 1))

        assert asyncio.run(one_more()) == 501


class _CountingLoop(asyncio.SelectorEventLoop):
    """Counts the task wake-ups scheduled with ``call_soon``."""

    wakeups_scheduled = 0

    def call_soon(
        self,
        callback: Callable[..., object],
        *args: object,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        if "wakeup" in getattr(callback, "__name__", ""):
            _CountingLoop.wakeups_scheduled += 1
        return super().call_soon(callback, *args, context=context)


def test_durable_appends_resume_their_tasks_directly_in_order_and_context(
    tmp_path: Path,
) -> None:
    """The watcher resumes the tasks awaiting durable appends itself, in ticket order and
    each in its own context, instead of scheduling a wake-up per task; other done callbacks
    still run as asyncio runs them."""
    writers, rounds = 32, 20
    current_writer: contextvars.ContextVar[int] = contextvars.ContextVar("current_writer")

    async def main(log: Log) -> tuple[list[int], list[int]]:
        next_index = 1
        resumed: list[int] = []
        called_back: list[int] = []

        async def writer(w: int) -> None:
            nonlocal next_index
            current_writer.set(w)
            for _ in range(rounds):
                index = next_index
                next_index += 1
                future = log.append_async([Entry(1, index, EntryKind.WRITE, b"x")])
                if w == 0:
                    future.add_done_callback(lambda f: called_back.append(f.result()))
                assert await future == index
                assert current_writer.get() == w, "resumed in its own context"
                resumed.append(index)

        await asyncio.gather(*(writer(w) for w in range(writers)))
        await asyncio.sleep(0)
        return resumed, called_back

    _CountingLoop.wakeups_scheduled = 0
    with Log(tmp_path, "t", SMALL) as log, asyncio.Runner(loop_factory=_CountingLoop) as runner:
        resumed, called_back = runner.run(main(log))
    appends = writers * rounds
    assert sorted(resumed) == list(range(1, appends + 1))
    # Within one wake-up, tasks resume in ticket order; across wake-ups too.
    assert resumed == sorted(resumed)
    assert len(called_back) == rounds, "a plain done callback still runs"
    # The gather and the first step of each task are scheduled as usual; the wake-ups after
    # durable appends are not (with `set_result` there would be one per append).
    assert _CountingLoop.wakeups_scheduled < appends // 4


def test_append_async_outside_an_event_loop_appends_nothing(tmp_path: Path) -> None:
    with Log(tmp_path, "t", SMALL) as log:
        with pytest.raises(RuntimeError):
            log.append_async(make_entries(1, 1, 1))
        assert log.last_op_id == (0, 0)
        # The log takes the same entries afterwards: nothing half-done was left behind.
        assert log.append_durable(make_entries(1, 1, 1)) == 1


def test_threads_and_asyncio_together(tmp_path: Path) -> None:
    lock = threading.Lock()
    state = {"next": 1}

    def append_one(log: Log) -> int:
        with lock:
            index = state["next"]
            state["next"] += 1
            ticket = log.append([Entry(1, index, EntryKind.WRITE, b"x")])
        log.wait(ticket.ticket)
        return index

    async def main(log: Log) -> None:
        async def via_loop() -> None:
            with lock:
                index = state["next"]
                state["next"] += 1
                ticket = log.append([Entry(1, index, EntryKind.WRITE, b"y")])
            await log.wait_async(ticket.ticket)

        threads = [
            threading.Thread(target=lambda: [append_one(log) for _ in range(50)]) for _ in range(4)
        ]
        for t in threads:
            t.start()
        await asyncio.gather(*(via_loop() for _ in range(200)))
        for t in threads:
            t.join()

    with Log(tmp_path, "t", SMALL) as log:
        asyncio.run(main(log))
        assert log.durable_index == 400
        assert [e.index for e in log.entries()] == list(range(1, 401))


def test_sync_failure_fails_waiters_with_disk_full(tmp_path: Path) -> None:
    async def main(log: Log) -> None:
        log.append_durable(make_entries(1, 1, 2))
        log.inject_sync_failures(1, errno.ENOSPC)
        with pytest.raises(errors.DiskFullError):
            await log.append_async(make_entries(1, 3, 3))
        assert log.durable_index == 2
        with pytest.raises(errors.DiskFullError):
            log.append(make_entries(1, 4, 4))
        assert isinstance(log.failure(), errors.DiskFullError)

    log = Log(tmp_path, "t", SMALL)
    asyncio.run(main(log))
    with pytest.raises(errors.DiskFullError):
        log.close()


def test_delayed_syncs_delay_durability(tmp_path: Path) -> None:
    with Log(tmp_path, "t", SMALL) as log:
        log.append_durable(make_entries(1, 1, 1))
        log.inject_sync_delays(1, 0.3)
        ticket = log.append(make_entries(1, 2, 2)).ticket
        assert not log.wait(ticket, timeout_s=0.05)
        assert log.wait(ticket, timeout_s=10)
        assert log.durable_index == 2


def test_fallocate_fallback(tmp_path: Path) -> None:
    with Log(tmp_path, "t", LogOptions(segment_size_bytes=8 << 10)) as log:
        log.inject_fallocate_unsupported()
        for i in range(1, 200):
            log.append_durable(make_entries(1, i, i))
        assert log.counters().fallocate_fallbacks > 0
        assert [e.index for e in log.entries()] == list(range(1, 200))


def test_counters_are_typed(tmp_path: Path) -> None:
    with Log(tmp_path, "t", SMALL) as log:
        log.append_durable(make_entries(1, 1, 5))
        c = log.counters()
        assert c.entries_appended == 5
        assert c.batches_appended == 1
        assert c.syncs >= 1
        assert c.bytes_written >= 4096
        assert sum(c.sync_micros_histogram) == c.syncs
        assert sum(c.group_entries_histogram) == c.groups


def test_waits_after_a_failure_fail_at_once(tmp_path: Path) -> None:
    async def main(log: Log) -> None:
        await log.append_async(make_entries(1, 1, 1))
        log.inject_sync_failures(1, errno.EIO)
        ticket = log.append(make_entries(1, 2, 2)).ticket
        with pytest.raises(errors.DiskError):
            await asyncio.wait_for(log.wait_async(ticket), 10)
        # The watcher has seen the failure: a later wait fails at once instead of waiting
        # for an eventfd wake-up that will never come.
        with pytest.raises(errors.DiskError):
            await asyncio.wait_for(log.wait_async(ticket), 10)
        assert log.durable_index == 1

    log = Log(tmp_path, "t", SMALL)
    asyncio.run(main(log))
    with pytest.raises(errors.DiskError):
        log.close()


@pytest.mark.parametrize("syncs_in_flight_max", [1, 3])
def test_syncs_in_flight_setting(tmp_path: Path, syncs_in_flight_max: int) -> None:
    writers = 200

    async def main(log: Log) -> None:
        next_index = 1

        async def writer() -> None:
            nonlocal next_index
            for _ in range(5):
                index = next_index
                next_index += 1
                await log.append_async([Entry(1, index, EntryKind.WRITE, b"x" * 50)])

        await asyncio.gather(*(writer() for _ in range(writers)))

    options = LogOptions(segment_size_bytes=16 << 10, syncs_in_flight_max=syncs_in_flight_max)
    with Log(tmp_path, "t", options) as log:
        asyncio.run(main(log))
        assert log.durable_index == writers * 5
        counters = log.counters()
        assert 1 <= counters.sync_threads <= syncs_in_flight_max
        assert counters.syncs >= counters.groups
        assert [e.index for e in log.entries()] == list(range(1, writers * 5 + 1))


def test_syncs_in_flight_max_is_validated(tmp_path: Path) -> None:
    with pytest.raises(errors.InvalidArgumentError):
        Log(tmp_path, "t", LogOptions(syncs_in_flight_max=0))


def _process_threads() -> int:
    return len(list(Path("/proc/self/task").iterdir()))


def test_many_logs_share_the_native_worker_pools(tmp_path: Path) -> None:
    """Logs start no thread of their own: 300 logs, each with an entry durable, add at most
    the pools' bounds to the process, and each holds its small first preallocation."""
    stats = _native.thread_pool_stats()
    bound = stats["wal_commit_threads_max"] + stats["wal_background_threads_max"]
    before = _process_threads()
    logs = [Log(tmp_path / f"t{i}", f"t{i}") for i in range(300)]
    try:
        assert _process_threads() <= before
        tickets = [log.append(make_entries(1, 1, 1)) for log in logs]
        for log, ticket in zip(logs, tickets, strict=True):
            assert log.wait(ticket.ticket)
        assert _process_threads() <= before + bound
        assert _native.thread_pool_stats()["wal_commit_threads"] <= stats["wal_commit_threads_max"]
        disk = sum(p.stat().st_blocks * 512 for p in tmp_path.rglob("wal-*"))
        assert disk <= 300 * (64 + 4) * 1024, disk
    finally:
        for log in logs:
            log.close()


def test_thread_pool_bounds_are_validated_and_applied() -> None:
    before = _native.thread_pool_stats()
    with pytest.raises(errors.InvalidArgumentError):
        _native.configure_thread_pools(wal_commit_threads_max=0)
    with pytest.raises(errors.InvalidArgumentError):
        _native.configure_thread_pools(storage_flush_threads_max=0)
    bounds = [key for key in before if key.endswith("_threads_max")]
    refused = _native.thread_pool_stats()
    assert [refused[k] for k in bounds] == [before[k] for k in bounds], "nothing changed"
    _native.configure_thread_pools(wal_commit_threads_max=3, storage_flush_threads_max=2)
    try:
        after = _native.thread_pool_stats()
        assert (after["wal_commit_threads_max"], after["storage_flush_threads_max"]) == (3, 2)
        assert after["wal_background_threads_max"] == before["wal_background_threads_max"]
    finally:
        _native.configure_thread_pools(
            wal_commit_threads_max=before["wal_commit_threads_max"],
            storage_flush_threads_max=before["storage_flush_threads_max"],
        )
