"""The Spark-free write core: Arrow batches in, one client session, a report out.

Each Spark write task, and ``nyala table load FILE``, hands a stream of ``pyarrow.RecordBatch``
to a ``TableWriter``: it checks the input's schema against the table once (``WritePlan``, before
any row is sent), conforms every batch by whole columns (zero-copy where the type matches),
refuses rows with nulls in NOT NULL columns as row errors without sending them, gathers batches
up to ``batch_rows`` rows and applies them through one client session. The per-row outcomes come
back as a ``WriteReport``: counts by outcome and a bounded sample of row errors for the task's
failure message. This module imports pyarrow and the client, never pyspark.

``load_file`` reads a Parquet or CSV file batch by batch (never the whole file at once) through
the same core; CSV columns are parsed straight into the table's types.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from nyala.errors import InvalidArgumentError, NyalaError
from nyala.rowops import OpType
from nyala.schema import Schema
from nyala.spark import schema_map
from nyala.spark.options import BATCH_ROWS_DEFAULT, ROW_ERROR_SAMPLE_MAX

#: Row error codes that ``ignore_duplicate_row_errors`` treats as success (Kudu's option).
DUPLICATE_CODES = frozenset({"ALREADY_PRESENT"})
#: Keys per ``IN`` scan that reads current rows for ``ignore_null`` (storage allows 65,536).
IN_KEYS_MAX = 16_384
#: Bytes one CSV read block holds (the unit of CSV parsing and of the batches it yields).
CSV_BLOCK_BYTES = 8 << 20


class RowErrorsError(NyalaError):
    """A write left rows unapplied; ``report`` holds the counts and a sample of row errors."""

    def __init__(self, report: WriteReport) -> None:
        super().__init__(report.failure_text())
        self.report = report

    def __reduce__(self) -> tuple[type[RowErrorsError], tuple[WriteReport]]:
        return (RowErrorsError, (self.report,))


@dataclasses.dataclass
class WriteReport:
    """What one writer (a Spark task, a file load) did. Picklable: it travels to the driver."""

    table: str
    operation: str
    rows_in: int = 0
    rows_applied: int = 0
    #: Row errors by code (``ALREADY_PRESENT``, ``NOT_FOUND``, ``NULL_IN_NOT_NULL``, ...).
    errors_by_code: dict[str, int] = dataclasses.field(default_factory=dict)
    #: Row errors ignored as duplicates (``ignoreDuplicateRowErrors``).
    rows_ignored: int = 0
    #: Up to ``ROW_ERROR_SAMPLE_MAX`` ``"CODE: message (row {...})"`` lines.
    sample: list[str] = dataclasses.field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def rows_failed(self) -> int:
        """Rows that were not applied and not ignored."""
        return sum(self.errors_by_code.values())

    def add_errors(self, code: str, count: int, lines: Iterable[str]) -> None:
        """Counts ``count`` row errors of ``code``, keeping a bounded sample."""
        if count <= 0:
            return
        self.errors_by_code[code] = self.errors_by_code.get(code, 0) + count
        for line in lines:
            if len(self.sample) >= ROW_ERROR_SAMPLE_MAX:
                break
            self.sample.append(line)

    def merge(self, other: WriteReport) -> None:
        """Adds ``other``'s counts (the driver merges its tasks' reports)."""
        self.rows_in += other.rows_in
        self.rows_applied += other.rows_applied
        self.rows_ignored += other.rows_ignored
        for code, count in other.errors_by_code.items():
            self.add_errors(code, count, [])
        room = ROW_ERROR_SAMPLE_MAX - len(self.sample)
        self.sample.extend(other.sample[: max(room, 0)])
        self.elapsed_s = max(self.elapsed_s, other.elapsed_s)

    def failure_text(self) -> str:
        """One paragraph for a failed task: counts, then the sampled errors."""
        counts = ", ".join(f"{code} {n}" for code, n in sorted(self.errors_by_code.items()))
        lines = [
            f"{self.rows_failed} of {self.rows_in} rows were not applied to table "
            f"{self.table!r} ({self.operation}): {counts}; {self.rows_applied} rows were applied"
        ]
        lines += [f"  {line}" for line in self.sample]
        return "\n".join(lines)

    def to_json(self) -> str:
        """The report as one JSON object (``nyala.reportPath``, ``--format json``)."""
        out = dataclasses.asdict(self)
        out["rows_failed"] = self.rows_failed
        return json.dumps(out, sort_keys=True)


def _describe_row(batch: pa.RecordBatch, index: int, key: list[str]) -> str:
    row = batch.slice(index, 1).to_pylist()[0]
    shown = {k: row[k] for k in key if k in row} or row
    return json.dumps(shown, default=str)


class TableWriter:
    """Writes Arrow batches to one table through one client session (closed on ``close``)."""

    def __init__(
        self,
        client: Any,
        table_name: str,
        operation: OpType,
        *,
        batch_rows: int = BATCH_ROWS_DEFAULT,
        ignore_duplicate_row_errors: bool = False,
        ignore_null: bool = False,
        plan: schema_map.WritePlan | None = None,
    ) -> None:
        self._client = client
        self._table = client.table(table_name)
        self._schema: Schema = self._table.schema
        self._operation = operation
        self._batch_rows = batch_rows
        self._ignore_duplicates = ignore_duplicate_row_errors
        self._ignore_null = ignore_null
        self._plan = plan
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self.report = WriteReport(table_name, operation.name.lower())
        self._session = client.session(flush="manual")
        self._closed = False
        # One send in flight: the next rows are read and conformed while the previous ones
        # travel (sends stay in order, so a later write of a key never overtakes an earlier).
        self._sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nyala-send")
        self._inflight: Future[tuple[list[Any], int]] | None = None

    @property
    def schema(self) -> Schema:
        """The table's schema as the writer found it."""
        return self._schema

    def plan_for(self, input_schema: pa.Schema) -> schema_map.WritePlan:
        """The write plan for input of ``input_schema`` (checked once, then reused)."""
        if self._plan is None:
            self._plan = schema_map.plan_write(
                input_schema, self.report.table, self._schema, self._operation
            )
        return self._plan

    def write(self, batches: Iterable[pa.RecordBatch]) -> WriteReport:
        """Writes every batch of ``batches``, then flushes; returns the running report."""
        started = time.perf_counter()
        for batch in batches:
            self.write_batch(batch)
        self.flush()
        self._wait_inflight()
        self.report.elapsed_s += time.perf_counter() - started
        return self.report

    def write_batch(self, batch: pa.RecordBatch) -> None:
        """Conforms ``batch`` and queues it; sends once ``batch_rows`` rows are queued."""
        if batch.num_rows == 0:
            return
        plan = self.plan_for(batch.schema)
        conformed = schema_map.conform(batch, plan)
        self.report.rows_in += batch.num_rows
        refused = len(conformed.null_rows)
        if refused:
            lines = [
                f"NULL_IN_NOT_NULL: column {conformed.null_column!r} is null in row "
                + _describe_row(batch, int(i.as_py()), self._schema.key)
                for i in conformed.null_rows[:ROW_ERROR_SAMPLE_MAX]
            ]
            self.report.add_errors("NULL_IN_NOT_NULL", refused, lines)
        if conformed.batch.num_rows == 0:
            return
        self._pending.append(conformed.batch)
        self._pending_rows += conformed.batch.num_rows
        if self._pending_rows >= self._batch_rows:
            self.flush()

    def flush(self) -> None:
        """Waits for the send in flight, then starts sending the queued rows (``write`` waits
        for the last send before it returns)."""
        self._wait_inflight()
        if not self._pending:
            return
        batches, self._pending, self._pending_rows = self._pending, [], 0
        if self._ignore_null:
            # After the wait: the current values include every row sent before.
            batches = self._keep_current_values(pa.Table.from_batches(batches)).to_batches()
        self._inflight = self._sender.submit(self._send, batches)

    def _wait_inflight(self) -> None:
        """Waits for the send in flight and accounts its outcomes (raises its error)."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            errors, rows = inflight.result()
            self._account(errors, rows)

    def _keep_current_values(self, rows: pa.Table) -> pa.Table:
        """``ignoreNull``: null cells take the row's current value. nyala writes whole rows, so
        the current values are read first (one scan per ``IN_KEYS_MAX`` keys) and merged in by
        an Arrow join; a concurrent writer of the same keys between that read and this write
        is overwritten (documented in docs/spark.md)."""
        key = self._schema.key
        present = set(rows.column_names)
        nullable = [c.name for c in self._schema.columns if c.nullable and c.name in present]
        has_null = None
        for name in nullable:
            column_nulls = pc.is_null(rows.column(name))
            has_null = column_nulls if has_null is None else pc.or_(has_null, column_nulls)
        if has_null is None or not pc.any(has_null).as_py():
            return rows
        with_nulls = rows.filter(has_null)
        current = self._current_rows(with_nulls.select(key))
        if current.num_rows == 0:
            return rows
        old = {name: f"{name}__current" for name in nullable}
        current = current.select([*key, *nullable])
        joined = with_nulls.join(
            current.rename_columns([old.get(n, n) for n in current.column_names]),
            keys=key,
            join_type="left outer",
        )
        merged = joined.select(rows.column_names)
        for name in nullable:
            index = merged.column_names.index(name)
            filled = pc.coalesce(joined.column(name), joined.column(old[name]))
            merged = merged.set_column(index, name, filled)
        untouched = rows.filter(pc.invert(has_null))
        return pa.concat_tables([untouched, merged.cast(untouched.schema)])

    def _current_rows(self, keys: pa.Table) -> pa.Table:
        first = self._schema.key[0]
        values = pc.unique(keys.column(first)).to_pylist()
        parts = []
        for start in range(0, len(values), IN_KEYS_MAX):
            chunk = values[start : start + IN_KEYS_MAX]
            scan = self._table.scan(where=[(first, "in", chunk)])
            parts.append(scan.to_arrow())
        current = pa.concat_tables(parts) if parts else pa.table({})
        if len(self._schema.key) > 1 and current.num_rows:
            # IN narrows by the first key column; the join keeps only the wanted full keys.
            current = keys.join(current, keys=self._schema.key, join_type="inner")
        return current

    def _send(self, batches: list[pa.RecordBatch]) -> tuple[list[Any], int]:
        """In the sender thread: applies and flushes; (row errors, rows sent)."""
        # Batch by batch: a RecordBatch in table order and types reaches the client's op batch
        # without a copy (a multi-chunk Table would be concatenated first).
        for batch in batches:
            self._session.apply(self.report.table, batch, self._operation)
        self._session.flush()
        return self._session.pop_errors(), sum(b.num_rows for b in batches)

    def _account(self, errors: list[Any], rows: int) -> None:
        not_applied = 0
        key = self._schema.key
        for code, group in _group_errors(errors).items():
            not_applied += len(group)
            if self._ignore_duplicates and code in DUPLICATE_CODES:
                self.report.rows_ignored += len(group)
                continue
            self.report.add_errors(code, len(group), (_error_line(e, key) for e in group))
        self.report.rows_applied += rows - not_applied

    def close(self, failed: bool = False) -> None:
        """Closes the session (idempotent). Rows still queued here are dropped: ``write``
        flushes them on success. With ``failed``, a failure of the session's last flush does
        not hide the error that is already on its way."""
        if self._closed:
            return
        self._closed = True
        self._pending = []
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            # Never close the session under a send; its outcome no longer matters if failed.
            concurrent.futures.wait([inflight])
        self._sender.shutdown(wait=True)
        try:
            self._session.close()
        except Exception:
            if not failed:
                raise

    def __enter__(self) -> TableWriter:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.close(failed=exc_type is not None)


def _group_errors(errors: list[Any]) -> dict[str, list[Any]]:
    groups: dict[str, list[Any]] = {}
    for error in errors:
        code = str(getattr(error, "code", "ERROR"))
        groups.setdefault(code, []).append(error)
    return groups


def _error_line(error: Any, key: list[str]) -> str:
    code = getattr(error, "code", "ERROR")
    message = getattr(error, "message", str(error))
    values = getattr(error, "values", None) or {}
    shown = {k: values[k] for k in key if k in values}
    return f"{code}: {message} (row {json.dumps(shown, default=str)})"


# --- files --------------------------------------------------------------------------------


def file_batches(path: Path, schema: Schema, *, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Record batches of a ``.parquet`` or ``.csv`` file, read incrementally."""
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        with pq.ParquetFile(path) as parquet:
            yield from parquet.iter_batches(batch_size=batch_rows)
        return
    if suffix == ".csv":
        import pyarrow.csv as csv

        types = {c.name: c.arrow_type for c in schema.columns}
        reader = csv.open_csv(
            path,
            read_options=csv.ReadOptions(block_size=CSV_BLOCK_BYTES),
            convert_options=csv.ConvertOptions(column_types=types, strings_can_be_null=True),
        )
        yield from reader
        return
    raise InvalidArgumentError(f"{path}: expected a .parquet or .csv file")


def load_file(
    client: Any,
    table_name: str,
    path: Path | str,
    *,
    operation: OpType | str = OpType.UPSERT,
    batch_rows: int = BATCH_ROWS_DEFAULT,
) -> WriteReport:
    """Writes every row of a Parquet or CSV file to ``table_name`` (``nyala table load``).
    Raises ``RowErrorsError`` if rows were not applied (the others were)."""
    path = Path(path)
    if not path.is_file():
        raise InvalidArgumentError(f"{path}: no such file")
    op = OpType.parse(operation)
    with TableWriter(client, table_name, op, batch_rows=batch_rows) as writer:
        report = writer.write(file_batches(path, writer.schema, batch_rows=batch_rows))
    if report.rows_failed:
        raise RowErrorsError(report)
    return report


__all__ = [
    "RowErrorsError",
    "TableWriter",
    "WriteReport",
    "file_batches",
    "load_file",
]
