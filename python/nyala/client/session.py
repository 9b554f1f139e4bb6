"""Sessions: buffered writes with manual or background flushing and an error collector.

``session.upsert("events", data)`` converts ``data`` to an op batch at once (so bad input fails
at the call that gave it) and buffers it. ``flush="manual"`` sends on ``flush()``;
``flush="background"`` sends from a background thread once ``flush_rows`` are buffered or every
``flush_interval_ms``. The buffer is bounded by ``buffer_bytes_max``: a manual session refuses
more (``IllegalStateError``: flush first), a background one blocks the caller until the flusher
made room (back-pressure). Per-row failures are collected (``errors``); a failed flush is kept
and raised by the next ``flush()``/``close()``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from nyala import errors
from nyala.client.write import RowError, WriteResult
from nyala.rowops import OpType

#: Buffered Arrow bytes a session holds at most (all tables).
SESSION_BUFFER_BYTES_MAX = 256 * 1024 * 1024
#: A background session flushes once this many rows are buffered...
SESSION_FLUSH_ROWS = 100_000
#: ...or when this long has passed since the last flush, in milliseconds.
SESSION_FLUSH_INTERVAL_MS = 1_000


class SessionError:
    """One row that failed in a session flush: the table, the row's position among that
    table's rows in the flush, the error, and the row's values."""

    def __init__(self, table: str, error: RowError, row: dict[str, Any]) -> None:
        self.table = table
        self.row = error.row
        self.code = error.code
        self.message = error.message
        self.values = row

    def __repr__(self) -> str:
        return f"SessionError({self.table!r}, row={self.row}, {self.code}: {self.values})"


class Session:
    """Buffers writes to any tables of one client. Use as a context manager (flushes and
    closes on exit)."""

    def __init__(
        self,
        make_batch: Callable[[str, Any, OpType], tuple[Any, pa.RecordBatch]],
        write: Callable[[Any, pa.RecordBatch], WriteResult],
        *,
        flush: str = "manual",
        buffer_bytes_max: int = SESSION_BUFFER_BYTES_MAX,
        flush_rows: int = SESSION_FLUSH_ROWS,
        flush_interval_ms: int = SESSION_FLUSH_INTERVAL_MS,
    ) -> None:
        if flush not in ("manual", "background"):
            raise errors.InvalidArgumentError("flush must be 'manual' or 'background'")
        self.mode = flush
        self.buffer_bytes_max = buffer_bytes_max
        self.flush_rows = flush_rows
        self.flush_interval_ms = flush_interval_ms
        self._make_batch = make_batch
        self._write = write
        # table name -> (table info, buffered op batches); guarded by _cond.
        self._buffer: dict[str, tuple[Any, list[pa.RecordBatch]]] = {}
        self._buffered_rows = 0
        self._buffered_bytes = 0
        self._errors: list[SessionError] = []
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
        """Buffers ``data`` as operation ``op`` on ``table``."""
        info, batch = self._make_batch(table, data, OpType.parse(op))
        size = batch.nbytes
        with self._cond:
            self._check_open()
            while self._buffered_bytes and self._buffered_bytes + size > self.buffer_bytes_max:
                if self.mode == "manual":
                    raise errors.IllegalStateError(
                        f"session buffer full ({self._buffered_bytes} bytes); flush() first"
                    )
                self._cond.notify_all()
                self._cond.wait()
                self._check_open()
            entry = self._buffer.setdefault(table, (info, []))
            entry[1].append(batch)
            self._buffered_rows += batch.num_rows
            self._buffered_bytes += size
            if self._buffered_rows >= self.flush_rows:
                self._cond.notify_all()

    # --- flushing ---------------------------------------------------------------------------

    def flush(self) -> None:
        """Sends everything buffered and waits; raises a failure of this or an earlier
        background flush (the rows of a failed flush may or may not have been applied)."""
        self._flush_once()
        with self._cond:
            while self._flushing:
                self._cond.wait()
            failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    @property
    def errors(self) -> list[SessionError]:
        """Rows that failed so far (a copy)."""
        with self._cond:
            return list(self._errors)

    def pop_errors(self) -> list[SessionError]:
        """Rows that failed so far, clearing the collector."""
        with self._cond:
            out, self._errors = self._errors, []
            return out

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

    def _take(self) -> dict[str, tuple[Any, list[pa.RecordBatch]]]:
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
            for name, (info, batches) in taken.items():
                self._send(name, info, batches)
        except BaseException as exc:  # kept for the caller of flush()/close()
            with self._cond:
                self._failure = self._failure or exc
        finally:
            with self._cond:
                self._flushing = False
                self._cond.notify_all()

    def _send(self, name: str, info: Any, batches: list[pa.RecordBatch]) -> None:
        for batch in _merge(batches):
            result = self._write(info, batch)
            if result.row_errors and result.failed_rows is not None:
                rows = result.failed_rows.to_pylist()
                found = [
                    SessionError(name, e, r) for e, r in zip(result.row_errors, rows, strict=True)
                ]
                with self._cond:
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


def _merge(batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """Batches of one table merged where their columns agree (fewer, larger RPCs)."""
    groups: list[list[pa.RecordBatch]] = []
    for batch in batches:
        if groups and groups[-1][0].schema == batch.schema:
            groups[-1].append(batch)
        else:
            groups.append([batch])
    return [
        g[0] if len(g) == 1 else pa.Table.from_batches(g).combine_chunks().to_batches()[0]
        for g in groups
    ]


__all__ = ["Session", "SessionError"]
