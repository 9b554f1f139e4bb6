"""Arrow streams in and out (issue 30, item 4), on a real cluster: pyarrow, DuckDB and polars
read a ``Scanner`` streaming; writes take polars DataFrames, DuckDB relations, objects that
export only ``__arrow_c_array__``, and RecordBatchReaders, which they stream in chunks (per-row
outcomes by stream position; 10M rows in bounded client memory with ``-m scale``)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest

import nyala
from nyala.testing import MiniCluster, logs_on_failure

SCHEMA = nyala.Schema.parse("id:int64, name:string?, v:double?", key=["id"])
ROWS = 50_000


@pytest.fixture(scope="module")
def table() -> Iterator[nyala.Table]:
    with (
        logs_on_failure(MiniCluster(3, num_masters=1)) as cluster,
        nyala.connect(cluster.master_addrs, timeout_ms=60_000) as client,
    ):
        events = client.create_table(
            "events", SCHEMA, partitioning=nyala.HashPartitioning(["id"], buckets=3), replicas=3
        )
        ids = np.arange(ROWS, dtype=np.int64)
        rows = pa.table({"id": ids, "name": pa.array([f"n{i % 7}" for i in ids]), "v": ids / 2})
        assert events.insert(rows).ok
        yield events


def test_scanner_is_an_arrow_stream(table: nyala.Table) -> None:
    scanner = table.scan(columns=["id", "v"], batch_size_bytes=64 * 1024)
    assert hasattr(scanner, "__arrow_c_stream__")
    reader = pa.RecordBatchReader.from_stream(scanner)
    assert reader.schema == pa.schema([("id", pa.int64(), False), ("v", pa.float64())])
    batches = list(reader)
    assert len(batches) > 3  # read page by page, not as one result
    got = pa.Table.from_batches(batches).sort_by("id")
    assert got.column("id").to_pylist() == list(range(ROWS))
    assert table.scan(where=[("id", "<", 10)]).to_reader().read_all().num_rows == 10


def test_duckdb_sql_over_a_scanner(table: nyala.Table) -> None:
    duckdb = pytest.importorskip("duckdb")
    scanner = table.scan(columns=["id", "name", "v"])  # noqa: F841 (DuckDB finds it by name)
    result = duckdb.sql(
        "select name, count(*) as n, sum(v) as total from scanner group by name order by name"
    ).fetchall()
    assert [r[0] for r in result] == [f"n{i}" for i in range(7)]
    assert sum(r[1] for r in result) == ROWS
    assert sum(r[2] for r in result) == pytest.approx(sum(range(ROWS)) / 2)


def test_polars_reads_a_scanner(table: nyala.Table) -> None:
    pl = pytest.importorskip("polars")
    frame = pl.DataFrame(table.scan(columns=["id", "v"]))
    assert frame.shape == (ROWS, 2)
    assert frame["id"].sort().to_list() == list(range(ROWS))
    lazy = pl.from_arrow(table.scan(where=[("id", ">=", ROWS - 5)]).to_reader())
    assert sorted(lazy["id"].to_list()) == list(range(ROWS - 5, ROWS))


def _reader(start: int, rows: int, batch_rows: int) -> pa.RecordBatchReader:
    """A stream of rows made as it is read (nothing of it exists up front)."""
    schema = pa.schema([("id", pa.int64(), False), ("v", pa.float64())])

    def batches() -> Iterator[pa.RecordBatch]:
        for first in range(start, start + rows, batch_rows):
            ids = np.arange(first, min(first + batch_rows, start + rows), dtype=np.int64)
            yield pa.RecordBatch.from_arrays([pa.array(ids), pa.array(ids * 1.5)], schema=schema)

    return pa.RecordBatchReader.from_batches(schema, batches())


def test_writes_take_arrow_streams_and_arrays(table: nyala.Table) -> None:
    pl = pytest.importorskip("polars")
    duckdb = pytest.importorskip("duckdb")
    base = 1_000_000
    frame = pl.DataFrame({"id": [base, base + 1], "name": ["p", None], "v": [1.0, 2.0]})
    assert table.insert(frame).ok  # polars: __arrow_c_stream__
    relation = duckdb.sql(f"select range + {base + 2} as id from range(3)")
    assert table.insert(relation).ok  # DuckDB relation
    batch = pa.record_batch({"id": pa.array([base + 5], pa.int64())})

    class ArrayOnly:  # exports only __arrow_c_array__
        def __arrow_c_array__(self, requested_schema: object = None) -> object:
            return batch.__arrow_c_array__(requested_schema)

    assert table.insert(ArrayOnly()).ok
    got = table.scan(where=[("id", ">=", base), ("id", "<", base + 10)]).to_arrow()
    assert sorted(got.column("id").to_pylist()) == [base + i for i in (0, 1, 2, 3, 4, 5)]


def test_a_streamed_write_reports_rows_by_stream_position(table: nyala.Table) -> None:
    from nyala.client import table as table_module

    start, rows = 2_000_000, 3 * table_module.STREAM_WRITE_ROWS_MAX + 17
    taken = table_module.STREAM_WRITE_ROWS_MAX + 5  # 10 rows inside the second chunk exist
    assert table.insert(_reader(start + taken, 10, 10)).ok
    result = table.insert(_reader(start, rows, 100_000))
    assert result.rows == rows
    assert [e.row for e in result.row_errors] == list(range(taken, taken + 10))
    assert {e.code for e in result.row_errors} == {"ALREADY_PRESENT"}
    assert result.failed_rows is not None
    assert result.failed_rows.num_rows == 10
    assert result.applied == rows - 10
    assert table.count(where=[("id", ">=", start)]) == rows


@pytest.mark.scale
def test_ten_million_rows_stream_in_bounded_client_memory(table: nyala.Table) -> None:
    import resource

    start, rows = 100_000_000, 10_000_000
    peak_before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert table.upsert(_reader(start, rows, 500_000)).ok
    growth_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before_kib) / 1024
    # The stream is 160 MB of values; a bounded write holds a chunk or two of it.
    assert growth_mib < 128, f"client peak RSS grew {growth_mib:.0f} MiB"
    assert table.count(where=[("id", ">=", start)]) == rows
