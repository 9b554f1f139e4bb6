"""``MemoryLog``: an in-memory ``RaftLog`` for scenarios, the simulation and conformance tests.

It models the one property of a real WAL that consensus depends on: appends become durable
later (``sync``), and a crash (``recover``) loses exactly the entries that were not durable yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nyala.consensus.log import AppendResult, EntryBatch
from nyala.consensus.types import MIN_OP_ID, EntryKind, OpId
from nyala.errors import CorruptionError, InvalidArgumentError

#: Bytes an entry costs on top of its payload, so that empty entries still count for limits.
ENTRY_OVERHEAD_BYTES = 16


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One entry of a ``MemoryLog``."""

    op_id: OpId
    kind: EntryKind
    payload: bytes

    @property
    def size_bytes(self) -> int:
        """Payload plus fixed overhead."""
        return len(self.payload) + ENTRY_OVERHEAD_BYTES


@dataclass(frozen=True, slots=True)
class MemoryEntryBatch:
    """An ``EntryBatch`` holding its entries as Python objects."""

    entries: tuple[LogEntry, ...]  # non-empty, consecutive indexes

    def __post_init__(self) -> None:
        assert self.entries, "a batch is never empty"
        first = self.entries[0].op_id.index
        assert self.entries[-1].op_id.index == first + len(self.entries) - 1

    @property
    def first_op_id(self) -> OpId:
        """OpId of the first entry."""
        return self.entries[0].op_id

    @property
    def last_op_id(self) -> OpId:
        """OpId of the last entry."""
        return self.entries[-1].op_id

    @property
    def size_bytes(self) -> int:
        """Sum of the entries' sizes."""
        return sum(e.size_bytes for e in self.entries)

    def config_entries(self) -> Sequence[tuple[OpId, bytes]]:
        """The CONFIG_CHANGE entries."""
        return [(e.op_id, e.payload) for e in self.entries if e.kind is EntryKind.CONFIG_CHANGE]


class MemoryLog:
    """A ``RaftLog`` in a Python list (index ``i`` lives at ``_entries[i - 1]``)."""

    def __init__(self, entries: Sequence[LogEntry] = (), *, sync_on_append: bool = False) -> None:
        self._entries: list[LogEntry] = list(entries)
        self.sync_on_append = sync_on_append  # write-through: every append is durable at once
        for position, entry in enumerate(self._entries, start=1):
            assert entry.op_id.index == position
        self._durable_index = len(self._entries)  # invariant: <= last index

    # --- RaftLog --------------------------------------------------------------------------

    def last_op_id(self) -> OpId:
        """OpId of the last entry."""
        return self._entries[-1].op_id if self._entries else MIN_OP_ID

    def durable_index(self) -> int:
        """Entries up to here survive ``recover``."""
        return self._durable_index

    def term_at(self, index: int) -> int | None:
        """Term of the entry at ``index``; 0 at index 0; None outside the log."""
        if index == 0:
            return 0
        if 1 <= index <= len(self._entries):
            return self._entries[index - 1].op_id.term
        return None

    def append(self, term: int, kind: EntryKind, payload: bytes) -> OpId:
        """Appends one entry after the last."""
        last = self.last_op_id()
        if term < last.term:
            raise InvalidArgumentError(f"append at term {term} after an entry of term {last.term}")
        op_id = OpId(term, last.index + 1)
        self._entries.append(LogEntry(op_id, kind, bytes(payload)))
        if self.sync_on_append:
            self.sync()
        return op_id

    def append_many(
        self, term: int, kind: EntryKind, payloads: Sequence[bytes], bytes_max: int
    ) -> list[OpId]:
        """``append`` of each payload in turn (``bytes_max`` does not matter here)."""
        return [self.append(term, kind, payload) for payload in payloads]

    def read_batch(self, after_index: int, bytes_max: int) -> MemoryEntryBatch | None:
        """Entries after ``after_index`` up to ``bytes_max`` (at least one)."""
        if after_index < 0 or after_index > len(self._entries):
            raise InvalidArgumentError(f"read after index {after_index}: not in the log")
        if after_index == len(self._entries):
            return None
        out: list[LogEntry] = []
        total_bytes = 0
        for entry in self._entries[after_index:]:
            if out and total_bytes + entry.size_bytes > bytes_max:
                break
            out.append(entry)
            total_bytes += entry.size_bytes
        return MemoryEntryBatch(tuple(out))

    def append_replicated(
        self, preceding: OpId, entries: EntryBatch | None, committed_index: int
    ) -> AppendResult:
        """Log matching, truncation of a conflicting uncommitted suffix, append."""
        if self.term_at(preceding.index) != preceding.term:
            return AppendResult(False, MIN_OP_ID, self._hint(preceding, committed_index), None)
        if entries is None:
            return AppendResult(True, preceding, 0, None)
        if not isinstance(entries, MemoryEntryBatch):
            raise InvalidArgumentError(f"MemoryLog cannot append a {type(entries).__name__}")
        if entries.first_op_id.index != preceding.index + 1:
            raise InvalidArgumentError(
                f"batch starts at {entries.first_op_id} but the preceding entry is {preceding}"
            )
        truncated_from = None
        for entry in entries.entries:
            index = entry.op_id.index
            if index <= len(self._entries):
                if self._entries[index - 1].op_id.term == entry.op_id.term:
                    continue
                self._truncate_from(index, committed_index)
                truncated_from = index
            assert index == len(self._entries) + 1
            self._entries.append(entry)
        if self.sync_on_append:
            self.sync()
        return AppendResult(True, entries.last_op_id, 0, truncated_from)

    def config_entries_after(self, index: int) -> Sequence[tuple[OpId, bytes]]:
        """CONFIG_CHANGE entries above ``index``."""
        return [
            (e.op_id, e.payload)
            for e in self._entries[max(index, 0) :]
            if e.kind is EntryKind.CONFIG_CHANGE
        ]

    # --- durability and crashes (the runtime's side) --------------------------------------

    def sync(self, up_to_index: int | None = None) -> int:
        """Makes entries durable up to ``up_to_index`` (default: all); returns the durable index."""
        target = len(self._entries) if up_to_index is None else min(up_to_index, len(self._entries))
        self._durable_index = max(self._durable_index, target)
        return self._durable_index

    def recover(self) -> MemoryLog:
        """The log a restart would find: only the durable entries."""
        return MemoryLog(self._entries[: self._durable_index], sync_on_append=self.sync_on_append)

    # --- inspection (tests) ---------------------------------------------------------------

    def entry(self, index: int) -> LogEntry:
        """The entry at ``index``."""
        if not 1 <= index <= len(self._entries):
            raise InvalidArgumentError(f"no entry at index {index}")
        return self._entries[index - 1]

    def entries(self) -> Sequence[LogEntry]:
        """All entries, oldest first (a copy)."""
        return list(self._entries)

    # --- internals ------------------------------------------------------------------------

    def _truncate_from(self, index: int, committed_index: int) -> None:
        if index <= committed_index:
            raise CorruptionError(
                f"asked to truncate at index {index}, at or below commit index {committed_index}"
            )
        del self._entries[index - 1 :]
        self._durable_index = min(self._durable_index, index - 1)

    def _hint(self, preceding: OpId, committed_index: int) -> int:
        last = len(self._entries)
        if preceding.index > last:
            return last + 1
        # Skip back over the whole run of the conflicting term: one round trip per term.
        conflict_term = self._entries[preceding.index - 1].op_id.term
        index = preceding.index
        while index - 1 > committed_index and self.term_at(index - 1) == conflict_term:
            index -= 1
        return index
