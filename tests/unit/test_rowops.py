"""nyala.rowops: numpy / pyarrow / pandas / dict inputs become the op batch without copies."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from nyala.errors import InvalidArgumentError
from nyala.rowops import (
    OP_COLUMN,
    OpType,
    encode,
    make_op_batch,
    prepare_op_batch,
    to_record_batch,
)
from nyala.schema import Schema
from nyala.storage import CELL_BYTES_MAX, ROW_BYTES_MAX

SCHEMA = Schema.parse("id:int64, v:double?, name:string?, ts:timestamp?", key=["id"])


def _data_address(array: pa.Array) -> int:
    return int(array.buffers()[1].address)


def test_numpy_columns_are_zero_copy() -> None:
    ids = np.arange(1000, dtype=np.int64)
    values = np.linspace(0, 1, 1000)
    batch = make_op_batch({"id": ids, "v": values}, OpType.UPSERT, SCHEMA)
    # Omitted nullable columns are left out: the tablet server writes their default or null.
    assert batch.schema.names == ["id", "v", OP_COLUMN]
    assert _data_address(batch.column(0)) == ids.ctypes.data
    assert _data_address(batch.column(1)) == values.ctypes.data
    assert batch.column(OP_COLUMN).to_pylist()[:2] == [3, 3]


def test_pandas_and_pyarrow_fixed_width_columns_are_zero_copy() -> None:
    pd = pytest.importorskip("pandas")
    schema = Schema.parse("id:int64, v:double", key=["id"])
    ids = np.arange(100, dtype=np.int64)
    values = np.random.default_rng(1).random(100)
    frame = pd.DataFrame({"id": ids, "v": values}, copy=False)
    batch = make_op_batch(frame, "upsert", schema)
    assert _data_address(batch.column(0)) == frame["id"].to_numpy().ctypes.data
    assert _data_address(batch.column(1)) == frame["v"].to_numpy().ctypes.data
    from_table = make_op_batch(pa.table({"id": ids, "v": values}), "upsert", schema)
    assert _data_address(from_table.column(0)) == ids.ctypes.data


def test_pyarrow_and_pandas_inputs() -> None:
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(
        {
            "ts": pd.to_datetime(["2024-01-01", "2024-01-02"]),
            "id": np.array([5, 6], dtype=np.int32),
            "name": ["a", None],
            "v": [1.5, np.nan],
        }
    )
    batch = make_op_batch(frame, "insert", SCHEMA)
    assert batch.schema.field("id").type == pa.int64()
    assert batch.schema.field("ts").type == pa.timestamp("us", tz="UTC")  # naive: UTC
    assert batch.column("name").to_pylist() == ["a", None]
    table = pa.table({"id": [1, 2], "v": [0.5, None], "name": ["x", "y"], "ts": [None, None]})
    from_table = make_op_batch(table, OpType.INSERT, SCHEMA)
    assert from_table.column("v").null_count == 1
    source = pa.record_batch({"id": pa.array([1, 2], pa.int64())})
    deletes = make_op_batch(source, "delete", SCHEMA)
    assert deletes.schema.names == ["id", OP_COLUMN]
    assert deletes.column(0) is source.column(0) or deletes.column(0).equals(source.column(0))


def test_per_row_ops_and_errors() -> None:
    ops = np.array([OpType.INSERT, OpType.DELETE], dtype=np.uint8)
    batch = make_op_batch({"id": [1, 2]}, ops, SCHEMA)
    assert batch.column(OP_COLUMN).to_pylist() == [1, 6]
    strict = Schema.parse("id:int64, v:double, w:int8=3", key=["id"])
    with pytest.raises(InvalidArgumentError, match=r"NOT NULL column\(s\) \['v'\]"):
        make_op_batch({"id": [1]}, OpType.UPSERT, strict)
    with pytest.raises(InvalidArgumentError, match="update replaces the whole row"):
        make_op_batch({"id": [1], "v": [1.0]}, OpType.UPDATE, strict)
    with pytest.raises(InvalidArgumentError, match="key column"):
        make_op_batch({"v": [1.0]}, OpType.DELETE, strict)
    with pytest.raises(InvalidArgumentError, match=r"\['zz'\] are not in the table"):
        make_op_batch({"id": [1], "zz": [1]}, OpType.DELETE, SCHEMA)
    extra = make_op_batch({"id": [1], "zz": [1]}, OpType.UPSERT, SCHEMA, ignore_extra_columns=True)
    assert extra.schema.names == ["id", OP_COLUMN]
    with pytest.raises(InvalidArgumentError, match="op codes"):
        make_op_batch({"id": [1]}, np.array([1, 1], dtype=np.uint8), SCHEMA)
    with pytest.raises(InvalidArgumentError, match="unknown operation"):
        make_op_batch({"id": [1]}, "merge", SCHEMA)
    with pytest.raises(InvalidArgumentError, match="cannot convert"):
        make_op_batch({"id": ["x"]}, OpType.DELETE, SCHEMA)
    with pytest.raises(InvalidArgumentError, match="cannot convert"):
        make_op_batch({"id": [[1]]}, OpType.DELETE, SCHEMA)
    with pytest.raises(InvalidArgumentError, match="cannot make rows"):
        to_record_batch(42)


def test_rows_that_break_a_rule_are_reported_one_by_one() -> None:
    schema = Schema.parse("id:int64, small:int8?, name:string, blob:binary?", key=["id"])
    big = b"x" * (CELL_BYTES_MAX + 1)
    prepared = prepare_op_batch(
        {
            "id": [1, 2, None, 4, 5, 6, 7],
            "small": pa.array([1, 300, 1, -129, 1, 1, 2], pa.int64()),
            "name": ["a", "b", "c", "d", None, "f", "g"],
            "blob": [None, None, None, None, None, big, b"ok"],
        },
        OpType.UPSERT,
        schema,
    )
    found = {p.row: p.message for p in prepared.problems}
    assert sorted(found) == [1, 2, 3, 4, 5]
    assert {p.code for p in prepared.problems} == {"INVALID_ARGUMENT"}
    assert "300 is out of range for int8" in found[1]
    assert '"id"' in found[2]
    assert "NOT NULL" in found[2]
    assert "-129" in found[3]
    assert '"name"' in found[4]
    assert f"{CELL_BYTES_MAX + 1}-byte value" in found[5]
    selection = prepared.selection()
    assert selection is not None
    assert selection.tolist() == [0, 6]
    # The good rows keep their values; the input is kept as given for reports.
    assert prepared.batch.column("small").to_pylist()[6] == 2
    assert prepared.input.column("small").type == pa.int64()
    # Deletes carry only keys: their other NOT NULL cells may be null.
    deletes = prepare_op_batch({"id": [1], "name": [None]}, OpType.DELETE, schema)
    assert deletes.problems == []
    # A value that does not parse is found by halving the range that fails.
    parsed = prepare_op_batch(
        {"id": ["1", "x", "3"], "name": ["a", "b", "c"]}, OpType.INSERT, schema
    )
    assert [(p.row, "cannot convert 'x'" in p.message) for p in parsed.problems] == [(1, True)]


def test_a_row_over_the_row_limit_is_refused_alone() -> None:
    cells = ROW_BYTES_MAX // CELL_BYTES_MAX + 1
    text = "id:int64, " + ", ".join(f"c{i}:binary?" for i in range(cells))
    schema = Schema.parse(text, key=["id"])
    cell = b"z" * CELL_BYTES_MAX
    data: dict[str, object] = {"id": [1, 2]}
    data.update({f"c{i}": [cell, None] for i in range(cells)})
    prepared = prepare_op_batch(data, OpType.UPSERT, schema)
    assert [p.row for p in prepared.problems] == [0]
    assert f"at most {ROW_BYTES_MAX}" in prepared.problems[0].message


def test_encode_is_ipc_stream() -> None:
    batch = make_op_batch({"id": np.arange(3)}, OpType.DELETE, SCHEMA)
    data = encode(batch)
    assert pa.ipc.open_stream(data).read_all().to_batches()[0].equals(batch)


def test_arrow_streams_and_arrays_make_rows_but_pandas_keeps_its_own_path() -> None:
    import pandas as pd

    from nyala.rowops import is_arrow_stream, stream_chunks, to_record_batch

    frame = pd.DataFrame({"id": [1, 2]}, index=[7, 8])
    assert not is_arrow_stream(frame)  # its stream would carry the index as a column
    assert to_record_batch(frame).schema.names == ["id"]
    table = pa.table({"id": list(range(10))})
    assert not is_arrow_stream(table)
    reader = pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=3))
    assert is_arrow_stream(reader)
    chunks = list(stream_chunks(reader, 4))
    assert [c.num_rows for c in chunks] == [4, 4, 2]
    assert pa.Table.from_batches(chunks).column("id").to_pylist() == list(range(10))
    assert to_record_batch(table.to_batches()[0]).num_rows == 10
