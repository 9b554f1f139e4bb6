"""``WalLog``: the ``RaftLog`` of a real replica, over the Rust replicated log.

This module owns the Python face of ``rust/consensus``: ``WalLog`` (the WAL plus its log
cache, implementing ``nyala.consensus.log.RaftLog``) and ``WalEntryBatch`` (an
``EntryBatch`` held as its wire encoding in native memory, docs/entry-batch.md). It does no
I/O itself and holds no Raft state: the core decides, the native log stores.

The follower's UpdateConsensus log step is one native call (``append_replicated``) with the
GIL released; row data stays in native memory, and only NO_OP and CONFIG_CHANGE entries
become Python objects, when asked for. Appends return before they are durable. The runtime
learns about durability from the WAL's eventfd: ``watch_durability`` calls it back from the
event loop, and it hands the new ``durable_index()`` to ``RaftCore.on_log_durable``. The
replicas of a server share one eventfd (``DurabilitySignals``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

from nyala import _native
from nyala.consensus.log import AppendResult, EntryBatch
from nyala.consensus.types import EntryKind, OpId
from nyala.errors import IllegalStateError, InvalidArgumentError

log = logging.getLogger(__name__)

__all__ = ["DurabilitySignals", "LogCacheStats", "WalEntryBatch", "WalLog", "WalLogOptions"]


@dataclass(frozen=True, slots=True)
class WalLogOptions:
    """Settings of a replica's log (defaults: DESIGN.md §8, Kudu's log cache limit)."""

    cache_bytes_max: int = 64 << 20  # recent entries kept in memory for building batches
    segment_size_bytes: int = 8 << 20
    sync: Literal["group", "none"] = "group"  # "none" only for tests and throwaway logs
    queue_bytes_max: int = 64 << 20  # WAL append queue bound (back-pressure)
    # Closed segments GC always keeps (the retention setting; tests lower it to force GC).
    min_segments_to_retain: int = 1


@dataclass(frozen=True, slots=True)
class LogCacheStats:
    """What the log cache holds: entries ``first_index`` onwards."""

    first_index: int
    entries: int
    bytes: int
    bytes_max: int


class WalEntryBatch:
    """An ``EntryBatch`` as its validated wire encoding; entries stay in native memory."""

    __slots__ = ("_batch",)

    def __init__(self, native: _native.EntryBatch) -> None:
        self._batch = native

    @classmethod
    def from_wire(
        cls,
        data: bytes,
        start: int = 0,
        end: int | None = None,
        *,
        entry_count: int | None = None,
        first_op_id: OpId | None = None,
        last_op_id: OpId | None = None,
    ) -> WalEntryBatch:
        """Decodes a received batch, ``data[start:end]`` (kept without a copy), and checks
        it (checksums, framing, contiguity, terms) and against what the message says it
        holds. Raises ``CorruptionError`` on a checksum mismatch, ``InvalidArgumentError`` on
        anything else."""
        batch = cls(_native.EntryBatch.decode(data, start, end))
        if entry_count is not None and entry_count != batch.entry_count:
            raise InvalidArgumentError(
                f"message says {entry_count} entries, the batch holds {batch.entry_count}"
            )
        if first_op_id is not None and first_op_id != batch.first_op_id:
            raise InvalidArgumentError(
                f"message says the batch starts at {first_op_id}, it starts at {batch.first_op_id}"
            )
        if last_op_id is not None and last_op_id != batch.last_op_id:
            raise InvalidArgumentError(
                f"message says the batch ends at {last_op_id}, it ends at {batch.last_op_id}"
            )
        return batch

    def to_wire(self) -> bytes:
        """The encoding to send (``ConsensusRequestPB.entries``)."""
        return self._batch.to_bytes()

    @property
    def native(self) -> _native.EntryBatch:
        """The native batch (for bindings that read its bytes in place)."""
        return self._batch

    def wire_view(self) -> memoryview:
        """The encoding without a copy (read-only; keeps the batch alive)."""
        return memoryview(self._batch)

    @property
    def first_op_id(self) -> OpId:
        """OpId of the first entry."""
        return OpId(*self._batch.first_op_id)

    @property
    def last_op_id(self) -> OpId:
        """OpId of the last entry."""
        return OpId(*self._batch.last_op_id)

    @property
    def size_bytes(self) -> int:
        """Encoded size, header included."""
        return self._batch.size_bytes

    @property
    def entry_count(self) -> int:
        """Number of entries (at least one)."""
        return len(self._batch)

    def control_entries(self) -> list[tuple[OpId, EntryKind, bytes]]:
        """The NO_OP and CONFIG_CHANGE entries, in log order."""
        return [
            (OpId(term, index), EntryKind(code), payload)
            for term, index, code, payload in self._batch.control_entries()
        ]

    def config_entries(self) -> Sequence[tuple[OpId, bytes]]:
        """The CONFIG_CHANGE entries, in log order."""
        return [
            (op_id, payload)
            for op_id, kind, payload in self.control_entries()
            if kind is EntryKind.CONFIG_CHANGE
        ]

    def __repr__(self) -> str:
        return f"WalEntryBatch({self.first_op_id}..{self.last_op_id}, {self.size_bytes} bytes)"


class DurabilitySignals:
    """One descriptor for the durability signals of every replica's WAL on a server.

    Each ``WalLog`` opened with these signals gets a token and signals the shared eventfd
    under it (``nyala_wal::Notifier``); the one reader on the event loop asks which logs
    signalled and calls their watchers. A server with 2,000 replicas held an eventfd and an
    event-loop reader per replica (issue "Thousands of tablet replicas per server"). The
    reader is registered while any log is watched.
    """

    def __init__(self) -> None:
        self.native = _native.WalNotifier()
        self._fd = self.native.fileno()
        self._tokens = itertools.count(1)  # logs open in parallel threads take tokens
        self._watchers: dict[int, Callable[[], None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def new_token(self) -> int:
        """A token for a log about to be opened."""
        return next(self._tokens)

    def watch(
        self, token: int, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]
    ) -> None:
        """Calls ``callback`` from ``loop`` whenever the log of ``token`` signals (until
        ``unwatch``), and once soon after this call: a log that signalled while nobody
        watched it (its token taken and dropped) signals again only once its watcher has
        drained it. Every watcher runs on one loop."""
        if self._loop is not loop:
            if self._watchers and self._loop is not None and not self._loop.is_closed():
                raise IllegalStateError("durability signals are watched from another event loop")
            self._watchers.clear()  # left by a loop that closed without unwatching
            self._loop = None
        if self._loop is None:
            loop.add_reader(self._fd, self._dispatch)
            self._loop = loop
        self._watchers[token] = callback
        loop.call_soon(self._call, token)

    def unwatch(self, token: int) -> None:
        """Stops calling the watcher of ``token``; the last one removes the reader."""
        if self._watchers.pop(token, None) is not None and not self._watchers:
            loop, self._loop = self._loop, None
            if loop is not None and not loop.is_closed():
                loop.remove_reader(self._fd)

    def _dispatch(self) -> None:
        for token in self.native.take_ready():
            self._call(token)

    def _call(self, token: int) -> None:
        callback = self._watchers.get(token)
        if callback is None:
            return  # a log closed since it signalled is nobody's business
        try:
            callback()
        except Exception:
            # The other logs whose tokens were taken with this one must still hear of it.
            log.exception("the durability watcher of WAL token %d failed", token)


class WalLog:
    """A replica's ``RaftLog``: the tablet's WAL in ``directory`` plus a log cache."""

    def __init__(
        self,
        directory: str | Path,
        tablet_id: str,
        options: WalLogOptions | None = None,
        *,
        signals: DurabilitySignals | None = None,
    ) -> None:
        """``signals``: the server's shared durability descriptor (None: one of its own)."""
        options = options or WalLogOptions()
        self.directory = Path(directory)
        self.tablet_id = tablet_id
        self.options = options
        self._signals = signals
        self._token = 0 if signals is None else signals.new_token()
        self._log = _native.ReplicatedLog(
            str(self.directory),
            tablet_id,
            cache_bytes_max=options.cache_bytes_max,
            segment_size_bytes=options.segment_size_bytes,
            sync=options.sync,
            queue_bytes_max=options.queue_bytes_max,
            min_segments_to_retain=options.min_segments_to_retain,
            notifier=None if signals is None else signals.native,
            notifier_token=self._token,
        )

    @property
    def native(self) -> _native.ReplicatedLog:
        """The native log (for bindings that read its entries in place)."""
        return self._log

    # --- RaftLog --------------------------------------------------------------------------

    def last_op_id(self) -> OpId:
        """OpId of the last entry, durable or not (``MIN_OP_ID`` when empty)."""
        return OpId(*self._log.last_op_id())

    def answer_when_durable(self, sink: _native.AnswerSink, frame: bytes) -> _native.DurableAnswer:
        """Writes ``frame`` to ``sink`` from the WAL committer whose sync makes everything
        appended so far durable (at once if it is): a follower's answer to an AppendEntries
        goes out as soon as its entries are durable, without waiting for this event loop to
        learn it. ``cancel`` on the handle takes it back unless it went."""
        return self._log.answer_when_durable(sink, frame)

    def set_quiet_durability(self, quiet: bool) -> None:
        """While ``quiet``, the log's syncs do not signal its watcher (its failure does);
        turning it off signals once if one went unsignalled, to catch up. For a replica with
        nothing to do when a sync returns (a follower whose answers go from the committer,
        ``answer_when_durable``; a leader whose commit does not wait for its own log): being
        woken for it cost a turn of its event loop per write."""
        self._log.set_quiet_durability(quiet)

    def durable_index(self) -> int:
        """Every entry up to here is synced and still in the log."""
        return self._log.durable_index()

    def term_at(self, index: int) -> int | None:
        """The term at ``index`` (0 at index 0); None outside the log or garbage-collected."""
        if index < 0:
            return None
        return self._log.term_at(index)

    def append(self, term: int, kind: EntryKind, payload: bytes) -> OpId:
        """Appends one entry after the last; durable later."""
        return OpId(*self._log.append(term, int(kind), payload))

    def append_many(
        self, term: int, kind: EntryKind, payloads: Sequence[bytes], bytes_max: int
    ) -> list[OpId]:
        """Appends one entry per payload after the last, as batches cut where ``read_batch``
        with ``bytes_max`` cuts: each one WAL append and one cached batch, which a caught-up
        follower is then sent without a copy."""
        if not payloads:
            return []
        last_term, last_index = self._log.append_many(term, int(kind), payloads, max(bytes_max, 0))
        first = last_index - len(payloads) + 1
        return [OpId(last_term, index) for index in range(first, last_index + 1)]

    def read_batch(
        self, after_index: int, bytes_max: int, last_index: int | None = None
    ) -> WalEntryBatch | None:
        """Entries after ``after_index`` up to ``bytes_max`` encoded bytes (at least one), and
        none after ``last_index`` if given."""
        if after_index < 0:
            raise InvalidArgumentError(f"read after index {after_index}: not in the log")
        if last_index is None:
            native = self._log.read_batch(after_index, max(bytes_max, 0))
        else:
            native = self._log.read_batch(after_index, max(bytes_max, 0), max(last_index, 0))
        return None if native is None else WalEntryBatch(native)

    def read_whole_batch(self, after_index: int, last_index: int) -> WalEntryBatch | None:
        """The entries after ``after_index`` as the batch they were appended in, shared (no
        copy), if the cache holds it whole and it ends by ``last_index``; else None."""
        if after_index < 0 or last_index < 0:
            return None
        native = self._log.read_whole_batch(after_index, last_index)
        return None if native is None else WalEntryBatch(native)

    def append_replicated(
        self, preceding: OpId, entries: EntryBatch | None, committed_index: int
    ) -> AppendResult:
        """Log matching, truncation of a conflicting uncommitted suffix, append: one native
        call with the GIL released."""
        if entries is not None and not isinstance(entries, WalEntryBatch):
            raise InvalidArgumentError(f"WalLog cannot append a {type(entries).__name__}")
        native = None if entries is None else entries._batch
        matched, last, hint, truncated_from, _durable = self._log.append_replicated(
            (preceding.term, preceding.index), native, max(committed_index, 0)
        )
        return AppendResult(matched, OpId(*last), hint, truncated_from)

    def config_entries_after(self, index: int) -> Sequence[tuple[OpId, bytes]]:
        """CONFIG_CHANGE entries above ``index``."""
        return [
            (OpId(term, idx), payload)
            for term, idx, payload in self._log.config_entries_after(max(index, 0))
        ]

    # --- durability (the runtime's side) ----------------------------------------------------

    def watch_durability(
        self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]
    ) -> Callable[[], None]:
        """Calls ``callback`` from ``loop`` whenever the durable index may have moved or the
        WAL failed (no thread, no polling); returns what stops it. The callback calls
        ``drain_notifications`` before it looks."""
        signals, token = self._signals, self._token
        if signals is not None:
            signals.watch(token, loop, callback)
            return lambda: signals.unwatch(token)
        fd = self._log.notification_fd()
        loop.add_reader(fd, callback)

        def stop() -> None:
            if not loop.is_closed():
                loop.remove_reader(fd)

        return stop

    def drain_notifications(self) -> None:
        """Clears this log's pending signal (before looking at ``durable_index``)."""
        self._log.drain_notifications()

    def release_files(self) -> bool:
        """Closes the WAL's segment files while it is idle (nothing queued or unsynced);
        whether it was. The next append or read opens what it needs again."""
        return self._log.release_files()

    def wait_durable(self, timeout_s: float | None = None) -> bool:
        """Blocks until everything appended so far is durable; False on timeout. For tests
        and shutdown; the runtime uses ``watch_durability``."""
        return self._log.wait_durable(timeout_s)

    def failure(self) -> BaseException | None:
        """The error the WAL failed with (it then refuses appends until reopened)."""
        return self._log.failure()

    # --- inspection and lifetime --------------------------------------------------------------

    def first_index(self) -> int:
        """The first index still in the WAL (earlier ones were garbage-collected)."""
        return self._log.first_index()

    # --- anchors and GC (log_anchor in Kudu's terms) ---------------------------------------

    def register_anchor(self, index: int) -> int:
        """Keeps entries at or after ``index`` from GC until released; returns the anchor id."""
        return self._log.register_anchor(max(index, 0))

    def update_anchor(self, anchor: int, index: int) -> None:
        """Moves ``anchor`` to ``index`` (``InvalidArgumentError`` if it is unknown)."""
        self._log.update_anchor(anchor, max(index, 0))

    def release_anchor(self, anchor: int) -> None:
        """Releases ``anchor`` (``InvalidArgumentError`` if it is unknown)."""
        self._log.release_anchor(anchor)

    def anchors(self) -> list[tuple[int, int]]:
        """Every anchor as (anchor id, first index it keeps), by anchor id."""
        return self._log.anchors()

    def gc(self) -> tuple[int, int]:
        """Removes whole closed segments below every anchor and the durable index, keeping
        ``min_segments_to_retain``; returns (segments removed, first index still held)."""
        deleted, recycled, first_index = self._log.gc()
        return deleted + recycled, first_index

    def copy_image(self) -> list[_native.CopyFile]:
        """A consistent image of the durable log for a tablet copy: one file per segment up to
        the durable end, each with a fixed length that appends do not change (see
        ``rust/wal/src/copy_image.rs``). Anchor what the copy needs first."""
        return self._log.copy_image()

    def segment_paths(self) -> list[Path]:
        """The live segment files, oldest first (the last is being appended to)."""
        return [Path(p) for p in self._log.segment_paths()]

    def evict_through(self, index: int) -> None:
        """Frees cached entries at or below ``index`` that are durable: nobody will read
        them from memory again (reads of them go to the WAL)."""
        self._log.evict_through(max(index, 0))

    def cache_stats(self) -> LogCacheStats:
        """What the log cache holds."""
        return LogCacheStats(**self._log.cache_stats())

    def close(self) -> None:
        """Writes what is queued and closes the WAL."""
        self._log.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
