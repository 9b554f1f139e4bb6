"""``WalLog`` (the Rust replicated log over a real WAL) through the ``RaftLog`` conformance
suite, plus its wire batches and the event-loop durability path."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import select
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from log_conformance import BIG_BYTES, RaftLogConformance

from nyala.consensus.log import RaftLog
from nyala.consensus.memory_log import MemoryLog
from nyala.consensus.runtime.wal_log import (
    DurabilitySignals,
    WalEntryBatch,
    WalLog,
    WalLogOptions,
)
from nyala.consensus.types import MIN_OP_ID, EntryKind, OpId
from nyala.errors import CorruptionError, InvalidArgumentError

TABLET_ID = "0" * 32


class TestWalLog(RaftLogConformance):
    """The conformance suite over real WALs (fdatasync on) in a temporary directory."""

    syncs_in_background = True  # the group-commit thread syncs whatever was appended

    @pytest.fixture(autouse=True)
    def _directory(self, tmp_path: Path) -> Iterator[None]:
        self._tmp = tmp_path
        self._names = itertools.count()
        self._open: list[WalLog] = []
        yield
        for log in self._open:
            log.close()

    def _open_log(self, directory: Path) -> WalLog:
        log = WalLog(directory, TABLET_ID, WalLogOptions(segment_size_bytes=1 << 20))
        self._open.append(log)
        return log

    def new_log(self) -> RaftLog:
        return self._open_log(self._tmp / f"wal-{next(self._names)}")

    def make_durable(self, log: RaftLog) -> None:
        assert isinstance(log, WalLog)
        assert log.wait_durable(timeout_s=30)

    def reopen(self, log: RaftLog) -> RaftLog:
        assert isinstance(log, WalLog)
        log.close()
        self._open.remove(log)
        return self._open_log(log.directory)


@pytest.fixture
def log(tmp_path: Path) -> Iterator[WalLog]:
    with WalLog(tmp_path / "wal", TABLET_ID, WalLogOptions(sync="none")) as log:
        yield log


def test_batches_cross_the_wire_as_bytes(log: WalLog, tmp_path: Path) -> None:
    log.append(1, EntryKind.NO_OP, b"")
    log.append(1, EntryKind.WRITE, b"row data" * 100)
    log.append(2, EntryKind.CONFIG_CHANGE, b"config")
    batch = log.read_batch(0, BIG_BYTES)
    assert batch is not None
    wire = batch.to_wire()
    assert len(wire) == batch.size_bytes
    received = WalEntryBatch.from_wire(
        wire, entry_count=3, first_op_id=OpId(1, 1), last_op_id=OpId(2, 3)
    )
    assert received.control_entries() == [
        (OpId(1, 1), EntryKind.NO_OP, b""),
        (OpId(2, 3), EntryKind.CONFIG_CHANGE, b"config"),
    ]
    with WalLog(tmp_path / "follower", TABLET_ID, WalLogOptions(sync="none")) as follower:
        result = follower.append_replicated(MIN_OP_ID, received, 0)
        assert result.matched
        again = follower.read_batch(0, BIG_BYTES)
        assert again is not None
        assert again.to_wire() == wire


def test_received_batch_must_agree_with_the_message(log: WalLog) -> None:
    log.append(1, EntryKind.WRITE, b"x")
    log.append(1, EntryKind.WRITE, b"y")
    batch = log.read_batch(0, BIG_BYTES)
    assert batch is not None
    wire = batch.to_wire()
    with pytest.raises(InvalidArgumentError, match="holds 2"):
        WalEntryBatch.from_wire(wire, entry_count=3)
    with pytest.raises(InvalidArgumentError, match="starts at"):
        WalEntryBatch.from_wire(wire, first_op_id=OpId(1, 2))
    with pytest.raises(InvalidArgumentError, match="ends at"):
        WalEntryBatch.from_wire(wire, last_op_id=OpId(2, 2))


def test_damaged_or_malformed_wire_bytes_raise_typed_errors(log: WalLog) -> None:
    log.append(1, EntryKind.WRITE, b"payload")
    batch = log.read_batch(0, BIG_BYTES)
    assert batch is not None
    wire = bytearray(batch.to_wire())
    wire[-1] ^= 0x01
    with pytest.raises(CorruptionError, match="checksum"):
        WalEntryBatch.from_wire(bytes(wire))
    with pytest.raises(InvalidArgumentError, match="cut short"):
        WalEntryBatch.from_wire(batch.to_wire()[:-1])
    with pytest.raises(InvalidArgumentError, match="magic"):
        WalEntryBatch.from_wire(b"x" * 64)


def test_a_memory_batch_is_refused(log: WalLog) -> None:
    memory = MemoryLog()
    memory.append(1, EntryKind.WRITE, b"x")
    with pytest.raises(InvalidArgumentError, match="MemoryEntryBatch"):
        log.append_replicated(MIN_OP_ID, memory.read_batch(0, BIG_BYTES), 0)


def test_negative_indexes_from_python(log: WalLog) -> None:
    log.append(1, EntryKind.CONFIG_CHANGE, b"c")
    assert log.term_at(-1) is None
    assert log.config_entries_after(-1) == [(OpId(1, 1), b"c")]
    with pytest.raises(InvalidArgumentError):
        log.read_batch(-1, BIG_BYTES)


def test_cache_is_bounded_and_reads_fall_back_to_the_wal(tmp_path: Path) -> None:
    options = WalLogOptions(sync="none", cache_bytes_max=4096)
    with WalLog(tmp_path / "wal", TABLET_ID, options) as log:
        for i in range(200):
            log.append(1, EntryKind.WRITE, bytes([i % 256]) * 100)
            log.wait_durable()
        stats = log.cache_stats()
        assert stats.bytes <= 4096
        assert stats.first_index > 1
        batch = log.read_batch(0, BIG_BYTES)
        assert batch is not None
        assert (batch.first_op_id, batch.last_op_id) == (OpId(1, 1), OpId(1, 200))


def test_eviction_through_an_index_frees_the_cache_and_reads_fall_back_to_the_wal(
    log: WalLog,
) -> None:
    for i in range(1, 11):
        log.append(1, EntryKind.WRITE, bytes([i]) * 1000)
    log.wait_durable()
    assert log.cache_stats().first_index == 1
    log.evict_through(6)
    stats = log.cache_stats()
    assert stats.first_index == 7
    assert stats.entries == 4
    batch = log.read_batch(0, BIG_BYTES)  # 1..6 from the WAL, 7..10 from the cache
    assert batch is not None
    assert (batch.first_op_id, batch.last_op_id) == (OpId(1, 1), OpId(1, 10))
    log.evict_through(100)
    assert log.cache_stats().first_index == 10  # the last entry always stays


def test_whole_cached_batches_are_shared_and_views_need_no_copy(log: WalLog) -> None:
    log.append(1, EntryKind.WRITE, b"a" * 3000)
    log.append(1, EntryKind.WRITE, b"b" * 10)
    whole = log.read_whole_batch(0, 2)
    assert whole is not None
    assert (whole.first_op_id, whole.last_op_id) == (OpId(1, 1), OpId(1, 1))
    assert log.read_whole_batch(0, 0) is None  # ends after the last index asked for
    view = whole.wire_view()
    assert view.readonly
    assert bytes(view) == whole.to_wire()
    log.append(1, EntryKind.WRITE, b"c" * 10)
    log.wait_durable()
    log.evict_through(1)
    assert log.read_whole_batch(0, 3) is None  # evicted: read_batch gets it from the WAL


def test_a_caught_up_follower_is_sent_the_appended_batch_itself(log: WalLog) -> None:
    """What ``append_many`` appended is one cached batch, and a read of exactly it shares it
    (the leader's replication path makes no copy); a read of more, or of less, builds one."""

    def address(batch: WalEntryBatch | None) -> int:
        assert batch is not None
        return int(np.frombuffer(batch.wire_view(), dtype=np.uint8).ctypes.data)

    log.append(1, EntryKind.WRITE, b"first")
    log.append_many(1, EntryKind.WRITE, [b"a" * 100, b"b" * 100, b"c" * 100], BIG_BYTES)
    whole = log.read_whole_batch(1, 4)
    assert whole is not None
    assert (whole.first_op_id, whole.last_op_id) == (OpId(1, 2), OpId(1, 4))
    assert address(log.read_batch(1, BIG_BYTES)) == address(whole)
    assert address(log.read_batch(0, BIG_BYTES)) != address(whole)  # two batches: built
    capped = log.read_batch(1, whole.size_bytes - 1)  # too large for the limit: built
    assert capped is not None
    assert capped.last_op_id.index < 4
    assert address(capped) != address(whole)
    assert address(log.read_batch(1, BIG_BYTES, last_index=3)) != address(whole)
    # Proposals larger than one AppendEntries are cut where reads with that limit cut.
    limit = whole.size_bytes
    log.append_many(1, EntryKind.WRITE, [b"d" * 100] * 7, limit)
    for after in (4, 7, 10):
        assert address(log.read_batch(after, limit)) == address(log.read_whole_batch(after, 11))


def test_a_request_serialized_with_its_entries_equals_the_protobuf_message(log: WalLog) -> None:
    from nyala._proto import consensus_pb2
    from nyala.consensus.messages import AppendRequest
    from nyala.consensus.runtime import wire

    log.append(1, EntryKind.WRITE, b"row data" * 1000)
    log.append(1, EntryKind.NO_OP, b"")
    batch = log.read_batch(0, BIG_BYTES)
    for entries in (batch, None):
        request = AppendRequest("a", "b", 3, MIN_OP_ID, entries, 2, 0)
        parts = wire.append_request_parts(request, TABLET_ID, last_appended_index=2)
        serialized = wire.request_bytes(parts)
        assert wire.request_size(parts) == len(serialized)
        if entries is not None:  # the batch's own bytes, not a copy
            assert isinstance(parts, tuple)
            assert parts[1].obj is entries.native
        expected = wire.append_request_to_pb(request, TABLET_ID, last_appended_index=2)
        got = consensus_pb2.ConsensusRequestPB.FromString(serialized)
        got.ClearField("entries_alignment")  # zeros that only place the entries
        assert got == expected
        if entries is not None:
            for length in range(1, 17):  # every residue of the header's length
                placed = wire.request_bytes(wire.append_request_parts(request, "t" * length))
                assert placed.index(entries.to_wire()) % 8 == 0
        parsed = wire.append_request_from_pb(
            consensus_pb2.ConsensusRequestPB.FromString(serialized), WalEntryBatch.from_wire
        )
        received = wire.append_request_from_pb(
            wire.append_request_from_wire(serialized), WalEntryBatch.from_wire
        )
        assert received == dataclasses.replace(parsed, entries=received.entries)
        assert (received.entries is None) == (entries is None)
        if entries is not None:
            assert isinstance(received.entries, WalEntryBatch)
            assert received.entries.to_wire() == entries.to_wire()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    uuids=st.tuples(st.text(max_size=40), st.text(max_size=40), st.text(max_size=40)),
    numbers=st.lists(st.integers(0, 2**63 - 1), min_size=6, max_size=6),
    timestamps=st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)),
    quiesce=st.booleans(),
    payloads=st.lists(st.integers(0, 3000), max_size=4),
)
def test_a_native_request_head_is_the_message_protobuf_builds(
    tmp_path_factory: pytest.TempPathFactory,
    uuids: tuple[str, str, str],
    numbers: list[int],
    timestamps: tuple[int, int],
    quiesce: bool,
    payloads: list[int],
) -> None:
    """``append_request_parts`` (the head by the extension) gives, for any field values,
    with entries or without, the message protobuf builds from the same request, its
    entries starting at a multiple of 8 bytes."""
    from nyala._proto import consensus_pb2
    from nyala.consensus.messages import AppendRequest
    from nyala.consensus.runtime import wire

    dest, tablet_id, caller = uuids
    term, preceding_term, preceding_index, committed, last_appended, entry_term = numbers
    entries = None
    if payloads:
        wal = WalLog(tmp_path_factory.mktemp("wal"), TABLET_ID, WalLogOptions(sync="none"))
        with wal:
            for size in payloads:
                wal.append(entry_term % 1000 + 1, EntryKind.WRITE, b"p" * size)
            entries = wal.read_batch(0, BIG_BYTES)
    request = AppendRequest(
        caller,
        dest,
        term,
        OpId(preceding_term, preceding_index),
        entries,
        committed,
        0,
        quiesce,
    )
    parts = wire.append_request_parts(
        request, tablet_id, last_appended_index=last_appended, timestamps=timestamps
    )
    serialized = wire.request_bytes(parts)
    expected = wire.append_request_to_pb(request, tablet_id, last_appended_index=last_appended)
    expected.leader_timestamp, expected.safe_timestamp = timestamps
    got = consensus_pb2.ConsensusRequestPB.FromString(serialized)
    assert not got.entries_alignment.strip(b"\0")
    got.ClearField("entries_alignment")
    assert got == expected
    if entries is None:
        assert parts == expected.SerializeToString()
    else:
        assert isinstance(parts, tuple)
        assert len(parts[0]) % 8 == 0  # the batch's bytes follow the head
        assert parts[1].obj is entries.native


def test_received_requests_are_split_without_parsing_the_entries() -> None:
    from nyala import _native
    from nyala._proto import consensus_pb2

    pb = consensus_pb2.ConsensusRequestPB(tablet_id="t", caller_term=7, entries=b"E" * 300)
    data = pb.SerializeToString()
    header, entries_range = _native.split_proto_field(data, 9)
    assert entries_range is not None
    assert data[entries_range[0] : entries_range[1]] == b"E" * 300
    rest = consensus_pb2.ConsensusRequestPB.FromString(header)
    assert (rest.tablet_id, rest.caller_term, rest.entries) == ("t", 7, b"")
    assert _native.split_proto_field(header, 9)[1] is None
    for damaged, message in [
        (data[:-1], "runs past"),
        (data[:1] + b"\xff" * 11, "varint"),
        (b"\x0b", "wire type 3"),  # a group start
        (b"\x48\x01", "not length-delimited"),  # field 9 as a varint
    ]:
        with pytest.raises(InvalidArgumentError, match=message):
            _native.split_proto_field(damaged, 9)
    with pytest.raises(InvalidArgumentError, match="outside"):
        _native.EntryBatch.decode(data, 10, len(data) + 1)


@pytest.mark.parametrize("shared", [False, True], ids=["own-eventfd", "shared-signals"])
def test_watch_durability_reports_progress_from_the_event_loop(
    tmp_path: Path, shared: bool
) -> None:
    signals = DurabilitySignals() if shared else None

    async def scenario() -> list[int]:
        reported: list[int] = []
        done = asyncio.Event()
        with WalLog(tmp_path / "wal", TABLET_ID, signals=signals) as log:

            def on_signal() -> None:
                log.drain_notifications()
                index = log.durable_index()
                if not reported or reported[-1] != index:
                    reported.append(index)
                if index == 3:
                    done.set()

            stop = log.watch_durability(asyncio.get_running_loop(), on_signal)
            try:
                for _ in range(3):
                    log.append(1, EntryKind.WRITE, b"x")
                async with asyncio.timeout(30):
                    await done.wait()
            finally:
                stop()
        return reported

    reported = asyncio.run(scenario())
    assert reported[-1] == 3
    assert reported == sorted(reported)


def _eventfds() -> int:
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if _readlink(fd) == "anon_inode:[eventfd]")


def _readlink(path: Path) -> str:
    try:
        return str(path.readlink())
    except FileNotFoundError:
        return ""  # closed since the listing


def test_logs_sharing_durability_signals_are_each_told_of_their_own_progress(
    tmp_path: Path,
) -> None:
    """Forty logs on one eventfd: each watcher hears of its own log's appends (and only its
    log is drained by it); the process gains no eventfd per log; the reader is removed with
    the last watcher."""
    before = _eventfds()
    signals = DurabilitySignals()
    logs = [WalLog(tmp_path / f"wal-{i}", TABLET_ID, signals=signals) for i in range(40)]
    assert _eventfds() - before == 1

    async def scenario() -> dict[int, int]:
        loop = asyncio.get_running_loop()
        seen: dict[int, int] = {}
        all_done = asyncio.Event()

        def watcher(i: int, log: WalLog) -> Callable[[], None]:
            def on_signal() -> None:
                log.drain_notifications()
                if log.durable_index() > 0:  # each watcher is also called once at watch
                    seen[i] = log.durable_index()
                if len(seen) == 20 and all(v == i % 5 + 1 for i, v in seen.items()):
                    all_done.set()

            return on_signal

        stops = [log.watch_durability(loop, watcher(i, log)) for i, log in enumerate(logs)]
        for i, log in enumerate(logs[:20]):  # the second half stays idle
            for _ in range(i % 5 + 1):
                log.append(1, EntryKind.WRITE, b"row")
        async with asyncio.timeout(30):
            await all_done.wait()
        for stop in stops:
            stop()
        # No reader is left behind: a signal now reaches no one (and nothing raises).
        logs[0].append(1, EntryKind.WRITE, b"late")
        assert logs[0].wait_durable(timeout_s=30)
        await asyncio.sleep(0.05)
        return seen

    seen = asyncio.run(scenario())
    assert sorted(seen) == list(range(20)), "only the logs written to moved"
    assert all(seen[i] == i % 5 + 1 for i in range(20))
    for log in logs:
        log.close()


def test_a_log_that_signalled_unwatched_is_heard_once_watched(tmp_path: Path) -> None:
    """A token taken while nobody watched its log is dropped, and the log does not queue it
    again until drained: watching calls the watcher once, which drains it. A watcher that
    raises does not keep the others of the same wake-up from being called."""
    signals = DurabilitySignals()

    async def scenario() -> tuple[list[int], int]:
        loop = asyncio.get_running_loop()
        with (
            WalLog(tmp_path / "a", TABLET_ID, signals=signals) as a,
            WalLog(tmp_path / "b", TABLET_ID, signals=signals) as b,
        ):
            a.append(1, EntryKind.WRITE, b"before")
            assert a.wait_durable(timeout_s=30)
            # Waiters hear of durability before the shared descriptor does.
            assert select.select([signals.native.fileno()], [], [], 30)[0]
            assert signals.native.take_ready() == [1]  # a dispatch with no watcher
            seen: list[int] = []
            heard = asyncio.Event()
            b_calls = 0

            def on_a() -> None:
                a.drain_notifications()
                seen.append(a.durable_index())
                if a.durable_index() == 2:
                    heard.set()

            def on_b() -> None:
                nonlocal b_calls
                b.drain_notifications()
                b_calls += 1
                raise RuntimeError("a broken watcher")

            stops = [a.watch_durability(loop, on_a), b.watch_durability(loop, on_b)]
            await asyncio.sleep(0)  # the calls made at watch
            # Both signal before the loop looks: one wake-up takes b's token, then a's.
            b.append(1, EntryKind.WRITE, b"b")
            assert b.wait_durable(timeout_s=30)
            a.append(1, EntryKind.WRITE, b"after")
            assert a.wait_durable(timeout_s=30)
            async with asyncio.timeout(30):
                await heard.wait()
            for stop in stops:
                stop()
            return seen, b_calls

    seen, b_calls = asyncio.run(scenario())
    assert seen[0] == 1
    assert seen[-1] == 2
    assert b_calls >= 2


def _release_once_idle(log: WalLog) -> None:
    """Durability reaches waiters before the committer gives back its slot and before the
    next segment is prepared: a log just written becomes idle shortly after."""
    deadline = time.monotonic() + 10
    while not log.release_files():
        assert time.monotonic() < deadline, "an idle log never released its files"
        time.sleep(0.001)


def test_an_idle_log_releases_its_files_and_reopens_them_on_use(tmp_path: Path) -> None:
    directory = tmp_path / "wal"

    def open_files() -> int:
        return sum(
            1 for fd in Path("/proc/self/fd").iterdir() if _readlink(fd).startswith(str(directory))
        )

    with WalLog(directory, TABLET_ID, WalLogOptions(segment_size_bytes=64 << 10)) as log:
        for i in range(200):
            log.append(1, EntryKind.WRITE, bytes([i % 256]) * 1_000)
        assert log.wait_durable(timeout_s=30)
        assert open_files() >= 2  # several segments
        _release_once_idle(log)
        assert open_files() == 0
        log.evict_through(200)  # reads now go to the WAL, and open what they read
        batch = log.read_batch(0, BIG_BYTES)
        assert batch is not None
        assert batch.first_op_id == OpId(1, 1)
        assert open_files() > 0
        _release_once_idle(log)
        log.append(1, EntryKind.WRITE, b"after")  # appends open the active segment
        assert log.wait_durable(timeout_s=30)
        assert log.last_op_id() == OpId(1, 201)
    with WalLog(directory, TABLET_ID) as reopened:
        assert reopened.last_op_id() == OpId(1, 201)
        assert reopened.durable_index() == 201


def test_committed_entries_are_never_truncated(log: WalLog, tmp_path: Path) -> None:
    for term in (1, 1, 1):
        log.append(term, EntryKind.WRITE, b"x")
    with WalLog(tmp_path / "leader", TABLET_ID, WalLogOptions(sync="none")) as leader:
        for term in (1, 2, 2):
            leader.append(term, EntryKind.WRITE, b"y")
        batch = leader.read_batch(1, BIG_BYTES)
        with pytest.raises(CorruptionError, match="commit index"):
            log.append_replicated(OpId(1, 1), batch, 3)
    assert [log.term_at(i) for i in (1, 2, 3)] == [1, 1, 1]
