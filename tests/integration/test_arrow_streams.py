"""A scan speaks the Arrow PyCapsule stream protocol (issue 30, item 4): pyarrow, DuckDB and
polars read a ``Scanner`` streaming, on a real cluster."""

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
        rows = pa.table(
            {"id": ids, "name": pa.array([f"n{i % 7}" for i in ids]), "v": ids / 2}
        )
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
    scanner = table.scan(columns=["id", "name", "v"])
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
