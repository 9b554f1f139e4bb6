"""Applies a replica's committed log entries to its storage engine, in order, exactly once.

The Raft runtime reports committed ranges (``Apply``); this module reads those entries back from
the log, applies each WRITE's op batch to storage as its op index, and keeps the outcome per
client request so that a retried request (or a duplicate entry from a retry racing a leader
change) is answered with the first outcome instead of being applied twice (DESIGN.md §4,
docs/tablet-write-entry.md). NO_OP and CONFIG_CHANGE entries have no effect on storage. A
WRITE whose op batch the engine refuses as malformed is recorded as a failed outcome, not a
replica failure.

Entries at or below the storage engine's ``last_applied_index`` are skipped: after a restart
the engine opens at ``last_flushed_index`` and the runtime re-announces everything above it as
it re-learns the commit index (bootstrap, issue 7 item 4).

Known gap: WRITE payloads cross into Python here (one copy of a batch's wire bytes) on their
way to storage; DESIGN.md §4 wants that loop in Rust.
"""

from __future__ import annotations

import contextlib
import heapq
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from nyala.consensus.runtime.wal_log import WalEntryBatch, WalLog
from nyala.consensus.types import EntryKind
from nyala.errors import CorruptionError, InvalidArgumentError
from nyala.storage import ApplyResult, RowStatus, StorageEngine
from nyala.tablet.write_entry import KIND_ALTER_SCHEMA, RequestId, decode_write_entry

# Entry batch wire encoding (docs/entry-batch.md): a 24-byte batch header, then entries, each
# a 24-byte header (term u64, index u64, type u8, 3 reserved, payload length u32) + payload.
_BATCH_HEADER_BYTES = 24
_ENTRY_HEADER = struct.Struct("<QQB3xI")

#: Encoded bytes read from the log per step while applying.
APPLY_READ_BYTES_MAX = 4 * 1024 * 1024
#: Outcomes kept for proposers to collect; followers' are never collected, so the oldest go.
UNCOLLECTED_OUTCOMES_MAX = 65_536


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """What one applied WRITE did: its op index and the per-row statuses, or why the whole
    batch was refused (``error``; then ``result`` is None and no row changed)."""

    op_index: int
    result: ApplyResult | None
    error: str | None = None


def iter_write_payloads(wire: bytes | memoryview) -> Iterator[tuple[int, int, int]]:
    """(index, start, end) of each WRITE entry's payload in an encoded, already verified
    entry batch."""
    view = memoryview(wire)
    offset = _BATCH_HEADER_BYTES
    while offset < len(view):
        _term, index, entry_type, length = _ENTRY_HEADER.unpack_from(view, offset)
        start = offset + _ENTRY_HEADER.size
        if start + length > len(view):
            raise CorruptionError(f"entry {index} overruns its batch")
        if entry_type == EntryKind.WRITE:
            yield index, start, start + length
        offset = start + length


class Applier:
    """The state machine side of one replica: log entries in, storage changes out."""

    def __init__(
        self,
        log: WalLog,
        storage: StorageEngine,
        on_alter_schema: Callable[[int, int, bytes], None] | None = None,
    ) -> None:
        self._log = log
        self._storage = storage
        # Applies a schema-change entry: (op index, new version, schema document).
        self._on_alter_schema = on_alter_schema
        # Invariant: every committed index <= applied_index is reflected in storage.
        self.applied_index = storage.last_applied_index
        # client id -> seq no -> outcome; trimmed below the client's first incomplete seq no.
        self._outcomes: dict[str, dict[int, WriteOutcome]] = {}
        # client id -> min-heap of the seq nos in ``_outcomes[client]`` (for trimming).
        self._kept_seqs: dict[str, list[int]] = {}
        # client id -> the highest first-incomplete seq no it sent: outcomes below are gone.
        self._watermarks: dict[str, int] = {}
        # op index -> outcome, for the proposer of that op to collect.
        self._by_index: dict[int, WriteOutcome] = {}
        # Proposals whose outcome someone will collect (``collecting``). With none, outcomes
        # are not kept by index: a follower never collects, and keeping tens of thousands of
        # uncollected outcomes made the garbage collector's full passes slow its event loop.
        self._collectors = 0
        # Metrics: rows of applied WRITE entries that ended OK, those that failed (and by
        # RowStatus name), and the bytes of the applied op batches (Arrow IPC).
        self.rows_written = 0
        self.rows_failed = 0
        self.rows_failed_by_code: dict[str, int] = {}
        self.bytes_written = 0

    def outcome_of(self, request_id: RequestId) -> WriteOutcome | None:
        """The outcome of an already applied request, if it is remembered."""
        return self._outcomes.get(request_id.client_id, {}).get(request_id.seq_no)

    def is_stale(self, request_id: RequestId) -> bool:
        """True for a request the client declared complete (below its first incomplete seq
        no) whose outcome is already forgotten: it must not be applied again."""
        watermark = self._watermarks.get(request_id.client_id, -1)
        return request_id.seq_no < watermark and self.outcome_of(request_id) is None

    @contextlib.contextmanager
    def collecting(self) -> Iterator[None]:
        """Held around proposing writes and taking their outcomes (``take_outcome``): while
        any is held, every applied write's outcome is kept for its proposer. Entered before
        the proposal, so an entry can never be applied before its proposer is counted."""
        self._collectors += 1
        try:
            yield
        finally:
            self._collectors -= 1

    def take_outcome(self, op_index: int) -> WriteOutcome | None:
        """The outcome of the WRITE at ``op_index`` (once; None if it was not a new write)."""
        return self._by_index.pop(op_index, None)

    def _count_failures(self, statuses: np.ndarray) -> None:
        """Adds the failed rows of one applied batch to the per-code counts (off the happy
        path: a batch without failures never gets here)."""
        codes, counts = np.unique(statuses[statuses != 0], return_counts=True)
        for code, count in zip(codes.tolist(), counts.tolist(), strict=True):
            name = RowStatus(code).name if code in RowStatus._value2member_map_ else str(code)
            self.rows_failed_by_code[name] = self.rows_failed_by_code.get(name, 0) + count
            self.rows_failed += count

    def apply(self, first_index: int, last_index: int) -> None:
        """Applies committed entries ``first_index..last_index`` (inclusive), in order."""
        after = max(first_index - 1, self.applied_index)
        while after < last_index:
            # Bounded by ``last_index``: the uncommitted tail behind it is not read (reading it
            # made applying a backlog quadratic in its length).
            # The batch as appended, shared with the log cache, when it is there whole; a
            # copy of the range otherwise (older entries come from the WAL).
            batch = self._log.read_whole_batch(after, last_index) or self._log.read_batch(
                after, APPLY_READ_BYTES_MAX, last_index
            )
            if batch is None:
                raise CorruptionError(f"committed entry {after + 1} is not in the log")
            wire = batch.wire_view()
            for index, start, end in iter_write_payloads(wire):
                if after < index <= last_index:
                    self._apply_write(index, batch, wire, start, end)
            after = min(last_index, batch.last_op_id.index)
            self.applied_index = after

    def _apply_write(
        self, index: int, batch: WalEntryBatch, wire: memoryview, start: int, end: int
    ) -> None:
        """Applies the WRITE entry at ``wire[start:end]`` (``wire`` views ``batch``)."""
        entry = decode_write_entry(wire[start:end])
        if entry.kind == KIND_ALTER_SCHEMA:
            if self._on_alter_schema is None:
                raise CorruptionError(f"entry {index} changes the schema; nothing can apply it")
            self._on_alter_schema(index, entry.schema_version, bytes(entry.ops))
            self._keep(WriteOutcome(index, None))
            return
        request = entry.request_id
        if request is not None:
            first_outcome = self.outcome_of(request)
            if first_outcome is not None:
                self._keep(first_outcome, index)  # a duplicate: answer with the first
                return
            if self.is_stale(request):
                self._keep(WriteOutcome(index, None, "stale retry of a completed request"))
                return
        try:
            # The op batch is the payload's tail; storage keeps the log's bytes, not a copy.
            ops_start = end - len(entry.ops)
            result = self._storage.apply_from_entry_batch(batch, ops_start, end, index)
            outcome = WriteOutcome(index, result)
            failed = int(np.count_nonzero(result.statuses))
            self.rows_written += len(result.statuses) - failed
            self.bytes_written += end - ops_start
            if failed:
                self._count_failures(result.statuses)
        except InvalidArgumentError as exc:
            # A malformed batch is refused whole, the same way on every replica (the engine
            # validates before it changes anything), so the replicas stay identical.
            outcome = WriteOutcome(index, None, str(exc))
        self._keep(outcome)
        if request is not None:
            self._remember(request, outcome)

    def _keep(self, outcome: WriteOutcome, index: int | None = None) -> None:
        """Keeps ``outcome`` as the answer for op ``index`` (its own by default) if a proposer
        may collect it."""
        if not self._collectors:
            return
        self._by_index[outcome.op_index if index is None else index] = outcome
        if len(self._by_index) > UNCOLLECTED_OUTCOMES_MAX:
            del self._by_index[next(iter(self._by_index))]

    def _remember(self, request: RequestId, outcome: WriteOutcome) -> None:
        client = request.client_id
        per_client = self._outcomes.get(client)
        if per_client is None:
            per_client = self._outcomes[client] = {}
            self._kept_seqs[client] = []
        per_client[request.seq_no] = outcome
        kept = self._kept_seqs[client]
        heapq.heappush(kept, request.seq_no)
        watermark = max(self._watermarks.get(client, -1), request.first_incomplete_seq_no)
        self._watermarks[client] = watermark
        # Trimmed from the lowest kept seq no up: a scan of every kept outcome per write was
        # quadratic while one old request of a busy client stayed incomplete.
        while kept and kept[0] < watermark:
            per_client.pop(heapq.heappop(kept), None)
