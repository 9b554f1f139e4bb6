"""Row operations: turning numpy / pyarrow / pandas data into the Arrow op batch.

An op batch is one Arrow record batch holding the table's columns plus ``__op`` (uint8, one
``OpType`` per row); its IPC stream bytes are what the client sends and the WAL stores. This
module does no per-row Python work: columns are converted as whole arrays, and fixed-width
columns without nulls whose type already matches (numpy ``int64`` for an ``int64`` column,
say) are wrapped without copying.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

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
    raise InvalidArgumentError(
        f"cannot make rows from {type(data).__name__}: expected a pyarrow RecordBatch or "
        "Table, a pandas DataFrame, or a dict of arrays"
    )


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


def make_op_batch(
    data: Any,
    op: OpType | str | int | np.ndarray[Any, Any] | pa.Array,
    schema: Schema,
    *,
    fill_missing_nullable: bool = False,
) -> pa.RecordBatch:
    """The op batch for ``data`` against ``schema``.

    ``op`` is one operation for every row or an array of op codes, one per row. Columns are
    put in schema order and cast to the schema's types (a no-op, hence zero-copy, when they
    already match). Batches of only deletes need only the key columns. With
    ``fill_missing_nullable``, absent nullable columns become nulls (otherwise every column is
    required, so that an upsert cannot silently null a column the caller forgot).
    """
    batch = to_record_batch(data)
    rows = batch.num_rows
    ops = _op_array(op, rows)
    only_deletes = _only_deletes(op, ops)
    present = set(batch.schema.names)
    unknown = present - set(schema.names) - {OP_COLUMN}
    if unknown:
        raise InvalidArgumentError(f"unknown column(s) {sorted(unknown)}")
    names: list[str] = []
    arrays: list[pa.Array] = []
    for i, column in enumerate(schema.columns):
        is_key = i < len(schema.key)
        if column.name in present:
            array = batch.column(column.name)
            if array.type != column.arrow_type:
                array = _cast(array, column.arrow_type, column.name)
        elif only_deletes and not is_key:
            continue
        elif fill_missing_nullable and column.nullable:
            array = pa.nulls(rows, type=column.arrow_type)
        else:
            raise InvalidArgumentError(f"rows lack column {column.name!r}")
        names.append(column.name)
        arrays.append(array)
    names.append(OP_COLUMN)
    arrays.append(ops)
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _cast(array: pa.Array, target: pa.DataType, name: str) -> pa.Array:
    try:
        return array.cast(target, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise InvalidArgumentError(f"column {name!r}: cannot convert to {target}: {err}") from err


def _op_array(op: Any, rows: int) -> pa.Array:
    if isinstance(op, (np.ndarray, pa.Array, pa.ChunkedArray)):
        ops = _to_array(op)
        if len(ops) != rows:
            raise InvalidArgumentError(f"{len(ops)} op codes for {rows} rows")
        return _cast(ops, pa.uint8(), OP_COLUMN)
    code = int(OpType.parse(op))
    return pa.array(np.full(rows, code, dtype=np.uint8))


def _only_deletes(op: Any, ops: pa.Array) -> bool:
    if not isinstance(op, (np.ndarray, pa.Array, pa.ChunkedArray)):
        return OpType.parse(op).is_delete
    codes = ops.to_numpy(zero_copy_only=False)
    return bool(np.isin(codes, (OpType.DELETE, OpType.DELETE_IGNORE)).all())


def encode(batch: pa.RecordBatch) -> pa.Buffer:
    """The Arrow IPC stream bytes of an op batch (the wire and WAL form)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


__all__ = ["OP_COLUMN", "OpType", "encode", "make_op_batch", "to_record_batch"]
