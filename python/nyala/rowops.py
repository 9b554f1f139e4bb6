"""Row operations: turning numpy / pyarrow / pandas data into the Arrow op batch.

An op batch is one Arrow record batch holding the table's columns plus ``__op`` (uint8, one
``OpType`` per row); its IPC stream bytes are what the client sends and the WAL stores. This
module does no per-row Python work: columns are converted as whole arrays, and fixed-width
columns without nulls whose type already matches (numpy ``int64`` for an ``int64`` column,
say) are wrapped without copying.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nyala import _native
from nyala.errors import InvalidArgumentError
from nyala.schema import Schema

#: Name of the op-type column.
OP_COLUMN = "__op"


class OpType(enum.IntEnum):
    """The kinds of row operation (values of ``__op``)."""

    INSERT = 1
    INSERT_IGNORE = 2
    UPSERT = 3
    UPDATE = 4
    UPDATE_IGNORE = 5
    DELETE = 6
    DELETE_IGNORE = 7

    @classmethod
    def parse(cls, value: OpType | str | int) -> OpType:
        """An ``OpType`` from itself, its name (any case) or its code."""
        if isinstance(value, OpType):
            return value
        if isinstance(value, str):
            try:
                return cls[value.strip().upper().replace("-", "_")]
            except KeyError:
                raise InvalidArgumentError(f"unknown operation {value!r}") from None
        try:
            return cls(int(value))
        except ValueError:
            raise InvalidArgumentError(f"unknown operation code {value!r}") from None

    @property
    def is_delete(self) -> bool:
        """True for the kinds that need only key columns."""
        return self in (OpType.DELETE, OpType.DELETE_IGNORE)


def to_record_batch(data: Any) -> pa.RecordBatch:
    """One record batch from a pyarrow RecordBatch/Table, a pandas DataFrame or a mapping of
    column name to numpy array / pyarrow array / sequence."""
    if isinstance(data, pa.RecordBatch):
        return data
    if isinstance(data, pa.Table):
        batches = data.combine_chunks().to_batches()
        if not batches:
            return pa.RecordBatch.from_pylist([], schema=data.schema)
        return batches[0]
    if isinstance(data, Mapping):
        arrays = [_to_array(values) for values in data.values()]
        return pa.RecordBatch.from_arrays(arrays, names=[str(n) for n in data])
    if type(data).__module__.startswith("pandas"):
        return pa.RecordBatch.from_pandas(data, preserve_index=False)
    if hasattr(data, "__arrow_c_array__"):
        return pa.record_batch(data)
    if hasattr(data, "__arrow_c_stream__"):
        # Read whole here; Table.write streams such input in bounded memory instead.
        return to_record_batch(pa.RecordBatchReader.from_stream(data).read_all())
    raise InvalidArgumentError(
        f"cannot make rows from {type(data).__name__}: expected a pyarrow RecordBatch or "
        "Table, a pandas DataFrame, a dict of arrays, or an object exporting "
        "__arrow_c_array__ or __arrow_c_stream__"
    )


def is_arrow_stream(data: Any) -> bool:
    """True for input best read as a stream of batches: an object exporting
    ``__arrow_c_stream__`` (a RecordBatchReader, a polars DataFrame, a DuckDB relation, a
    nyala Scanner) other than a pyarrow Table, which is already in memory, and a pandas
    DataFrame, whose stream would carry its index as a column."""
    if isinstance(data, (pa.Table, pa.RecordBatch)) or type(data).__module__.startswith("pandas"):
        return False
    return hasattr(data, "__arrow_c_stream__")


def stream_chunks(data: Any, rows_max: int) -> Iterator[pa.RecordBatch]:
    """The batches of an Arrow stream (``is_arrow_stream``), cut or joined into batches of at
    most ``rows_max`` rows, read one at a time as they are asked for."""
    reader = pa.RecordBatchReader.from_stream(data)
    pending: list[pa.RecordBatch] = []
    pending_rows = 0
    for batch in reader:
        offset = 0
        while offset < batch.num_rows:
            take = min(rows_max - pending_rows, batch.num_rows - offset)
            pending.append(batch.slice(offset, take))
            pending_rows += take
            offset += take
            if pending_rows == rows_max:
                yield pa.Table.from_batches(pending).combine_chunks().to_batches()[0]
                pending, pending_rows = [], 0
    if pending_rows:
        yield pa.Table.from_batches(pending).combine_chunks().to_batches()[0]


def _to_array(values: Any) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks()
    if isinstance(values, pa.Array):
        return values
    if isinstance(values, np.ma.MaskedArray):
        return pa.array(values.data, mask=np.ma.getmaskarray(values))
    if isinstance(values, np.ndarray):
        # Zero-copy for fixed-width numeric arrays; pyarrow copies only when it must.
        return pa.array(values)
    return pa.array(values)


@dataclasses.dataclass(frozen=True)
class RowProblem:
    """A row refused before it is sent: its position, an ``ErrorCode`` name, and why."""

    row: int
    code: str
    message: str


@dataclasses.dataclass(frozen=True)
class PreparedRows:
    """The caller's rows as an op batch for one table, and the rows that cannot be written.

    ``batch`` holds every input row (a refused row's offending cells may read as null);
    ``problems`` lists the refused rows, ascending; ``input`` is the caller's data as given
    (the values that error reports and reject files show)."""

    batch: pa.RecordBatch
    problems: list[RowProblem]
    input: pa.RecordBatch

    def selection(self) -> np.ndarray[Any, np.dtype[np.uint32]] | None:
        """Positions of the rows to send, ascending; None for all of them."""
        if not self.problems:
            return None
        keep = np.ones(self.batch.num_rows, dtype=bool)
        keep[[p.row for p in self.problems]] = False
        return np.flatnonzero(keep).astype(np.uint32)


def prepare_op_batch(
    data: Any,
    op: OpType | str | int | np.ndarray[Any, Any] | pa.Array,
    schema: Schema,
    *,
    ignore_extra_columns: bool = False,
) -> PreparedRows:
    """The op batch for ``data`` against ``schema``, with the rows that break a rule of it.

    ``op`` is one operation for every row or an array of op codes, one per row. Columns are
    put in schema order and cast to the schema's types (a no-op, hence zero-copy, when they
    already match). Problems of the whole input raise ``InvalidArgumentError``: a column the
    table lacks (unless ``ignore_extra_columns``), a missing key column, a missing NOT NULL
    column without a default, any missing column when rows update (updates replace whole
    rows), a column that cannot convert at all. Problems of single rows are returned, not
    raised: a value out of range for its column's type (here), and a null in a NOT NULL column,
    a cell over ``CELL_BYTES_MAX``, a row over ``ROW_BYTES_MAX`` (``_native.check_op_batch``,
    the checks every tablet replica applies). Columns left out are filled by the tablet server
    with their default or null for INSERT and UPSERT rows (Kudu's write default); batches of
    only deletes need only the key columns.
    """
    batch = to_record_batch(data)
    rows = batch.num_rows
    ops = _op_array(op, rows)
    only_deletes, has_updates = _op_kinds(op, ops)
    present = batch.schema.names
    if len(set(present)) != len(present):
        raise InvalidArgumentError(f"the rows name a column twice: {present}")
    check_columns(set(present), schema, only_deletes, has_updates, ignore_extra_columns)
    names: list[str] = []
    arrays: list[pa.Array] = []
    problems: dict[int, RowProblem] = {}
    for column in schema.columns:
        if column.name not in present:
            continue
        array = batch.column(column.name)
        if array.type != column.arrow_type:
            array, bad = _cast_rows(array, column.arrow_type, column.name)
            for row, message in bad:
                problems.setdefault(row, RowProblem(row, "INVALID_ARGUMENT", message))
        names.append(column.name)
        arrays.append(array)
    names.append(OP_COLUMN)
    arrays.append(ops)
    out = pa.RecordBatch.from_arrays(arrays, names=names)
    for row, _status, message in _native.check_op_batch(out, schema.to_native()):
        problems.setdefault(row, RowProblem(row, "INVALID_ARGUMENT", message))
    given = batch.drop_columns([OP_COLUMN]) if OP_COLUMN in present else batch
    return PreparedRows(out, [problems[r] for r in sorted(problems)], given)


def make_op_batch(
    data: Any,
    op: OpType | str | int | np.ndarray[Any, Any] | pa.Array,
    schema: Schema,
    *,
    ignore_extra_columns: bool = False,
) -> pa.RecordBatch:
    """``prepare_op_batch``'s op batch, for callers that want all rows or none: the first
    refused row raises ``InvalidArgumentError``."""
    prepared = prepare_op_batch(data, op, schema, ignore_extra_columns=ignore_extra_columns)
    if prepared.problems:
        first = prepared.problems[0]
        raise InvalidArgumentError(f"row {first.row}: {first.message}")
    return prepared.batch


def check_columns(
    present: set[str],
    schema: Schema,
    only_deletes: bool,
    has_updates: bool,
    ignore_extra_columns: bool,
) -> None:
    """Raises for input columns the table lacks and for columns the rows must carry."""
    unknown = present - set(schema.names) - {OP_COLUMN}
    if unknown and not ignore_extra_columns:
        raise InvalidArgumentError(
            f"column(s) {sorted(unknown)} are not in the table (ignore_extra_columns=True "
            "drops them)"
        )
    missing_key = [k for k in schema.key if k not in present]
    if missing_key:
        raise InvalidArgumentError(f"rows lack key column(s) {missing_key}")
    if only_deletes:
        return
    missing = [c for c in schema.columns if c.name not in present]
    if has_updates and missing:
        raise InvalidArgumentError(
            f"rows lack column(s) {[c.name for c in missing]}: an update replaces the whole "
            "row, so it must give every column"
        )
    required = [c.name for c in missing if not c.nullable and c.default is None]
    if required:
        raise InvalidArgumentError(
            f"rows lack NOT NULL column(s) {required}, which have no default"
        )


def _cast_rows(
    array: pa.Array, target: pa.DataType, name: str
) -> tuple[pa.Array, list[tuple[int, str]]]:
    """``array`` cast to ``target``, and the rows whose values do not fit it (their cells
    become null). A column that cannot convert at all raises ``InvalidArgumentError``."""
    try:
        return _cast(array, target), []
    except pa.ArrowNotImplementedError as err:
        raise InvalidArgumentError(f"column {name!r}: cannot convert to {target}: {err}") from err
    except pa.ArrowInvalid as err:
        failure = err
    bad = _out_of_range(array, target)
    why = "{value!r} is out of range for {target}"
    if bad is None:
        bad = _failing_rows(array, target)
        why = "cannot convert {value!r} to {target}"
    if not len(bad):
        raise InvalidArgumentError(f"column {name!r}: cannot convert to {target}: {failure}")
    mask = np.zeros(len(array), dtype=bool)
    mask[bad] = True
    kept = pc.if_else(pa.array(mask), pa.nulls(len(array), array.type), array)
    try:
        cast = _cast(kept, target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise InvalidArgumentError(f"column {name!r}: cannot convert to {target}: {err}") from err
    values = array.take(pa.array(bad, pa.int64())).to_pylist()
    problems = [
        (int(row), f"column {name!r}: " + why.format(value=value, target=target))
        for row, value in zip(bad.tolist(), values, strict=True)
    ]
    return cast, problems


#: Timestamp text that ends in a zone offset after its time of day (``...T09:00:00Z``,
#: ``... 10:00:00+01:00``, ``...-0500``); a bare date's ``-01`` is not one.
_ZONE_SUFFIX = r"[T ]\d\d:\d\d.*(Z|z|[+-]\d\d(:?\d\d)?)$"


def _cast(array: pa.Array, target: pa.DataType) -> pa.Array:
    """``array`` cast to ``target`` without loss; text without a zone offset cast to a zoned
    timestamp is taken as UTC (nyala's rule for naive timestamps), text with one is
    converted."""
    try:
        return array.cast(target, safe=True)
    except pa.ArrowInvalid:
        zoned_from_text = (
            pa.types.is_timestamp(target)
            and target.tz is not None
            and (pa.types.is_string(array.type) or pa.types.is_large_string(array.type))
        )
        if not zoned_from_text:
            raise
        naive = pa.timestamp(target.unit)
        zoned = pc.fill_null(pc.match_substring_regex(array, _ZONE_SUFFIX), False)
        if not pc.any(zoned).as_py():
            return array.cast(naive, safe=True).cast(target)
        # Text with and without offsets in one column (a CSV): each kind cast on its own.
        nulls = pa.nulls(len(array), array.type)
        with_zone = pc.if_else(zoned, array, nulls).cast(target, safe=True)
        without = pc.if_else(zoned, nulls, array).cast(naive, safe=True).cast(target)
        return pc.if_else(zoned, with_zone, without)


def _out_of_range(array: pa.Array, target: pa.DataType) -> np.ndarray[Any, Any] | None:
    """Rows of a numeric ``array`` whose values an integer ``target`` cannot hold (None if
    that is not the kind of conversion: then ``_failing_rows`` finds them)."""
    source = array.type
    if not pa.types.is_integer(target) or not (
        pa.types.is_integer(source) or pa.types.is_floating(source)
    ):
        return None
    info = np.iinfo(target.to_pandas_dtype())
    values = array.to_numpy(zero_copy_only=False)
    valid = ~np.asarray(array.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    with np.errstate(invalid="ignore"):
        if pa.types.is_floating(source):
            floats = np.asarray(values, dtype=np.float64)
            bad = ~np.isfinite(floats) | (floats != np.floor(floats))
            bad |= (floats < info.min) | (floats > info.max)
        else:
            bad = (values < info.min) | (values > info.max)
    return np.flatnonzero(bad & valid)


def _failing_rows(array: pa.Array, target: pa.DataType) -> np.ndarray[Any, Any]:
    """The rows of ``array`` that do not convert to ``target``, found by halving the range that
    fails (a cast per step; the bad rows are expected to be few)."""
    bad: list[int] = []
    ranges = [(0, len(array))]
    while ranges:
        start, stop = ranges.pop()
        try:
            _cast(array.slice(start, stop - start), target)
            continue
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        if stop - start == 1:
            bad.append(start)
            continue
        middle = (start + stop) // 2
        ranges += [(middle, stop), (start, middle)]
    return np.array(sorted(bad), dtype=np.int64)


def _op_kinds(op: Any, ops: pa.Array) -> tuple[bool, bool]:
    """(every row deletes, some row updates): read off a single op without touching arrays
    (the common case, and most of a one-row write's client cost when done with numpy)."""
    if not isinstance(op, (np.ndarray, pa.Array, pa.ChunkedArray)):
        kind = OpType.parse(op)
        return kind.is_delete, kind in (OpType.UPDATE, OpType.UPDATE_IGNORE)
    codes = ops.to_numpy(zero_copy_only=False)
    deletes = (codes == OpType.DELETE) | (codes == OpType.DELETE_IGNORE)
    updates = (codes == OpType.UPDATE) | (codes == OpType.UPDATE_IGNORE)
    return bool(deletes.all()), bool(updates.any())


def _op_array(op: Any, rows: int) -> pa.Array:
    if isinstance(op, (np.ndarray, pa.Array, pa.ChunkedArray)):
        ops = _to_array(op)
        if len(ops) != rows:
            raise InvalidArgumentError(f"{len(ops)} op codes for {rows} rows")
        try:
            return ops.cast(pa.uint8(), safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            raise InvalidArgumentError(f"op codes: cannot convert to uint8: {err}") from err
    code = int(OpType.parse(op))
    return pa.array(np.full(rows, code, dtype=np.uint8))


# Explicit options: without them pyarrow reads two environment variables on every call.
_IPC_WRITE_OPTIONS = pa.ipc.IpcWriteOptions()


def encode(batch: pa.RecordBatch) -> pa.Buffer:
    """The Arrow IPC stream bytes of an op batch (the wire and WAL form)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=_IPC_WRITE_OPTIONS) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


__all__ = [
    "OP_COLUMN",
    "OpType",
    "PreparedRows",
    "RowProblem",
    "encode",
    "make_op_batch",
    "prepare_op_batch",
    "to_record_batch",
]
