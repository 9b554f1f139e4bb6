"""Applies a replica's committed log entries to its storage engine, in order, exactly once.

The Raft runtime reports committed ranges (``Apply``); one native call
(``StorageEngine.apply_committed``) reads those entries from the log cache (or the WAL),
applies each WRITE's op batch to storage as its op index and returns one outcome per WRITE,
with the GIL released: row bytes never enter Python (DESIGN.md §4,
docs/tablet-write-entry.md). Rust also decides, from the engine's index of applied requests
and their first outcomes, that a retried request (or a duplicate entry from a retry racing
a leader change) is not applied twice, and answers such a retry with the first outcome
(``outcome_of``). The engine persists that index with every flush, consistent with the
flushed op index, so a retry after a restart still gets its first outcome
(docs/tablet-lifecycle.md). NO_OP and CONFIG_CHANGE entries have no
effect on storage; a schema change stops the native call and is applied here, through the
tablet's callback. A WRITE whose op batch the engine refuses as malformed is recorded as a
failed outcome, not a replica failure.

Entries at or below the storage engine's ``last_applied_index`` are skipped: after a restart
the engine opens at ``last_flushed_index`` and the runtime re-announces everything above it as
it re-learns the commit index (bootstrap, issue 7 item 4).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from nyala.consensus.runtime.wal_log import WalLog
from nyala.errors import CorruptionError
from nyala.storage import ApplyResult, RowStatus, StorageEngine
from nyala.tablet.write_entry import RequestId

#: Encoded bytes read from the log per step while applying.
APPLY_READ_BYTES_MAX = 4 * 1024 * 1024
#: Outcomes kept for proposers to collect; followers' are never collected, so the oldest go.
UNCOLLECTED_OUTCOMES_MAX = 65_536

# Answers of ``Applier.admit`` (``StorageEngine.admit``).
ADMIT_NEW, ADMIT_DUPLICATE, ADMIT_STALE = 0, 1, 2
# Effect codes of ``StorageEngine.apply_committed``'s outcomes.
_APPLIED, _REFUSED, _DUPLICATE, _STALE = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """What one applied WRITE did: its op index and the per-row statuses, or why the whole
    batch was refused (``error``; then ``result`` is None and no row changed)."""

    op_index: int
    result: ApplyResult | None
    error: str | None = None
    #: The write's hybrid timestamp (from its WRITE entry; 0 for entries written before
    #: format 3, whose writes every snapshot sees).
    timestamp: int = 0


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
        # op index -> outcome, for the proposer of that op to collect.
        self._by_index: dict[int, WriteOutcome] = {}
        # Proposals whose outcome someone will collect (``collecting``). With none, outcomes
        # are not kept by index: a follower never collects, and keeping tens of thousands of
        # uncollected outcomes made the garbage collector's full passes slow its event loop.
        self._collectors = 0
        # Metrics: rows of applied WRITE entries that ended OK, and those that failed.
        self.rows_written = 0
        self.rows_failed = 0
        # ... the failed rows by RowStatus name, and the bytes of applied op batches.
        self.rows_failed_by_code: dict[str, int] = {}
        self.bytes_written = 0

    def outcome_of(self, request_id: RequestId) -> WriteOutcome | None:
        """The first outcome of an already applied request, if it is remembered."""
        return self._first_outcome(request_id.client_id, request_id.seq_no)

    def _first_outcome(self, client_id: str, seq_no: int) -> WriteOutcome | None:
        first = self._storage.request_outcome(client_id, seq_no)
        if first is None:
            return None
        return WriteOutcome(first.op_index, first.result, first.error, first.timestamp)

    def admit(self, request_id: RequestId) -> int:
        """``ADMIT_NEW`` for a request not applied yet, ``ADMIT_DUPLICATE`` for one applied
        (``outcome_of`` has its first outcome), ``ADMIT_STALE`` for one the client declared
        complete (below its first incomplete seq no) whose outcome is forgotten: it must not
        be applied again. One native call: the check every write with a request id makes."""
        return self._storage.admit(request_id.client_id, request_id.seq_no)

    def is_stale(self, request_id: RequestId) -> bool:
        """``admit`` is ``ADMIT_STALE``."""
        return self.admit(request_id) == ADMIT_STALE

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
        """Adds the failed rows of one applied batch to the counts by code (off the happy
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
            through, outcomes, alter = self._storage.apply_committed(
                self._log, after, last_index, APPLY_READ_BYTES_MAX
            )
            self._count_applied(outcomes)
            if not self._collectors:  # nobody waits for these outcomes (a follower's case)
                outcomes = []
            for (
                index,
                effect,
                statuses,
                _failed,
                message,
                client,
                seq,
                _watermark,
                _size,
                stamp,
            ) in outcomes:
                outcome: WriteOutcome
                if effect == _APPLIED:
                    assert statuses is not None
                    result = ApplyResult(np.frombuffer(statuses, np.uint8))
                    outcome = WriteOutcome(index, result, timestamp=stamp)
                elif effect == _REFUSED:
                    # A malformed batch is refused whole, the same way on every replica (the
                    # engine validates before it changes anything): the replicas stay alike.
                    outcome = WriteOutcome(index, None, message, timestamp=stamp)
                elif effect == _DUPLICATE:
                    assert client is not None
                    first = self._first_outcome(client, seq)
                    if first is not None:  # unless a later entry's watermark forgot it
                        self._keep(first, index)  # a duplicate: answer with the first
                        continue
                    outcome = WriteOutcome(index, None, "stale retry of a completed request")
                else:
                    outcome = WriteOutcome(index, None, "stale retry of a completed request")
                self._keep(outcome)
            self.applied_index = after = through
            if alter is not None:
                index, version, doc = alter
                if self._on_alter_schema is None:
                    raise CorruptionError(f"entry {index} changes the schema; nothing can apply it")
                self._on_alter_schema(index, version, doc)
                self._keep(WriteOutcome(index, None))
                self.applied_index = after = index

    def _count_applied(self, outcomes: list[Any]) -> None:
        """Counts the rows and bytes of applied writes, and their failures by code: all that
        ``apply`` does with an outcome when no proposer may collect it (a follower)."""
        for _index, effect, statuses, failed, _m, _c, _s, _w, size, _stamp in outcomes:
            if effect == _APPLIED:
                self.rows_written += len(statuses) - failed
                self.bytes_written += size
                if failed:
                    self._count_failures(np.frombuffer(statuses, np.uint8))

    def _keep(self, outcome: WriteOutcome, index: int | None = None) -> None:
        """Keeps ``outcome`` as the answer for op ``index`` (its own by default) if a proposer
        may collect it."""
        if not self._collectors:
            return
        self._by_index[outcome.op_index if index is None else index] = outcome
        if len(self._by_index) > UNCOLLECTED_OUTCOMES_MAX:
            del self._by_index[next(iter(self._by_index))]
