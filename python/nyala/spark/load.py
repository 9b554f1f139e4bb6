"""The Spark-free write core: Arrow batches in, the client's writes, a report out.

Each Spark write task, and ``nyala table load FILE``, hands a stream of ``pyarrow.RecordBatch``
to a ``TableWriter``: it checks the input's schema against the table once (``WritePlan``, before
any row is sent), selects the plan's columns from every batch (zero-copy), gathers batches up to
``batch_rows`` rows and writes them with one ``Table.write`` call each, one call in flight while
the next rows are read. Every row comes out applied, failed or unknown (docs/write-semantics.md):
the client refuses rows that break a rule of the table (a null in a NOT NULL column, a value out
of range, a cell too large, no tablet for the key) and the tablets refuse duplicate or missing
keys, row by row; rows whose requests got no answer are retried under their request ids
(``WriteResult.retry``) before they are reported unknown. The outcomes come back as a
``WriteReport``: counts by outcome and code, a bounded sample of failed rows with their key
values, and, when asked, every rejected row written to a Parquet file for reprocessing
(``RejectsFile``). This module imports pyarrow and the client, never pyspark.

``load_file`` reads a Parquet or CSV file batch by batch (never the whole file at once) through
the same core; CSV columns are parsed straight into the table's types.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nyala.errors import InvalidArgumentError, NyalaError, PartialWriteError
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
#: Times a write's unanswered requests are sent again before their rows count as unknown.
UNKNOWN_RETRIES = 2
#: Columns a rejects file adds to the rejected rows' values.
REJECT_COLUMNS = ("__row", "__error_code", "__error_message")
#: Carries each row's input position through ``ignore_null``'s merge (a reserved name).
_ROW_COLUMN = "__row"


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
    #: Rows whose requests got no answer, even after ``UNKNOWN_RETRIES`` retries: they may or
    #: may not have been applied.
    rows_unknown: int = 0
    #: Failed rows by code (``ALREADY_PRESENT``, ``NOT_FOUND``, ``INVALID_ARGUMENT``, ...).
    errors_by_code: dict[str, int] = dataclasses.field(default_factory=dict)
    #: Row errors ignored as duplicates (``ignoreDuplicateRowErrors``).
    rows_ignored: int = 0
    #: Up to ``ROW_ERROR_SAMPLE_MAX`` ``"CODE: message (row N {key})"`` lines.
    sample: list[str] = dataclasses.field(default_factory=list)
    elapsed_s: float = 0.0
    #: Per Spark task: ``{"task", "applied", "failed", "unknown"}`` (the driver's report).
    tasks: list[dict[str, int]] = dataclasses.field(default_factory=list)

    @property
    def rows_failed(self) -> int:
        """Rows that were not applied and not ignored."""
        return sum(self.errors_by_code.values())

    @property
    def rows_not_applied(self) -> int:
        """Rows failed or unknown: what ``failOnRowErrors`` and ``nyala table load`` fail on."""
        return self.rows_failed + self.rows_unknown

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
        self.rows_unknown += other.rows_unknown
        self.rows_ignored += other.rows_ignored
        for code, count in other.errors_by_code.items():
            self.add_errors(code, count, [])
        room = ROW_ERROR_SAMPLE_MAX - len(self.sample)
        self.sample.extend(other.sample[: max(room, 0)])
        self.elapsed_s = max(self.elapsed_s, other.elapsed_s)
        self.tasks.extend(other.tasks)

    def task_counts(self, task: int) -> dict[str, int]:
        """This report's counts as one task's entry of ``tasks``."""
        return {
            "task": task,
            "applied": self.rows_applied,
            "failed": self.rows_failed,
            "unknown": self.rows_unknown,
        }

    def failure_text(self) -> str:
        """One paragraph for a failed task: counts, then the sampled errors."""
        counts = ", ".join(f"{code} {n}" for code, n in sorted(self.errors_by_code.items()))
        unknown = f"; {self.rows_unknown} rows have an unknown outcome" if self.rows_unknown else ""
        lines = [
            f"{self.rows_not_applied} of {self.rows_in} rows were not applied to table "
            f"{self.table!r} ({self.operation}): {counts or 'no row errors'}{unknown}; "
            f"{self.rows_applied} rows were applied"
        ]
        lines += [f"  {line}" for line in self.sample]
        return "\n".join(lines)

    def to_json(self) -> str:
        """The report as one JSON object (``nyala.reportPath``, ``--format json``)."""
        out = dataclasses.asdict(self)
        out["rows_failed"] = self.rows_failed
        return json.dumps(out, sort_keys=True)


class RejectsFile:
    """A Parquet file of the rows a load did not apply: their values as written, then
    ``__row`` (the row's position in the input), ``__error_code`` and ``__error_message``.
    Load it back with ``--ignore-extra-columns`` once fixed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows = 0
        self._writer: Any = None

    def add(self, rows: pa.Table, errors: list[Any]) -> None:
        """Appends ``rows`` with their ``RowError``s (which name their input positions)."""
        import pyarrow.parquet as pq

        if not rows.num_rows:
            return
        extra = {
            "__row": pa.array([e.row for e in errors], pa.int64()),
            "__error_code": pa.array([e.code for e in errors], pa.string()),
            "__error_message": pa.array([e.message for e in errors], pa.string()),
        }
        for name, values in extra.items():
            rows = rows.append_column(name, values)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, rows.schema)
        self._writer.write_table(rows.cast(self._writer.schema))
        self.rows += rows.num_rows

    def close(self) -> None:
        """Finishes the file (an empty load writes none)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _error_line(error: Any) -> str:
    key = json.dumps(dict(error.key), default=str)
    return f"{error.code}: {error.message} (row {error.row} {key})"


class TableWriter:
    """Writes Arrow batches to one table through the client (closed on ``close``)."""

    def __init__(
        self,
        client: Any,
        table_name: str,
        operation: OpType,
        *,
        batch_rows: int = BATCH_ROWS_DEFAULT,
        ignore_duplicate_row_errors: bool = False,
        ignore_null: bool = False,
        ignore_extra_columns: bool = False,
        plan: schema_map.WritePlan | None = None,
        rejects: RejectsFile | None = None,
        parse_strings: bool = False,
    ) -> None:
        self._client = client
        self._table = client.table(table_name)
        self._schema: Schema = self._table.schema
        self._operation = operation
        self._batch_rows = batch_rows
        self._ignore_duplicates = ignore_duplicate_row_errors
        self._ignore_null = ignore_null
        self._ignore_extra = ignore_extra_columns
        self._plan = plan
        self._rejects = rejects
        self._parse_strings = parse_strings
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._next_row = 0  # input position of the next row given to ``write_batch``
        self.report = WriteReport(table_name, operation.name.lower())
        self._closed = False
        # One send in flight: the next rows are read and conformed while the previous ones
        # travel (sends stay in order, so a later write of a key never overtakes an earlier).
        self._sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nyala-send")
        self._inflight: Future[None] | None = None

    @property
    def schema(self) -> Schema:
        """The table's schema as the writer found it."""
        return self._schema

    def plan_for(self, input_schema: pa.Schema) -> schema_map.WritePlan:
        """The write plan for input of ``input_schema`` (checked once, then reused)."""
        if self._plan is None:
            self._plan = schema_map.plan_write(
                input_schema,
                self.report.table,
                self._schema,
                self._operation,
                ignore_extra_columns=self._ignore_extra,
                parse_strings=self._parse_strings,
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
        positions = pa.array(np.arange(self._next_row, self._next_row + batch.num_rows))
        self._next_row += batch.num_rows
        self.report.rows_in += batch.num_rows
        self._pending.append(conformed.append_column(_ROW_COLUMN, positions))
        self._pending_rows += batch.num_rows
        if self._pending_rows >= self._batch_rows:
            self.flush()

    def flush(self) -> None:
        """Waits for the send in flight, then starts sending the queued rows (``write`` waits
        for the last send before it returns)."""
        self._wait_inflight()
        if not self._pending:
            return
        batches, self._pending, self._pending_rows = self._pending, [], 0
        rows = pa.Table.from_batches(batches)
        if self._ignore_null:
            # After the wait: the current values include every row sent before.
            rows = self._keep_current_values(rows)
        self._inflight = self._sender.submit(self._send, rows)

    def _wait_inflight(self) -> None:
        """Waits for the send in flight (raises its error)."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            inflight.result()

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
        with_nulls, current = _align(with_nulls, current, [*key, *nullable])
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
        return pa.concat_tables([untouched.cast(merged.schema), merged])

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

    def _send(self, rows: pa.Table) -> None:
        """In the sender thread: one write of ``rows``, its unanswered requests retried, its
        outcomes accounted."""
        positions = rows.column(_ROW_COLUMN).to_numpy()
        batch = rows.drop_columns([_ROW_COLUMN]).combine_chunks().to_batches()
        data = batch[0] if batch else rows.drop_columns([_ROW_COLUMN])
        try:
            result = self._table.write(data, self._operation)
        except PartialWriteError as exc:
            result = exc.result
        for _ in range(UNKNOWN_RETRIES):
            if not result.retriable:
                break
            try:
                result = result.retry()
            except PartialWriteError as exc:
                result = exc.result
        self._account(result, positions)

    def _account(self, result: Any, positions: np.ndarray[Any, Any]) -> None:
        """Counts one write's outcomes; rows are named by their input positions."""
        report = self.report
        report.rows_applied += result.applied
        report.rows_unknown += len(result.unknown)
        kept = [
            i
            for i, e in enumerate(result.row_errors)
            if not (self._ignore_duplicates and e.code in DUPLICATE_CODES)
        ]
        report.rows_ignored += len(result.row_errors) - len(kept)
        failed = [_at_input(result.row_errors[i], positions) for i in kept]
        unknown = [_at_input(e, positions) for e in result.unknown]
        for error in failed:
            report.add_errors(error.code, 1, [_error_line(error)])
        for error in unknown:
            if len(report.sample) < ROW_ERROR_SAMPLE_MAX:
                report.sample.append(_error_line(error))
        if self._rejects is not None:
            if failed:
                self._rejects.add(result.failed_rows.take(kept), failed)
            if unknown:
                self._rejects.add(result.unknown_rows, unknown)

    def close(self, failed: bool = False) -> None:
        """Stops the writer (idempotent). Rows still queued here are dropped: ``write``
        flushes them on success. With ``failed``, the outcome of a send still in flight no
        longer matters (the error on its way is the one reported)."""
        if self._closed:
            return
        self._closed = True
        self._pending = []
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            concurrent.futures.wait([inflight])
            if not failed:
                inflight.result()
        self._sender.shutdown(wait=True)

    def __enter__(self) -> TableWriter:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.close(failed=exc_type is not None)


def _align(rows: pa.Table, current: pa.Table, names: list[str]) -> tuple[pa.Table, pa.Table]:
    """``rows`` (the input's types) and ``current`` (the table's) with ``names`` in one type
    each, the wider: the input's columns are converted by the client only when they are
    sent, so a narrower or wider one meets the stored values here."""
    for name in names:
        given, stored = rows.schema.field(name).type, current.schema.field(name).type
        if given == stored:
            continue
        source, target = schema_map.nyala_type_of(given), schema_map.nyala_type_of(stored)
        if (
            source is not None
            and target is not None
            and schema_map.converts_losslessly(source, target)
        ):
            index = rows.schema.get_field_index(name)
            rows = rows.set_column(index, name, rows.column(name).cast(stored))
        else:
            index = current.schema.get_field_index(name)
            current = current.set_column(index, name, current.column(name).cast(given))
    return rows, current


def _at_input(error: Any, positions: np.ndarray[Any, Any]) -> Any:
    """``error`` naming its row by input position instead of its position in one write."""
    return dataclasses.replace(error, row=int(positions[error.row]))


# --- files --------------------------------------------------------------------------------


class InputFile:
    """A Parquet or CSV file read incrementally, with how far the reading got: ``total`` and
    ``done`` count rows (Parquet) or bytes (CSV, whose row count is unknown until the end).

    CSV columns are read as text and converted by the client, so a value that does not parse
    fails its row alone, not the file from that point on."""

    def __init__(self, path: Path, schema: Schema, *, batch_rows: int) -> None:
        suffix = path.suffix.lower()
        if suffix not in (".parquet", ".pq", ".csv"):
            raise InvalidArgumentError(f"{path}: expected a .parquet or .csv file")
        self.path = path
        self.unit = "bytes" if suffix == ".csv" else "rows"
        self._schema = schema
        self._batch_rows = batch_rows
        self._handle: Any = None
        self.done = 0
        if self.unit == "rows":
            import pyarrow.parquet as pq

            self.total = int(pq.ParquetFile(path).metadata.num_rows)
        else:
            self.total = path.stat().st_size

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The file's record batches, in order."""
        if self.unit == "rows":
            import pyarrow.parquet as pq

            with pq.ParquetFile(self.path) as parquet:
                for batch in parquet.iter_batches(batch_size=self._batch_rows):
                    self.done += batch.num_rows
                    yield batch
            return
        import pyarrow.csv as csv

        types = {c.name: pa.string() for c in self._schema.columns}
        with open(self.path, "rb") as handle:
            reader = csv.open_csv(
                handle,
                read_options=csv.ReadOptions(block_size=CSV_BLOCK_BYTES),
                convert_options=csv.ConvertOptions(column_types=types, strings_can_be_null=True),
            )
            for batch in reader:
                self.done = min(handle.tell(), self.total)
                yield batch
        self.done = self.total


def file_batches(path: Path, schema: Schema, *, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Record batches of a ``.parquet`` or ``.csv`` file, read incrementally."""
    return InputFile(path, schema, batch_rows=batch_rows).batches()


def load_file(
    client: Any,
    table_name: str,
    path: Path | str,
    *,
    operation: OpType | str = OpType.UPSERT,
    batch_rows: int = BATCH_ROWS_DEFAULT,
    ignore_extra_columns: bool = False,
    rejects: Path | str | None = None,
    on_batch: Callable[[InputFile, WriteReport], None] | None = None,
) -> WriteReport:
    """Writes every row of a Parquet or CSV file to ``table_name`` (``nyala table load``).
    Rows not applied go to the Parquet file ``rejects`` when given; ``on_batch`` is called
    after each batch read (for a progress display). Raises ``RowErrorsError`` if rows were
    not applied (the others were)."""
    path = Path(path)
    if not path.is_file():
        raise InvalidArgumentError(f"{path}: no such file")
    op = OpType.parse(operation)
    rejected = RejectsFile(Path(rejects)) if rejects is not None else None
    try:
        schema = client.table(table_name).schema
        source = InputFile(path, schema, batch_rows=batch_rows)
        with TableWriter(
            client,
            table_name,
            op,
            batch_rows=batch_rows,
            ignore_extra_columns=ignore_extra_columns,
            rejects=rejected,
            # Text columns (all of a CSV's; a rejects file of one) are parsed row by row.
            parse_strings=True,
        ) as writer:
            started = time.perf_counter()
            for batch in source.batches():
                writer.write_batch(batch)
                if on_batch is not None:
                    on_batch(source, writer.report)
            report = writer.write(())
            report.elapsed_s = time.perf_counter() - started
    finally:
        if rejected is not None:
            rejected.close()
    if report.rows_not_applied:
        raise RowErrorsError(report)
    return report


__all__ = [
    "REJECT_COLUMNS",
    "InputFile",
    "RejectsFile",
    "RowErrorsError",
    "TableWriter",
    "WriteReport",
    "file_batches",
    "load_file",
]
