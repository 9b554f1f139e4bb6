"""nyala.rowops: numpy / pyarrow / pandas / dict inputs become the op batch without copies."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from nyala.errors import InvalidArgumentError
from nyala.rowops import OP_COLUMN, OpType, encode, make_op_batch, to_record_batch
from nyala.schema import Schema

SCHEMA = Schema.parse("id:int64, v:double?, name:string?, ts:timestamp?", key=["id"])


def _data_address(array: pa.Array) -> int:
    return int(array.buffers()[1].address)


def test_numpy_columns_are_zero_copy() -> None:
    ids = np.arange(1000, dtype=np.int64)
    values = np.linspace(0, 1, 1000)
    batch = make_op_batch(
        {"id": ids, "v": values}, OpType.UPSERT, SCHEMA, fill_missing_nullable=True
    )
    assert batch.schema.names == ["id", "v", "name", "ts", OP_COLUMN]
    assert _data_address(batch.column(0)) == ids.ctypes.data
    assert _data_address(batch.column(1)) == values.ctypes.data
    assert batch.column(OP_COLUMN).to_pylist()[:2] == [3, 3]
    assert batch.column("name").null_count == 1000


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
    assert batch.schema.field("ts").type == pa.timestamp("us")
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
    batch = make_op_batch({"id": [1, 2]}, ops, SCHEMA, fill_missing_nullable=True)
    assert batch.column(OP_COLUMN).to_pylist() == [1, 6]
    with pytest.raises(InvalidArgumentError, match="lack column"):
        make_op_batch({"id": [1]}, OpType.UPSERT, SCHEMA)
    with pytest.raises(InvalidArgumentError, match="unknown column"):
        make_op_batch({"id": [1], "zz": [1]}, OpType.DELETE, SCHEMA)
    with pytest.raises(InvalidArgumentError, match="op codes"):
        make_op_batch({"id": [1]}, np.array([1, 1], dtype=np.uint8), SCHEMA)
    with pytest.raises(InvalidArgumentError, match="unknown operation"):
        make_op_batch({"id": [1]}, "merge", SCHEMA)
    with pytest.raises(InvalidArgumentError, match="cannot convert"):
        make_op_batch({"id": ["x"]}, OpType.DELETE, SCHEMA)
    with pytest.raises(InvalidArgumentError, match="cannot make rows"):
        to_record_batch(42)


def test_encode_is_ipc_stream() -> None:
    batch = make_op_batch({"id": np.arange(3)}, OpType.DELETE, SCHEMA)
    data = encode(batch)
    assert pa.ipc.open_stream(data).read_all().to_batches()[0].equals(batch)
