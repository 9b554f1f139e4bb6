"""Sessions: buffered writes with manual or background flushing and an error collector.

``session.upsert("events", data)`` converts ``data`` to an op batch at once: a problem of the
input as a whole (a column the table lacks, a missing NOT NULL column) raises at that call, and
rows that break a rule of the table (a null in a NOT NULL column, a value out of range, a cell
over the size limit) are collected as errors there and then; the other rows are buffered.
``flush="manual"`` sends on ``flush()``; ``flush="background"`` sends from a background thread
once ``flush_rows`` are buffered or every ``flush_interval_ms``. The buffer is bounded by
``buffer_bytes_max``: a manual session refuses more (``IllegalStateError``: flush first), a
background one blocks the caller until the flusher made room (back-pressure).

Every row ends in one of three places (Kudu's error collector, extended by the unknown
outcome): applied; in ``errors`` (``SessionError``: table, which ``apply`` call and which of its
rows, code, reason, key and values), bounded by ``session_error_rows_max`` with
``error_buffer_overflowed`` set once rows were left out; or in ``unknown`` when its request got
no answer (``retry_unknown()`` resends those under their request ids). A flush never raises for
a row's problem; a flush that could not send at all (no tablet locations, say) records its rows
as errors and raises at the next ``flush()``/``close()``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from nyala import errors
from nyala.client.write import RowError, WriteResult, error_code
from nyala.rowops import OP_COLUMN, OpType, PreparedRows

#: Buffered Arrow bytes a session holds at most (all tables).
SESSION_BUFFER_BYTES_MAX = 256 * 1024 * 1024
#: A background session flushes once this many rows are buffered...
SESSION_FLUSH_ROWS = 100_000
#: ...or when this long has passed since the last flush, in milliseconds.
SESSION_FLUSH_INTERVAL_MS = 1_000
#: Failed rows a session keeps in ``errors`` at most (Kudu bounds its error collector too);
#: later ones are counted out by ``error_buffer_overflowed``.
SESSION_ERROR_ROWS_MAX = 10_000


@dataclass(frozen=True)
class SessionError:
    """One row that failed (or whose outcome is unknown) in a session: its table, the
    ``apply`` call that gave it (0 for the session's first) and its position in that call's
    data, an ``ErrorCode`` name, why, its key and its values."""

    table: str
    call: int
    row: int
    code: str
    message: str
    key: dict[str, Any] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    #: ``"failed"`` or ``"unknown"``.
    outcome: str = "failed"


@dataclass
class _Buffered:
    """Rows of one ``apply`` call waiting to be sent: the op batch of its good rows, and
    where each row came from."""

    batch: pa.RecordBatch
    call: int
    positions: np.ndarray[Any, Any]


@dataclass
class _Unresolved:
    """A flush's write whose rows are partly unknown, with where its rows came from."""

    table: str
    result: WriteResult
    calls: np.ndarray[Any, Any]
    positions: np.ndarray[Any, Any]


class Session:
    """Buffers writes to any tables of one client. Use as a context manager (flushes and
    closes on exit)."""

    def __init__(
        self,
        make_batch: Callable[[str, Any, OpType, bool], tuple[Any, PreparedRows]],
        write: Callable[[Any, PreparedRows], WriteResult],
        *,
        flush: str = "manual",
        buffer_bytes_max: int = SESSION_BUFFER_BYTES_MAX,
        flush_rows: int = SESSION_FLUSH_ROWS,
        flush_interval_ms: int = SESSION_FLUSH_INTERVAL_MS,
        session_error_rows_max: int = SESSION_ERROR_ROWS_MAX,
        ignore_extra_columns: bool = False,
    ) -> None:
        if flush not in ("manual", "background"):
            raise errors.InvalidArgumentError("flush must be 'manual' or 'background'")
        if session_error_rows_max < 0:
            raise errors.InvalidArgumentError("session_error_rows_max must be >= 0")
        self.mode = flush
        self.buffer_bytes_max = buffer_bytes_max
        self.flush_rows = flush_rows
        self.flush_interval_ms = flush_interval_ms
        self.session_error_rows_max = session_error_rows_max
        self.ignore_extra_columns = ignore_extra_columns
        self._make_batch = make_batch
        self._write = write
        # table name -> (table info, buffered rows); guarded by _cond.
        self._buffer: dict[str, tuple[Any, list[_Buffered]]] = {}
        self._buffered_rows = 0
        self._buffered_bytes = 0
        self._calls = 0
        self._errors: list[SessionError] = []
        self._overflowed = False
        self._unresolved: list[_Unresolved] = []
        self._failure: BaseException | None = None
        self._flushing = False
        self._closed = False
        self._cond = threading.Condition()
        self._flusher: threading.Thread | None = None
        if flush == "background":
            self._flusher = threading.Thread(
                target=self._background, name="nyala-session-flush", daemon=True
            )
            self._flusher.start()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # --- applying ---------------------------------------------------------------------------

    def insert(self, table: str, data: Any) -> None:
        """Buffers inserts of ``data``'s rows into ``table``."""
        self.apply(table, data, OpType.INSERT)

    def upsert(self, table: str, data: Any) -> None:
        """Buffers upserts."""
        self.apply(table, data, OpType.UPSERT)

    def update(self, table: str, data: Any) -> None:
        """Buffers updates."""
        self.apply(table, data, OpType.UPDATE)

    def delete(self, table: str, keys: Any) -> None:
        """Buffers deletes of the rows with these keys."""
        self.apply(table, keys, OpType.DELETE)

    def apply(self, table: str, data: Any, op: OpType | str) -> None:
        """Buffers ``data`` as operation ``op`` on ``table``; its rows that break a rule of
        the table go to ``errors`` at once."""
        info, prepared = self._make_batch(table, data, OpType.parse(op), self.ignore_extra_columns)
        selection = prepared.selection()
        batch = prepared.batch
        if selection is None:
            positions = np.arange(batch.num_rows)
        else:
            positions = selection.astype(np.int64)
            batch = batch.take(pa.array(selection))
        size = batch.nbytes
        with self._cond:
            self._check_open()
            while (
                batch.num_rows
                and self._buffered_bytes
                and self._buffered_bytes + size > self.buffer_bytes_max
            ):
                if self.mode == "manual":
                    raise errors.IllegalStateError(
                        f"session buffer full ({self._buffered_bytes} bytes); flush() first"
                    )
                self._cond.notify_all()
                self._cond.wait()
                self._check_open()
            call = self._calls
            self._calls += 1
            if prepared.problems:
                self._refused(table, call, prepared, list(info.schema.key))
            if not batch.num_rows:
                return
            entry = self._buffer.setdefault(table, (info, []))
            entry[1].append(_Buffered(batch, call, positions))
            self._buffered_rows += batch.num_rows
            self._buffered_bytes += size
            if self._buffered_rows >= self.flush_rows:
                self._cond.notify_all()

    def _refused(self, table: str, call: int, prepared: PreparedRows, key: list[str]) -> None:
        """Records the rows ``prepare_op_batch`` refused (the lock is held)."""
        rows = pa.array([p.row for p in prepared.problems], pa.int64())
        values = prepared.input.take(rows).to_pylist()
        self._keep_errors(
            [
                SessionError(
                    table,
                    call,
                    problem.row,
                    problem.code,
                    problem.message,
                    {k: row_values.get(k) for k in key},
                    row_values,
                )
                for problem, row_values in zip(prepared.problems, values, strict=True)
            ]
        )

    # --- flushing ---------------------------------------------------------------------------

    def flush(self) -> None:
        """Sends everything buffered and waits. Row problems go to ``errors`` and unknown
        outcomes to ``unknown``; raises only a failure to send at all, of this or an earlier
        background flush (its rows are in ``errors``)."""
        self._flush_once()
        with self._cond:
            while self._flushing:
                self._cond.wait()
            failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    @property
    def errors(self) -> list[SessionError]:
        """Rows that failed so far (a copy; at most ``session_error_rows_max``)."""
        with self._cond:
            return list(self._errors)

    @property
    def error_buffer_overflowed(self) -> bool:
        """True if rows failed that ``errors`` could not keep (Kudu's
        ``error_buffer_overflowed``); cleared by ``pop_errors``."""
        with self._cond:
            return self._overflowed

    def pop_errors(self) -> list[SessionError]:
        """Rows that failed so far, clearing the collector and its overflow flag."""
        with self._cond:
            out, self._errors = self._errors, []
            self._overflowed = False
            return out

    @property
    def unknown(self) -> list[SessionError]:
        """Rows whose outcome is unknown: their requests got no answer before the deadline
        (they may or may not have been applied). ``retry_unknown()`` settles them."""
        with self._cond:
            unresolved = list(self._unresolved)
        out: list[SessionError] = []
        for entry in unresolved:
            out += _session_errors(entry, entry.result.unknown, "unknown")
        return out

    def retry_unknown(self, *, timeout_ms: int | None = None) -> None:
        """Resends the requests behind ``unknown`` (and the rows held back after them) under
        their original request ids; rows that fail go to ``errors``, and rows that stay
        unknown stay in ``unknown``."""
        with self._cond:
            unresolved, self._unresolved = self._unresolved, []
        for i, entry in enumerate(unresolved):
            try:
                result = entry.result.retry(timeout_ms=timeout_ms)
            except errors.PartialWriteError as exc:
                result = exc.result
            except BaseException:
                with self._cond:  # not retried (e.g. no tablet locations): still unknown
                    self._unresolved.extend(unresolved[i:])
                raise
            self._settle(_Unresolved(entry.table, result, entry.calls, entry.positions))

    @property
    def pending_rows(self) -> int:
        """Rows buffered and not yet sent."""
        with self._cond:
            return self._buffered_rows

    def close(self) -> None:
        """Flushes, stops the background flusher, and refuses further writes."""
        try:
            self.flush()
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            if self._flusher is not None:
                self._flusher.join()

    def _check_open(self) -> None:
        if self._closed:
            raise errors.IllegalStateError("the session is closed")

    def _take(self) -> dict[str, tuple[Any, list[_Buffered]]]:
        taken, self._buffer = self._buffer, {}
        self._buffered_rows = 0
        self._buffered_bytes = 0
        return taken

    def _flush_once(self) -> None:
        with self._cond:
            while self._flushing:
                self._cond.wait()
            taken = self._take()
            self._flushing = True
        try:
            for name, (info, buffered) in taken.items():
                for group in _merge(buffered):
                    self._send(name, info, group)
        finally:
            with self._cond:
                self._flushing = False
                self._cond.notify_all()

    def _send(self, name: str, info: Any, group: _Buffered | list[_Buffered]) -> None:
        parts = group if isinstance(group, list) else [group]
        batch = _concat([p.batch for p in parts])
        calls = np.concatenate([np.full(p.batch.num_rows, p.call) for p in parts])
        positions = np.concatenate([p.positions for p in parts])
        rows = batch.drop_columns([OP_COLUMN])
        prepared = PreparedRows(batch, [], rows)
        try:
            result = self._write(info, prepared)
        except BaseException as exc:  # nothing was sent: every row failed with this error
            values = rows.to_pylist()
            failed = [
                SessionError(
                    name,
                    int(calls[i]),
                    int(positions[i]),
                    error_code(exc),
                    f"not sent: {exc}",
                    {k: values[i][k] for k in info.schema.key},
                    values[i],
                )
                for i in range(batch.num_rows)
            ]
            with self._cond:
                self._keep_errors(failed)
                self._failure = self._failure or exc
            return
        self._settle(_Unresolved(name, result, calls, positions))

    def _settle(self, entry: _Unresolved) -> None:
        """Files a write's failed rows under ``errors`` and keeps it while rows are unknown."""
        failed = _session_errors(entry, entry.result.row_errors, "failed")
        with self._cond:
            self._keep_errors(failed)
            if entry.result.retriable:
                self._unresolved.append(entry)

    def _keep_errors(self, found: list[SessionError]) -> None:
        """Adds ``found`` to ``errors`` up to the bound (the lock is held)."""
        room = self.session_error_rows_max - len(self._errors)
        if len(found) > room:
            self._overflowed = True
            found = found[: max(room, 0)]
        self._errors.extend(found)

    def _background(self) -> None:
        interval_s = self.flush_interval_ms / 1000
        while True:
            with self._cond:
                if not self._closed and self._buffered_rows < self.flush_rows:
                    self._cond.wait(timeout=interval_s)
                if self._closed and not self._buffered_rows:
                    return
                if not self._buffered_rows:
                    continue
            self._flush_once()


def _session_errors(
    entry: _Unresolved, row_errors: list[RowError], outcome: str
) -> list[SessionError]:
    """``row_errors`` of ``entry``'s write (its failed or its unknown rows, in row order) as
    session errors naming the ``apply`` call and row each came from."""
    if not row_errors:
        return []
    table = entry.result.failed_rows if outcome == "failed" else entry.result.unknown_rows
    assert table is not None, "rows come with their errors"
    assert table.num_rows == len(row_errors), "one row per error"
    return [
        SessionError(
            entry.table,
            int(entry.calls[e.row]),
            int(entry.positions[e.row]),
            e.code,
            e.message,
            dict(e.key),
            row_values,
            outcome,
        )
        for e, row_values in zip(row_errors, table.to_pylist(), strict=True)
    ]


def _merge(buffered: list[_Buffered]) -> list[list[_Buffered]]:
    """Buffered batches of one table grouped where their columns agree (fewer, larger
    RPCs)."""
    groups: list[list[_Buffered]] = []
    for part in buffered:
        if groups and groups[-1][0].batch.schema == part.batch.schema:
            groups[-1].append(part)
        else:
            groups.append([part])
    return groups


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


__all__ = ["SESSION_ERROR_ROWS_MAX", "Session", "SessionError"]
