"""The ``nyala`` PySpark data source against a real cluster (1 master, 3 tservers) and one local[2]
SparkSession for the whole module (starting Spark is the expensive part)."""

from __future__ import annotations

import datetime
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark")

from nyala.client import connect
from nyala.errors import SchemaMismatchError
from nyala.partition import HashPartitioning, RangePartitioning
from nyala.schema import Schema
from nyala.spark.load import RowErrorsError, load_file
from nyala.testing import MiniCluster, dump_logs
from nyala.testing import write_contract as contract_kinds

# Spark starts Python workers per job; on a loaded 2-core machine one job can take minutes.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

ALL_TYPES = (
    "id:int64, i8:int8?, i16:int16?, i32:int32?, f:float?, d:double?, b:bool?, s:string?, "
    "bin:binary?, ts:timestamp?"
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[MiniCluster]:
    with MiniCluster(3, num_masters=1) as mini:
        try:
            yield mini
        except BaseException:
            dump_logs(mini, sys.stderr)
            raise


@pytest.fixture(scope="module")
def masters(cluster: MiniCluster) -> str:
    return ",".join(cluster.master_addrs)


@pytest.fixture(scope="module")
def client(masters: str) -> Iterator[Any]:
    with connect(masters) as connected:
        yield connected


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import nyala.spark

    session = (
        SparkSession.builder.master("local[2]")
        .appName("nyala-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    nyala.spark.register(session)
    yield session
    session.stop()


def writer(df: Any, masters: str, table: str, operation: str = "upsert", **extra: str) -> Any:
    out = (
        df.write.format("nyala")
        .option("nyala.masters", masters)
        .option("nyala.table", table)
        .option("nyala.operation", operation)
    )
    for key, value in extra.items():
        out = out.option(f"nyala.{key}", value)
    return out.mode("append")


def reader(spark: Any, masters: str, table: str) -> Any:
    return spark.read.format("nyala").option("nyala.masters", masters).option("nyala.table", table)


def table_rows(client: Any, table: str) -> list[dict[str, Any]]:
    rows = [row for batch in client.table(table).scan() for row in batch.to_pylist()]
    return sorted(rows, key=lambda r: r["id"])


def table_ids(client: Any, table: str) -> pa.Array:
    batches = list(client.table(table).scan(columns=["id"]))
    return pa.concat_arrays([b.column(0) for b in batches]) if batches else pa.array([])


def make_table(client: Any, name: str, schema: str, buckets: int = 3) -> None:
    client.create_table(
        name,
        Schema.parse(schema, key=["id"]),
        partitioning=HashPartitioning(["id"], buckets=buckets),
        replicas=3,
    )


def all_types_frame(spark: Any, rows: int) -> Any:
    # Every third row is null in every nullable column.
    def maybe(expr: str) -> str:
        return f"if(id % 3 = 0, null, {expr})"

    return spark.range(rows).selectExpr(
        "id",
        maybe("cast(id % 100 as tinyint)") + " as i8",
        maybe("cast(-id as smallint)") + " as i16",
        maybe("cast(id * 7 as int)") + " as i32",
        maybe("cast(id / 4 as float)") + " as f",
        maybe("cast(id as double) / 3") + " as d",
        maybe("id % 2 = 0") + " as b",
        maybe("concat('row-', cast(id as string), '-é')") + " as s",
        maybe("cast(concat('\\0', cast(id as string)) as binary)") + " as bin",
        maybe("timestamp_micros(id * 1000003 - 5000000)") + " as ts",
    )


# --- writes and reads ---------------------------------------------------------------------


def test_round_trip_every_type_with_nulls(spark: Any, client: Any, masters: str) -> None:
    df = all_types_frame(spark, 3000)
    writer(
        df,
        masters,
        "all_types",
        "insert",
        createTable="true",
        primaryKey="id",
        hashPartitions="id:3",
    ).save()
    created = client.table("all_types").schema
    assert [c.type for c in created.columns] == [
        "int64", "int8", "int16", "int32", "float", "double", "bool", "string", "binary",
        "timestamp",
    ]  # fmt: skip
    assert not created.column("id").nullable
    assert created.column("s").nullable
    back = reader(spark, masters, "all_types").load()
    assert back.schema == df.schema.__class__.fromJson(back.schema.jsonValue())
    expected = sorted(df.collect())
    got = sorted(back.collect())
    assert got == expected
    assert len(got) == 3000
    assert got[3]["s"] is None
    assert got[4]["s"] == "row-4-é"
    # The client sees the same values (timestamps as UTC microseconds).
    stored = table_rows(client, "all_types")
    assert stored[5]["ts"] == pa.scalar(5 * 1000003 - 5000000, pa.timestamp("us", tz="UTC")).as_py()


def test_decimal_date_and_varchar_round_trip_and_prune_by_range(
    spark: Any, client: Any, masters: str
) -> None:
    """Spark's DECIMAL and DATE both ways, exact (issue 33): extremes of DECIMAL(38,2), dates
    before 1970; a varchar column reads back as STRING, cut to its length; a range predicate on
    a DATE range column reads only the tablets it can match."""
    df = spark.range(400).selectExpr(
        "id",
        "if(id % 5 = 0, null, "
        "cast(cast(id * 1234567 - 250000000 as decimal(20,0)) / 100 as decimal(20,2))) as price",
        "case id when 1 then cast('999999999999999999999999999999999999.99' as decimal(38,2)) "
        "when 2 then cast('-999999999999999999999999999999999999.99' as decimal(38,2)) "
        "else cast(id as decimal(38,2)) end as big",
        "date_add(date'1969-12-01', cast(id as int)) as day",
        "concat('日本-', cast(id as string)) as tag",
    )
    writer(df, masters, "spark_typed", "insert", createTable="true", primaryKey="id").save()
    stored = client.table("spark_typed").schema
    assert [c.type for c in stored.columns] == [
        "int64", "decimal(20,2)", "decimal(38,2)", "date", "string",
    ]  # fmt: skip
    back = reader(spark, masters, "spark_typed").load()
    assert sorted(back.collect()) == sorted(df.collect())
    # A varchar table written from STRING values: cut to 4 characters on the servers.
    client.create_table(
        "spark_ranges",
        Schema.parse("day:date, id:int64, tag:varchar(4)?", key=["day", "id"]),
        partitioning=[
            HashPartitioning(["id"], buckets=2),
            RangePartitioning(
                ["day"],
                bounds=[(datetime.date(1969, 12, 1), datetime.date(1970, 3, 1))],
                splits=[datetime.date(1970, 1, 1), datetime.date(1970, 2, 1)],
            ),
        ],
        replicas=3,
    )
    inside = df.filter("id < 90").select("day", "id", "tag")  # days within the bounds
    writer(inside, masters, "spark_ranges", "upsert").save()
    got = reader(spark, masters, "spark_ranges").load()
    assert got.filter("id = 7").collect()[0]["tag"] == "日本-7"
    assert got.filter("id = 17").collect()[0]["tag"] == "日本-1"
    january = got.filter("day >= date'1970-01-01' and day < date'1970-02-01'")
    assert january.count() == 31
    assert january.rdd.getNumPartitions() == 2  # one range × 2 hash buckets of 6 tablets


def test_each_operation(spark: Any, client: Any, masters: str, tmp_path: Path) -> None:
    make_table(client, "ops", "id:int64, v:string?")

    def frame(ids: range, tag: str) -> Any:
        return spark.range(ids.start, ids.stop).selectExpr("id", f"concat('{tag}', id) as v")

    def values() -> dict[int, str]:
        return {r["id"]: r["v"] for r in table_rows(client, "ops")}

    writer(frame(range(0, 10), "a"), masters, "ops", "insert").save()
    assert values() == {i: f"a{i}" for i in range(10)}
    writer(frame(range(5, 15), "b"), masters, "ops", "insert_ignore").save()
    assert values() == {**{i: f"a{i}" for i in range(10)}, **{i: f"b{i}" for i in range(10, 15)}}
    writer(frame(range(0, 3), "c"), masters, "ops", "upsert").save()
    assert [values()[i] for i in range(4)] == ["c0", "c1", "c2", "a3"]
    writer(frame(range(3, 5), "d"), masters, "ops", "update").save()
    writer(frame(range(14, 20), "e"), masters, "ops", "update_ignore").save()
    current = values()
    assert (current[3], current[4], current[14]) == ("d3", "d4", "e14")
    assert 15 not in current
    writer(frame(range(0, 2), "x"), masters, "ops", "delete").save()
    writer(frame(range(12, 30), "x"), masters, "ops", "delete_ignore").save()
    assert sorted(values()) == list(range(2, 12))
    # overwrite: the table holds exactly the job's rows afterwards.
    report = tmp_path / "report.json"
    writer(frame(range(100, 103), "o"), masters, "ops", reportPath=str(report)).mode(
        "overwrite"
    ).save()
    assert values() == {100: "o100", 101: "o101", 102: "o102"}
    summary = json.loads(report.read_text())
    assert summary["outcome"] == "committed"
    assert (summary["rows_in"], summary["rows_applied"], summary["rows_failed"]) == (3, 3, 0)


def test_ignore_null_keeps_current_values(spark: Any, client: Any, masters: str) -> None:
    make_table(client, "partial", "id:int64, a:string?, b:int64?")
    full = spark.range(0, 6).selectExpr("id", "concat('a', id) as a", "id * 10 as b")
    writer(full, masters, "partial").save()
    holes = spark.range(0, 8).selectExpr(
        "id", "if(id % 2 = 0, null, 'new') as a", "if(id < 3, null, id) as b"
    )
    writer(holes, masters, "partial", ignoreNull="true").save()
    rows = {r["id"]: (r["a"], r["b"]) for r in table_rows(client, "partial")}
    assert rows == {
        0: ("a0", 0),
        1: ("new", 10),
        2: ("a2", 20),
        3: ("new", 3),
        4: ("a4", 4),
        5: ("new", 5),
        6: (None, 6),  # new rows: nothing to keep
        7: ("new", 7),
    }
    writer(holes, masters, "partial").save()  # without the option, nulls are written
    assert table_rows(client, "partial")[0] == {"id": 0, "a": None, "b": None}


def test_failing_task_reports_row_errors(
    spark: Any, client: Any, masters: str, tmp_path: Path
) -> None:
    make_table(client, "dupes", "id:int64, v:int64")
    df = spark.range(0, 50).selectExpr("id", "id * 2 as v")
    writer(df, masters, "dupes", "insert").save()
    report = tmp_path / "report.json"
    again = spark.range(40, 60).selectExpr("id", "id * 3 as v").coalesce(1)
    with pytest.raises(Exception, match="rows were not applied") as failure:
        writer(again, masters, "dupes", "insert", reportPath=str(report)).save()
    text = str(failure.value)
    assert "10 of 20 rows were not applied" in text
    assert "ALREADY_PRESENT" in text
    assert '"id": 4' in text  # a sampled row names its key
    assert json.loads(report.read_text())["outcome"] == "aborted"
    rows = {r["id"]: r["v"] for r in table_rows(client, "dupes")}
    # The task's other rows were written; the duplicates kept their first values.
    assert len(rows) == 60
    assert rows[45] == 90
    assert rows[55] == 165
    # ignoreDuplicateRowErrors lets the same job pass.
    writer(again, masters, "dupes", "insert", ignoreDuplicateRowErrors="true").save()


def test_schema_mismatch_is_refused_before_any_row(spark: Any, client: Any, masters: str) -> None:
    make_table(client, "strict", "id:int64, n:int32, s:string?")
    wrong = spark.range(0, 10).selectExpr("id", "cast(id as string) as n", "'x' as extra")
    with pytest.raises(Exception, match="does not fit table 'strict'") as failure:
        writer(wrong, masters, "strict").save()
    assert "column 'n' is string in the DataFrame but int32" in str(failure.value)
    assert "['extra'] are not in table" in str(failure.value)
    assert table_rows(client, "strict") == []
    # s is nullable: left out, it is null. bigint into int32: the value that does not fit and
    # the null in NOT NULL n are their rows' errors, the other rows are written.
    rows = spark.range(0, 10).selectExpr(
        "id", "case when id = 7 then null when id = 8 then 5000000000 else id end as n"
    )
    with pytest.raises(Exception, match="2 of 10 rows were not applied") as failure:
        writer(rows.coalesce(1), masters, "strict").save()
    assert 'column "n" is NOT NULL but the row holds null (row 7 {"id": 7})' in str(failure.value)
    assert "5000000000 is out of range for int32 (row 8" in str(failure.value)
    assert len(table_rows(client, "strict")) == 8
    # With failOnRowErrors=false the job succeeds and reports its counts per task.
    extra = spark.range(20, 30).selectExpr("id", "if(id = 27, null, 1) as n", "'q' as bogus")
    report_path = Path(tempfile.mkdtemp()) / "report.json"
    writer(
        extra.coalesce(1),
        masters,
        "strict",
        failOnRowErrors="false",
        ignoreExtraColumns="true",
        reportPath=str(report_path),
    ).save()
    report = json.loads(report_path.read_text())
    assert report["outcome"] == "committed"
    assert [(t["applied"], t["failed"], t["unknown"]) for t in report["tasks"]] == [(9, 1, 0)]
    assert len(table_rows(client, "strict")) == 17


def scan_output_rows(df: Any) -> int:
    """Rows the scan node handed to Spark (before Spark's own filter)."""
    df.collect()
    plan = df._jdf.queryExecution().executedPlan()
    counts = []

    def visit(node: Any) -> None:
        if "BatchScan" in node.nodeName():
            counts.append(node.metrics().apply("numOutputRows").value())
        children = node.children()
        for i in range(children.size()):
            visit(children.apply(i))

    visit(plan)
    assert len(counts) == 1, plan.toString()
    return int(counts[0])


def test_predicate_pushdown_reads_fewer_rows(spark: Any, client: Any, masters: str) -> None:
    make_table(client, "pushed", "id:int64, v:int64?, s:string?")
    df = spark.range(0, 2000).selectExpr(
        "id", "if(id % 100 = 0, null, id % 7) as v", "cast(id as string) as s"
    )
    writer(df, masters, "pushed").save()

    # A fresh load() per query: PySpark 4.3 reuses a DataFrame's last pushed read plan for a
    # later query with no pushable filter (docs/spark.md, "Limits").
    def table() -> Any:
        return reader(spark, masters, "pushed").load()

    assert scan_output_rows(table()) == 2000
    narrow = table().where("id >= 1900 and v is not null")
    assert scan_output_rows(narrow) == 99  # v is null for id 1900
    # Both conjuncts went to nyala: Spark's plan keeps no Filter above the scan.
    plan = narrow._jdf.queryExecution().executedPlan().toString()
    assert not [
        line for line in plan.splitlines() if line.strip("*() +-0123456789").startswith("Filter")
    ]
    in_list = table().where("s in ('5', '17', 'nope') and v < 6")
    assert sorted(r["id"] for r in in_list.collect()) == [5, 17]
    assert scan_output_rows(in_list) == 2
    # An OR is Spark's to evaluate: every row is read, the answer is the same.
    either = table().where("id = 3 or id = 1999")
    assert sorted(r["id"] for r in either.collect()) == [3, 1999]
    assert scan_output_rows(either) == 2000
    # Projection by option.
    ids = reader(spark, masters, "pushed").option("nyala.columns", "id").load()
    assert ids.columns == ["id"]
    assert ids.where("id < 5").count() == 5
    closest = reader(spark, masters, "pushed").option("nyala.replicaSelection", "closest_replica")
    assert closest.load().count() == 2000


def test_load_survives_a_killed_tserver(
    spark: Any, client: Any, masters: str, cluster: MiniCluster
) -> None:
    make_table(client, "survivor", "id:int64, v:double", buckets=4)
    rows = 200_000
    df = spark.range(0, rows, 1, 4).selectExpr("id", "cast(id as double) * 0.5 as v")
    victim = cluster.tserver(2)
    loading = threading.Event()
    killed_while_loading: list[bool] = []

    def kill_once_rows_arrive() -> None:
        # Spark jobs must run on the thread that registered the data source, so the load
        # runs here and the kill on a helper thread.
        loading.wait(timeout=120)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and loading.is_set():
            if client.table("survivor").scan(columns=["id"], limit=20_000).count() >= 20_000:
                break
            time.sleep(0.1)
        killed_while_loading.append(loading.is_set())
        victim.kill()

    killer = threading.Thread(target=kill_once_rows_arrive)
    killer.start()
    loading.set()
    try:
        writer(df, masters, "survivor", "upsert", batchRows="5000").save()
    finally:
        loading.clear()
        killer.join(timeout=180)
    assert killed_while_loading == [True]
    ids = table_ids(client, "survivor")
    assert len(ids) == rows
    assert pa.compute.count_distinct(ids).as_py() == rows
    assert pa.compute.min_max(ids).as_py() == {"min": 0, "max": rows - 1}
    victim.restart()


# --- the same core without Spark -------------------------------------------------------------


def test_load_file_parquet_and_csv(client: Any, tmp_path: Path) -> None:
    make_table(client, "files", "id:int64, name:string?, ts:timestamp?")
    data = pa.table(
        {
            "id": pa.array(range(1000), pa.int64()),
            "name": pa.array([None if i % 5 == 0 else f"n{i}" for i in range(1000)]),
            "ts": pa.array([i * 1_000_000 for i in range(1000)], pa.timestamp("us")),
        }
    )
    parquet = tmp_path / "rows.parquet"
    pq.write_table(data, parquet, row_group_size=300)
    report = load_file(client, "files", parquet, operation="insert")
    assert (report.rows_in, report.rows_applied, report.rows_failed) == (1000, 1000, 0)
    csv_path = tmp_path / "more.csv"
    csv_path.write_text("id,name,ts\n1000,x,2020-01-01 00:00:00\n1001,,\n5,dup,\n")
    with pytest.raises(RowErrorsError, match="ALREADY_PRESENT") as failure:
        load_file(client, "files", csv_path, operation="insert")
    assert failure.value.report.rows_applied == 2
    rows = table_rows(client, "files")
    assert len(rows) == 1002
    assert rows[1001]["name"] is None
    assert rows[1000]["name"] == "x"
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"id": [1], "other": [2]}), bad)
    with pytest.raises(SchemaMismatchError):
        load_file(client, "files", bad)


# --- the write contract through the Spark writer ------------------------------------------


@pytest.fixture(scope="module")
def contract(client: Any) -> Any:
    from nyala.testing.write_contract import PARTITIONING, SCHEMA, Model

    client.create_table("contract_spark", SCHEMA, partitioning=PARTITIONING, replicas=3)
    assert len(client.table("contract_spark").tablets()) == 4
    return Model()


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    specs=st.lists(
        st.builds(
            contract_kinds.RowSpec,
            st.sampled_from(list(contract_kinds.Kind)),
            st.integers(0, 10_000),
        ),
        min_size=1,
        max_size=16,
    ),
    upsert=st.booleans(),
)
def test_spark_writer_reports_every_row(
    spark: Any, client: Any, masters: str, contract: Any, specs: Any, upsert: bool
) -> None:
    """Random rows of every bad kind mixed with good ones, written by one Spark task with
    ``failOnRowErrors=false``: the task's counts (applied, failed by code, unknown) add up to
    its input and match the model row for row, and the table then holds the model's rows."""
    from nyala.rowops import OpType
    from nyala.testing.write_contract import rows_table
    from nyala.testing.write_contract import table_rows as contract_rows

    op = OpType.UPSERT if upsert else OpType.INSERT
    rows = contract.resolve(op, specs, len(contract.rows))
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "rows.parquet"
        pq.write_table(rows_table(rows), source)
        report_path = Path(tmp) / "report.json"
        df = spark.read.parquet(str(source)).coalesce(1)
        writer(
            df, masters, "contract_spark", op.name.lower(),
            failOnRowErrors="false", reportPath=str(report_path),
        ).save()  # fmt: skip
        report = json.loads(report_path.read_text())
    expected = contract.expect(rows)
    [task] = report["tasks"]
    assert task["applied"] + task["failed"] + task["unknown"] == len(rows)
    assert task["unknown"] == 0  # no fault is injected
    want_codes: dict[str, int] = {}
    for e in expected:
        if e.outcome == "failed":
            want_codes[e.code] = want_codes.get(e.code, 0) + 1
    assert report["errors_by_code"] == want_codes
    assert task["applied"] == sum(e.outcome == "applied" for e in expected)
    contract.settle(rows, [e.outcome for e in expected], lambda _: None)
    assert contract_rows(client.table("contract_spark").scan().to_arrow()) == contract.rows


def test_a_read_is_one_snapshot_while_writes_continue(
    spark: Any, client: Any, masters: str
) -> None:
    """Issue 34: a DataFrame reads every tablet at the snapshot picked when it was made;
    counting it twice, or running a task's read again (what Spark does on a retry), gives
    the same answer while a writer keeps inserting and updating."""
    from nyala.spark.options import parse_read_options
    from nyala.spark.source import NyalaReader

    make_table(client, "snap", "id:int64, v:int64?", buckets=4)
    table = client.table("snap")
    assert table.insert({"id": list(range(1000)), "v": [0] * 1000}).ok
    stop = threading.Event()

    def keep_writing() -> None:
        next_id = 1000
        while not stop.is_set():
            table.insert({"id": list(range(next_id, next_id + 50))})
            table.update({"id": list(range(0, 1000, 7)), "v": [next_id] * 143})
            next_id += 50
            time.sleep(0.02)

    writer_thread = threading.Thread(target=keep_writing, daemon=True)
    writer_thread.start()
    try:
        time.sleep(0.5)
        df = reader(spark, masters, "snap").load()
        first = df.count()
        time.sleep(1.0)  # more writes land
        second = df.count()
        assert first == second
        assert len(df.collect()) == first  # another action, another physical plan
        assert first >= 1000
        # A task retried: the same partition read again later returns the same rows.
        options = parse_read_options({"nyala.masters": masters, "nyala.table": "snap"})
        plan = NyalaReader(options, table.schema, ["id", "v"])
        partitions = plan.partitions()
        assert plan.snapshot_ts is not None
        once = [pa.Table.from_batches(list(plan.read(p))) for p in partitions]
        time.sleep(1.0)
        again = [pa.Table.from_batches(list(plan.read(p))) for p in partitions]
        assert all(a.equals(b) for a, b in zip(once, again, strict=True))
        # Pinned by option: the same timestamp reads the same rows in a new DataFrame.
        pinned = reader(spark, masters, "snap").option(
            "nyala.snapshotTimestamp", str(plan.snapshot_ts)
        )
        assert pinned.load().count() == sum(t.num_rows for t in once)
        # A latest read sees the writes since.
        latest = reader(spark, masters, "snap").option("nyala.readMode", "latest")
        assert latest.load().count() > first
    finally:
        stop.set()
        writer_thread.join(timeout=30)
