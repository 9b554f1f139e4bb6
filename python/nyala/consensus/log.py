"""The replicated log as consensus sees it: the plug-in point between the Raft core and storage.

The core drives the log through ``RaftLog`` and nothing else. Two implementations exist or will:
``MemoryLog`` (scenarios, simulation) and the Rust WAL-backed log (issue 5 item 4, over
``rust/consensus``). Both must pass ``tests/unit/consensus/log_conformance.py``.

Rules the core relies on:

* WRITE payloads are opaque. The core never iterates over the entries of a batch; it only reads
  an ``EntryBatch``'s first/last OpId, byte size and the CONFIG_CHANGE entries it contains. A
  production batch can therefore be a native object holding serialized bytes.
* ``append_replicated`` is the follower's whole UpdateConsensus step in one call: log matching
  against ``preceding``, truncation of a conflicting uncommitted suffix, append. It never
  truncates at or below ``committed_index``; a leader asking for that is a safety violation and
  the log raises ``CorruptionError`` instead.
* The Rust log (issue 5 item 4) plugs in by implementing this protocol in ``pyext``: its
  ``EntryBatch`` is a native object holding the serialized entries, ``append_replicated`` is
  the one native call per UpdateConsensus (release the GIL inside), and WAL group-commit
  completions are reported with ``on_log_durable``. Run it through the conformance suite by
  subclassing ``RaftLogConformance`` (three hooks: new, make durable, reopen).
* Appends are durable later. ``durable_index`` only grows until a truncation lowers it to the
  truncation point; the runtime tells the core about progress with
  ``RaftCore.on_log_durable(index)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from nyala.consensus.types import EntryKind, OpId


class EntryBatch(Protocol):
    """A contiguous run of log entries produced by the leader's log, shipped as one unit."""

    @property
    def first_op_id(self) -> OpId:
        """OpId of the first entry (batches are never empty)."""
        ...

    @property
    def last_op_id(self) -> OpId:
        """OpId of the last entry."""
        ...

    @property
    def size_bytes(self) -> int:
        """Payload bytes, for flow control."""
        ...

    def config_entries(self) -> Sequence[tuple[OpId, bytes]]:
        """The CONFIG_CHANGE entries of the batch (OpId and encoded config), in log order."""
        ...


@dataclass(frozen=True, slots=True)
class AppendResult:
    """What ``RaftLog.append_replicated`` did."""

    matched: bool  # the preceding OpId was found; entries (if any) are now in the log
    last_received: OpId  # matched: last entry known to match the leader's log
    hint_index: int  # not matched: the leader should retry from no later than this index
    truncated_from: int | None  # entries at this index and above were removed, if not None


class RaftLog(Protocol):
    """The log behind one Raft replica."""

    def last_op_id(self) -> OpId:
        """OpId of the last entry, ``MIN_OP_ID`` when empty."""
        ...

    def durable_index(self) -> int:
        """Every entry up to this index is on stable storage."""
        ...

    def term_at(self, index: int) -> int | None:
        """The term of the entry at ``index`` (0 for index 0), or None if not in the log."""
        ...

    def append(self, term: int, kind: EntryKind, payload: bytes) -> OpId:
        """Appends one entry after the last (leader proposals, NO_OP, config entries)."""
        ...

    def append_many(
        self, term: int, kind: EntryKind, payloads: Sequence[bytes], bytes_max: int
    ) -> list[OpId]:
        """``append`` of each payload in turn, at once (the leader's proposals of one turn);
        ``bytes_max`` is the ``read_batch`` limit the entries will be read with, which a log
        may use to store them in batches that are read without a copy."""
        ...

    def read_batch(self, after_index: int, bytes_max: int) -> EntryBatch | None:
        """Entries after ``after_index``, up to ``bytes_max`` payload bytes (at least one entry
        if any exist); None if ``after_index`` is the last index. ``NotFoundError`` if the
        entry after it was garbage-collected (GC may run beside the caller, between a
        ``term_at`` and this call)."""
        ...

    def append_replicated(
        self, preceding: OpId, entries: EntryBatch | None, committed_index: int
    ) -> AppendResult:
        """The follower's log matching + conflict truncation + append, as one call."""
        ...

    def config_entries_after(self, index: int) -> Sequence[tuple[OpId, bytes]]:
        """CONFIG_CHANGE entries with an index above ``index`` (bootstrap of pending config)."""
        ...
