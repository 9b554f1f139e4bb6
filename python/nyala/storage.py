"""The tablet storage engine, typed: a thin wrapper over ``nyala._native.StorageEngine``.

The engine (Rust, ``rust/storage``) applies op batches in op-index order, flushes MemRowSets to
Parquet DiskRowSets, compacts them, and serves merge-on-read scans as pyarrow Tables (handed
over zero-copy). This module converts Python values (schemas, predicate values, key bounds) and
owns nothing else; the tablet layer drives it.

Row versions (MVCC, docs/storage-format.md "Row versions"): every op batch is applied with a
commit timestamp (hybrid time, an unsigned 64-bit integer that never decreases in op-index
order), and every version of a row is kept with it through flush and compaction until
compaction collects history older than an ancient history mark. ``scan(snapshot_ts=T)`` reads
per key the newest version with a timestamp at or below T; ``diff_scan`` returns what changed
between two snapshots. A snapshot below ``history_gc_mark`` is refused
(``InvalidArgumentError``), never answered from incomplete history.
"""

from __future__ import annotations

import dataclasses
import decimal
import enum
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from nyala import _native
from nyala.errors import InvalidArgumentError
from nyala.rowops import OpType, encode, make_op_batch
from nyala.schema import Schema, decimal_params

#: Default MemRowSet size at which a background flush starts, in bytes.
FLUSH_THRESHOLD_BYTES = 64 * 1024 * 1024

Predicate = tuple[str, str, Any]


class NativeLog(Protocol):
    """A replica's log held in native memory (``nyala.consensus.runtime.wal_log``'s
    ``WalLog``); storage reads committed WRITE entries from it in place."""

    @property
    def native(self) -> _native.ReplicatedLog:
        """The native log."""
        ...


#: One applied WRITE entry (``StorageEngine.apply_committed``): op index, effect (0 applied,
#: 1 refused as malformed, 2 duplicate request, 3 stale request), row statuses (applied), rows
#: that failed, the refusal's message, client id and seq no (None and -1 without a request
#: id), the client's first incomplete seq no after it (None if not recorded), and the bytes
#: of the entry's op batch.
EntryOutcome = tuple[int, int, bytes | None, int, str | None, str | None, int, int | None, int, int]


class RowStatus(enum.IntEnum):
    """Per-row outcome of an applied op batch (``nyala_storage::RowStatus``)."""

    OK = 0
    ALREADY_PRESENT = 1
    NOT_FOUND = 2
    #: A NOT NULL (or key) column holds null: the row was refused, the others applied.
    NULL_IN_NOT_NULL = 3
    #: A cell is over ``CELL_BYTES_MAX`` or the row over ``ROW_BYTES_MAX``: refused alone.
    TOO_LARGE = 4
    #: A value does not fit its column's type (a decimal over its precision): refused alone.
    OUT_OF_RANGE = 5


#: Largest string or binary cell, and largest row, in bytes (the storage engine's limits).
CELL_BYTES_MAX: int = _native.CELL_BYTES_MAX
ROW_BYTES_MAX: int = _native.ROW_BYTES_MAX


@dataclasses.dataclass(frozen=True)
class ApplyResult:
    """Statuses of one applied batch: ``statuses[i]`` is row i's ``RowStatus`` code."""

    statuses: np.ndarray[Any, np.dtype[np.uint8]]

    def __eq__(self, other: object) -> bool:
        # By value: a retry's answer is rebuilt from the request index, not the same array.
        if not isinstance(other, ApplyResult):
            return NotImplemented
        return bool(np.array_equal(self.statuses, other.statuses))

    @property
    def ok(self) -> bool:
        """True if every row ended OK."""
        # ``count_nonzero`` skips the ufunc machinery of ``any``: a fifth of its cost on the
        # one-row outcome of every single-row write, and no slower on a million rows.
        return int(np.count_nonzero(self.statuses)) == 0

    def errors(self) -> list[tuple[int, RowStatus]]:
        """(row position, status) of each row that did not end OK."""
        positions = np.flatnonzero(self.statuses)
        return [(int(i), RowStatus(int(self.statuses[i]))) for i in positions]


@dataclasses.dataclass(frozen=True, slots=True)
class RequestOutcome:
    """The first outcome of an applied client request: its op index, per-row statuses (or
    the refusal, ``error``, of a malformed batch; then ``result`` is None) and the hybrid
    timestamp it was applied at."""

    op_index: int
    result: ApplyResult | None
    error: str | None
    timestamp: int


@dataclasses.dataclass(frozen=True)
class StorageSnapshot:
    """Pinned files of a consistent image at ``last_flushed_index`` (for tablet copy)."""

    id: int
    last_flushed_index: int
    files: list[Path]
    manifest_image: bytes


class ScanCursor:
    """A scan in progress over one consistent view of a tablet (``StorageEngine.open_scan``).

    Batches come in key order, each produced in Rust with the GIL released; the cursor pins
    the rowsets it still has to read (compaction leaves their files until it lets go) and
    holds at most one decoded row group besides the copy of the in-memory rows it was opened
    with. ``close`` (or dropping it) lets go of everything.
    """

    def __init__(self, native: _native.ScanCursor) -> None:
        self._native = native

    @property
    def schema(self) -> pa.Schema:
        """The schema of every batch."""
        schema: pa.Schema = self._native.schema
        return schema

    @property
    def snapshot_index(self) -> int:
        """The last op index applied to storage when the cursor was opened."""
        return self._native.snapshot_index

    def next_batch(self, bytes_max: int) -> pa.RecordBatch | None:
        """The next rows, at most about ``bytes_max`` bytes (at least one row); None at the
        end."""
        batch: pa.RecordBatch | None = self._native.next_batch(bytes_max)
        return batch

    def next_ipc(self, bytes_max: int) -> tuple[bytes, int] | None:
        """``next_batch`` as an Arrow IPC stream and its row count, encoded in Rust."""
        return self._native.next_ipc(bytes_max)

    def close(self) -> None:
        """Lets go of everything the cursor holds; it returns nothing more."""
        self._native.close()


class StorageEngine:
    """One tablet's storage engine over its data directory."""

    def __init__(self, native: _native.StorageEngine) -> None:
        self._native = native

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        schema: Schema,
        *,
        flush_threshold_bytes: int = FLUSH_THRESHOLD_BYTES,
        background_flush: bool = True,
    ) -> StorageEngine:
        """Creates an empty engine in ``path``; ``AlreadyPresentError`` if one exists."""
        native = _native.StorageEngine.create(
            os.fspath(path), schema.to_native(), flush_threshold_bytes, background_flush
        )
        return cls(native)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        flush_threshold_bytes: int = FLUSH_THRESHOLD_BYTES,
        background_flush: bool = True,
    ) -> StorageEngine:
        """Opens the engine in ``path`` (``NotFoundError`` if none)."""
        return cls(
            _native.StorageEngine.open(os.fspath(path), flush_threshold_bytes, background_flush)
        )

    @property
    def schema(self) -> Schema:
        """The current schema."""
        return Schema.from_native(self._native.schema())

    @property
    def last_flushed_index(self) -> int:
        """Every op with index <= this is durable in rowsets; WAL replay starts after it."""
        return self._native.last_flushed_index

    @property
    def last_applied_index(self) -> int:
        """The highest op index applied."""
        return self._native.last_applied_index

    @property
    def history_gc_mark(self) -> int:
        """The highest ancient history mark compaction collected at (persisted with the
        rowsets): a snapshot read below it is refused with ``InvalidArgumentError``."""
        return self._native.history_gc_mark

    @property
    def last_timestamp(self) -> int:
        """The newest commit timestamp applied (or held in the rowsets after a restart)."""
        return self._native.last_timestamp

    def stats(self) -> dict[str, int]:
        """Counters: mem_rows, mem_bytes, frozen_rows, frozen_bytes (the MemRowSet being
        flushed), rowsets, disk_rows, data_bytes, indexes, flushes and compactions (counts,
        durations, and compaction_bytes_written)."""
        return dict(self._native.stats())

    def background_error(self) -> str | None:
        """The last background flush failure, if any."""
        return self._native.background_error()

    # --- writes ----------------------------------------------------------------------------

    def apply(
        self, ops: pa.RecordBatch | bytes | pa.Buffer, op_index: int, timestamp: int = 0
    ) -> ApplyResult:
        """Applies an op batch (record batch or its IPC bytes) as op ``op_index`` committed
        at hybrid time ``timestamp`` (never below an earlier op's: ``IllegalStateError``).
        Every row version it writes keeps that timestamp."""
        if isinstance(ops, pa.RecordBatch):
            raw = self._native.apply_batch(ops, op_index, timestamp)
        else:
            # pyarrow buffers export signed bytes ('b'); the binding takes unsigned ones.
            view = memoryview(ops)
            unsigned = view if view.format == "B" else view.cast("B")
            raw = self._native.apply_ipc(unsigned, op_index, timestamp)
        return ApplyResult(np.frombuffer(raw, dtype=np.uint8))

    def apply_committed(
        self,
        log: NativeLog,
        after: int,
        last: int,
        read_bytes_max: int = 4 * 1024 * 1024,
    ) -> tuple[int, list[EntryOutcome], tuple[int, int, bytes] | None]:
        """Applies the committed WRITE entries after ``after`` up to ``last`` of ``log`` in
        one native call (the GIL released; row bytes never leave native memory, and the
        stored rows share the log's bytes where they are aligned, as WRITE entries lay them
        out). Each entry is applied at the timestamp in its header (0 for entries written
        before format version 3). The engine's request index decides which request ids are
        new and records them with their outcomes (``request_outcome``), persisted with every
        flush. Returns the last index handled, one outcome per WRITE entry, and the schema
        change that stopped it, if any, as (op index, schema version, document): the caller
        applies that (its index is the returned one plus one) and calls again."""
        return self._native.apply_committed(log.native, after, last, read_bytes_max)

    def admit(self, client_id: str, seq_no: int) -> int:
        """Whether request ``seq_no`` of ``client_id`` may be applied: 0 new, 1 applied
        already (``request_outcome`` has its first outcome), 2 a stale retry (the client
        declared it complete and its outcome is forgotten)."""
        return self._native.admit(client_id, seq_no)

    def request_outcome(self, client_id: str, seq_no: int) -> RequestOutcome | None:
        """The first outcome of an applied request, if it is remembered (also after a
        restart: the engine persists its request index with every flush)."""
        first = self._native.request_outcome(client_id, seq_no)
        if first is None:
            return None
        op_index, code, statuses, message, timestamp = first
        if code == 0:
            assert statuses is not None
            result = ApplyResult(np.frombuffer(statuses, dtype=np.uint8))
            return RequestOutcome(op_index, result, None, timestamp)
        return RequestOutcome(op_index, None, message, timestamp)

    @property
    def request_count(self) -> int:
        """Number of remembered requests (all clients)."""
        return self._native.request_count()

    def write(self, data: Any, op: OpType | str, op_index: int, timestamp: int = 0) -> ApplyResult:
        """Converts ``data`` (see ``nyala.rowops``) to an op batch and applies it."""
        return self.apply(make_op_batch(data, op, self.schema), op_index, timestamp)

    def flush(self) -> int | None:
        """Flushes memory to a new rowset; returns its id (None if nothing was written)."""
        return self._native.flush()

    def compact(self, ancient_history_mark: int = 0) -> bool:
        """Merges all rowsets into one; False if there was nothing to do. Per key it keeps
        every version newer than ``ancient_history_mark`` and the newest at or before it (a
        tombstone there, with nothing older kept, goes). ``history_gc_mark`` becomes the
        mark (it never moves back). Flush keeps every version."""
        return self._native.compact(ancient_history_mark)

    def compact_some(self, ancient_history_mark: int, min_rowsets: int) -> bool:
        """The background compaction: merges the run of adjacent rowsets the policy picks
        (none below ``min_rowsets`` rowsets; all of them when the newer ones add up to the
        oldest; else the run cheapest per rowset it removes), so a tablet is not rewritten
        whole every few flushes. History is collected at ``ancient_history_mark`` among the
        rowsets merged; False if nothing was picked. docs/storage-format.md, "Which rowsets"."""
        return self._native.compact_some(ancient_history_mark, min_rowsets)

    def alter_schema(self, schema: Schema, op_index: int) -> None:
        """Moves to ``schema`` (the next version) as op ``op_index``."""
        self._native.alter_schema(schema.to_native(), op_index)

    # --- reads -----------------------------------------------------------------------------

    def scan(
        self,
        columns: Sequence[str] | None = None,
        where: Sequence[Predicate] = (),
        *,
        lower_bound: Mapping[str, Any] | None = None,
        upper_bound: Mapping[str, Any] | None = None,
        limit: int | None = None,
        snapshot_ts: int | None = None,
    ) -> pa.Table:
        """Rows in key order. ``where`` holds ``(column, op, value)`` with op one of
        ``= < <= > >= in`` (value a list for ``in``) or ``is null`` / ``is not null`` (value
        None). Bounds map key column names to values: lower inclusive, upper exclusive.
        ``snapshot_ts`` None reads each key's newest version; T reads the newest version with
        a timestamp <= T (a deletion at or before T hides the key). Predicates, projection,
        bounds and ``limit`` apply to the visible version only. A T below
        ``history_gc_mark`` is ``InvalidArgumentError``."""
        args = self._scan_args(columns, where, lower_bound, upper_bound, limit)
        return self._native.scan(*args, snapshot_ts)

    def open_scan(
        self,
        columns: Sequence[str] | None = None,
        where: Sequence[Predicate] = (),
        *,
        lower_bound: Mapping[str, Any] | None = None,
        upper_bound: Mapping[str, Any] | None = None,
        limit: int | None = None,
        snapshot_ts: int | None = None,
    ) -> ScanCursor:
        """``scan`` as a cursor over one consistent view, read a batch at a time."""
        args = self._scan_args(columns, where, lower_bound, upper_bound, limit)
        return ScanCursor(self._native.open_scan(*args, snapshot_ts))

    def diff_scan(
        self,
        start_ts: int,
        end_ts: int,
        columns: Sequence[str] | None = None,
        where: Sequence[Predicate] = (),
        *,
        lower_bound: Mapping[str, Any] | None = None,
        upper_bound: Mapping[str, Any] | None = None,
        limit: int | None = None,
    ) -> pa.Table:
        """Exactly the difference between the snapshots at ``start_ts`` and ``end_ts``, in key
        order, as ``columns`` plus a bool column ``is_deleted``: per key whose visible row
        differs, its row at ``end_ts`` (``is_deleted`` false), or, for a key present at
        ``start_ts`` and absent at ``end_ts``, the key with every other column null
        (``is_deleted`` true). A key inserted and deleted inside the window is not returned.
        ``where`` filters a changed row by its values at ``end_ts`` and a deleted key by its
        values at ``start_ts``; bounds restrict keys; ``limit`` counts output rows. Both
        timestamps must be at or above ``history_gc_mark``, and ``start_ts <= end_ts``."""
        args = self._scan_args(columns, where, lower_bound, upper_bound, limit)
        return self._native.diff_scan(start_ts, end_ts, *args)

    def _scan_args(
        self,
        columns: Sequence[str] | None,
        where: Sequence[Predicate],
        lower_bound: Mapping[str, Any] | None,
        upper_bound: Mapping[str, Any] | None,
        limit: int | None,
    ) -> tuple[
        list[str] | None,
        list[tuple[str, str, pa.Array | None]],
        bytes | None,
        bytes | None,
        int | None,
    ]:
        schema = self.schema
        return (
            list(columns) if columns is not None else None,
            [self._predicate(schema, p) for p in where],
            self._bound(schema, lower_bound),
            self._bound(schema, upper_bound),
            limit,
        )

    @staticmethod
    def _predicate(schema: Schema, predicate: Predicate) -> tuple[str, str, pa.Array | None]:
        name, op, value = predicate
        column = schema.column(name)
        op = op.strip().lower()
        if op in ("is null", "is not null"):
            return (name, op, None)
        values = value if op == "in" else [value]
        if op == "in" and isinstance(value, (str, bytes)):
            raise InvalidArgumentError("'in' takes a list of values")
        params = decimal_params(column.type)
        if params is not None:  # decimal literals travel as exact text
            values = [decimal.Decimal(v) if isinstance(v, str) else v for v in values]
        try:
            array = pa.array(list(values), type=column.storage_arrow_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as err:
            raise InvalidArgumentError(f"predicate value for {name!r}: {err}") from err
        return (name, op, array)

    def _bound(self, schema: Schema, bound: Mapping[str, Any] | None) -> bytes | None:
        if bound is None:
            return None
        arrays = []
        for name in schema.key:
            if name not in bound:
                raise InvalidArgumentError(f"key bound lacks key column {name!r}")
            arrays.append(pa.array([bound[name]], type=schema.column(name).storage_arrow_type))
        keys = pa.RecordBatch.from_arrays(arrays, names=schema.key)
        return self._native.encode_keys(keys)[0]

    # --- tablet copy -----------------------------------------------------------------------

    def snapshot(self) -> StorageSnapshot:
        """Pins the current rowset files; release with ``release_snapshot``."""
        id_, index, files, image = self._native.snapshot()
        return StorageSnapshot(id_, index, [Path(f) for f in files], image)

    def release_snapshot(self, snapshot: StorageSnapshot) -> None:
        """Unpins a snapshot's files (compaction may then delete them)."""
        self._native.release_snapshot(snapshot.id)

    def pinned(self) -> _Pinned:
        """``with engine.pinned() as snapshot:`` releases the snapshot on exit."""
        return _Pinned(self)


class _Pinned:
    def __init__(self, engine: StorageEngine) -> None:
        self._engine = engine
        self._snapshot: StorageSnapshot | None = None

    def __enter__(self) -> StorageSnapshot:
        self._snapshot = self._engine.snapshot()
        return self._snapshot

    def __exit__(self, *exc: object) -> None:
        if self._snapshot is not None:
            self._engine.release_snapshot(self._snapshot)


def iter_encoded(batches: Sequence[pa.RecordBatch]) -> Iterator[pa.Buffer]:
    """IPC bytes of each op batch (for feeding a WAL)."""
    for batch in batches:
        yield encode(batch)


__all__ = [
    "CELL_BYTES_MAX",
    "FLUSH_THRESHOLD_BYTES",
    "ROW_BYTES_MAX",
    "ApplyResult",
    "EntryOutcome",
    "NativeLog",
    "RowStatus",
    "StorageEngine",
    "StorageSnapshot",
]
