"""Spark bulk load and read-back through the ``nyala`` data source, against baselines measured in
the same run on the same local[2] SparkSession.

Write side (issue 12): one DataFrame of ``--rows`` rows (default 5M) × 5 columns (int64 key,
double, string, timestamp, nullable int32), cached in Spark first so that every sink reads the
same in-memory rows, is written to

* a no-op Python Arrow data source that only counts the Arrow batches it is handed (the
  Spark → Python ceiling every Python data source shares): ``noop_rows_per_s``, the mean of
  a run first and a run last (``noop_rows_per_s_before`` / ``_after``), so that noise in one
  of them does not set the baseline alone;
* Parquet files (Spark's own JVM writer): ``parquet_rows_per_s``;
* a nyala table (3 tservers, RF 3, hash-partitioned) with ``nyala.operation=insert``:
  ``nyala_rows_per_s``, and ``ratio_vs_noop`` = nyala / noop (target ≥ 0.5).

Every sink is timed after a first small job through it (Spark starts the Python worker daemon,
the workers import the sink's code, nyala's open their channels): a bulk load's steady rate, as
a long-running Spark application sees it. The first nyala job's seconds are reported on their
own (``nyala_first_job_s``, 2000 rows into another table).

Read side: the table read back through ``spark.read.format("nyala")`` into Spark's ``noop``
sink (every row crosses into the JVM): ``nyala_scan_rows_per_s``, next to a Python data source
that yields the same rows from memory (``noop_source_rows_per_s``) and a Parquet scan
(``parquet_scan_rows_per_s``); ``scan_ratio_vs_noop``.

Where the CPU went: ``machine_cpu_us_per_row_noop`` and ``machine_cpu_us_per_row_nyala`` (all
CPU time of the machine, from ``/proc/stat``, per row written) and ``tserver_cpu_us_per_row``
(the three tablet servers together, replication and fsync included), and
``tserver_faulted_bytes_per_row`` (memory the tablet servers touched for the first time, which
the kernel zero-fills: it was a quarter of their CPU when every copy of a request was fresh
memory). On two cores the write ratio is about the no-op sink's machine CPU per row over the
nyala load's: docs/spark.md.

``--quick`` loads 500k rows to stay under two minutes on a shared 2-core machine. The last line
printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

ROWS_FULL = 5_000_000
ROWS_QUICK = 500_000
TABLE = "spark_bench"
WARM_UP_TABLE = "spark_bench_warm_up"
#: Arrow batch size between the JVM and Python workers, for every sink alike.
ARROW_BATCH_ROWS = 65_536


def make_session() -> Any:
    """A local[2] SparkSession with the Python workers on this interpreter."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("nyala-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(ARROW_BATCH_ROWS))
        .config("spark.driver.memory", "2g")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def register_baselines(spark: Any) -> None:
    """Registers ``nyala_bench_noop``: a writer that counts Arrow batches and a reader that
    yields rows of the bench's shape from memory."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceReader,
        InputPartition,
        WriterCommitMessage,
    )

    class Count(WriterCommitMessage):
        def __init__(self, rows: int) -> None:
            self.rows = rows

    class CountingWriter(DataSourceArrowWriter):
        def write(self, iterator: Iterator[pa.RecordBatch]) -> Count:
            return Count(sum(batch.num_rows for batch in iterator))

    class MemoryReader(DataSourceReader):
        def __init__(self, rows: int) -> None:
            self.rows = rows

        def partitions(self) -> list[InputPartition]:
            half = self.rows // 2
            return [InputPartition((0, half)), InputPartition((half, self.rows))]

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            start, end = partition.value
            for low in range(start, end, ARROW_BATCH_ROWS):
                yield memory_batch(low, min(end, low + ARROW_BATCH_ROWS))

    class NoopSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "nyala_bench_noop"

        def schema(self) -> str:
            return (
                "id BIGINT NOT NULL, v DOUBLE NOT NULL, s STRING NOT NULL, "
                "ts TIMESTAMP NOT NULL, n INT"
            )

        def writer(self, schema: Any, overwrite: bool) -> CountingWriter:
            return CountingWriter()

        def reader(self, schema: Any) -> MemoryReader:
            return MemoryReader(int(self.options["rows"]))

    spark.dataSource.register(NoopSource)


def memory_batch(low: int, high: int) -> pa.RecordBatch:
    """Rows ``[low, high)`` of the bench's shape, as the Spark reader expects them."""
    import numpy as np

    ids = np.arange(low, high, dtype=np.int64)
    nulls = ids % 10 == 0
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), False),
            pa.field("v", pa.float64(), False),
            pa.field("s", pa.string(), False),
            pa.field("ts", pa.timestamp("us", tz="UTC"), False),
            pa.field("n", pa.int32()),
        ]
    )
    return pa.RecordBatch.from_arrays(
        [
            pa.array(ids),
            pa.array(ids * 0.5),
            pa.array(ids.astype(str).astype(object)).cast(pa.string()),
            pa.array(ids * 1000, pa.timestamp("us", tz="UTC")),
            pa.array((ids % 1000).astype(np.int32), mask=nulls),
        ],
        schema=schema,
    )


def bench_frame(spark: Any, rows: int) -> Any:
    """``rows`` rows of the bench's 5 columns, in two partitions (one per task slot)."""
    return spark.range(0, rows, 1, 2).selectExpr(
        "id",
        "cast(id as double) * 0.5 as v",
        "cast(id as string) as s",
        "timestamp_micros(id * 1000) as ts",
        "if(id % 10 = 0, null, cast(id % 1000 as int)) as n",
    )


def source_frame(spark: Any, rows: int) -> Any:
    """The cached 5-column DataFrame every sink writes."""
    df = bench_frame(spark, rows).cache()
    assert df.count() == rows
    return df


def timed(action: Any) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def machine_cpu_s() -> float:
    """CPU seconds the whole machine has spent running something so far: user, nice,
    system, irq and softirq (not idle, iowait or time stolen by the hypervisor; guest time
    is already in user)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = (
            int(v) for v in f.readline().split()[1:8]
        )
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def run(rows: int, tservers: int) -> dict[str, Any]:
    spark = make_session()
    register_baselines(spark)
    df = source_frame(spark, rows)
    figures: dict[str, Any] = {"rows": rows}
    # The first Python job of a session starts the worker daemon; keep that out of every figure.
    df.limit(1000).write.format("nyala_bench_noop").mode("append").save()
    spark.read.format("nyala_bench_noop").option("rows", "1000").load().count()
    noop_before = noop_figures(df, rows)
    with tempfile.TemporaryDirectory(prefix="nyala-spark-bench-") as tmp:
        path = os.path.join(tmp, "parquet")
        parquet_s = timed(lambda: df.write.mode("overwrite").parquet(path))
        figures["parquet_rows_per_s"] = rows / parquet_s
        read_noop = spark.read.format("nyala_bench_noop").option("rows", str(rows)).load()
        figures["noop_source_rows_per_s"] = rows / timed(
            lambda: read_noop.write.format("noop").mode("overwrite").save()
        )
        read_parquet = spark.read.parquet(path)
        figures["parquet_scan_rows_per_s"] = rows / timed(
            lambda: read_parquet.write.format("noop").mode("overwrite").save()
        )
        figures.update(nyala_figures(spark, df, rows, tservers, tmp))
    noop_after = noop_figures(df, rows)
    spark.stop()
    # The no-op sink before and after everything else: noise in one of those minutes (or JIT
    # compiling still going on in the first) then moves the baseline half as much.
    figures["noop_rows_per_s_before"] = noop_before[0]
    figures["noop_rows_per_s_after"] = noop_after[0]
    figures["noop_rows_per_s"] = statistics.mean([noop_before[0], noop_after[0]])
    figures["machine_cpu_us_per_row_noop"] = statistics.mean([noop_before[1], noop_after[1]])
    figures["ratio_vs_noop"] = figures["nyala_rows_per_s"] / figures["noop_rows_per_s"]
    figures["scan_ratio_vs_noop"] = (
        figures["nyala_scan_rows_per_s"] / figures["noop_source_rows_per_s"]
    )
    return figures


def noop_figures(df: Any, rows: int) -> tuple[float, float]:
    """Rows/s and machine CPU microseconds per row of ``df`` written to the no-op sink."""
    cpu_before = machine_cpu_s()
    seconds = timed(lambda: df.write.format("nyala_bench_noop").mode("append").save())
    return rows / seconds, (machine_cpu_s() - cpu_before) / rows * 1e6


def nyala_write(df: Any, masters: str, table: str) -> None:
    """``df`` inserted into ``table`` through the nyala data source."""
    (
        df.write.format("nyala")
        .option("nyala.masters", masters)
        .option("nyala.table", table)
        .option("nyala.operation", "insert")
        .mode("append")
        .save()
    )


def nyala_figures(spark: Any, df: Any, rows: int, tservers: int, tmp: str) -> dict[str, Any]:
    """Load and read-back through a real cluster: 1 master, ``tservers`` tservers, RF 3."""
    import nyala.spark
    from nyala.client import connect
    from nyala.partition import HashPartitioning
    from nyala.schema import Schema
    from nyala.testing import MiniCluster
    from nyala.testing.procstat import cpu_seconds, faulted_bytes

    nyala.spark.register(spark)
    with MiniCluster(tservers, num_masters=1) as cluster:
        masters = ",".join(cluster.master_addrs)
        with connect(masters) as client:
            for name in (TABLE, WARM_UP_TABLE):
                client.create_table(
                    name,
                    Schema.parse(
                        "id:int64, v:double, s:string, ts:timestamp, n:int32?", key=["id"]
                    ),
                    partitioning=HashPartitioning(["id"], buckets=2 * tservers),
                    replicas=min(3, tservers),
                )
        # As for the no-op sink: the first nyala job of the session (both task slots) imports
        # nyala into the reused Python workers and opens their channels; keep that out of the
        # load's figure and report it on its own.
        first_job_s = timed(lambda: nyala_write(bench_frame(spark, 2000), masters, WARM_UP_TABLE))
        pids = [p for p in (cluster.tserver(i).pid for i in range(tservers)) if p is not None]
        machine_before, servers_before = machine_cpu_s(), cpu_seconds(pids)
        faulted_before = faulted_bytes(pids)
        load_s = timed(lambda: nyala_write(df, masters, TABLE))
        machine_us = (machine_cpu_s() - machine_before) / rows * 1e6
        servers_us = (cpu_seconds(pids) - servers_before) / rows * 1e6
        faulted_per_row = (faulted_bytes(pids) - faulted_before) / rows
        table = (
            spark.read.format("nyala")
            .option("nyala.masters", masters)
            .option("nyala.table", TABLE)
            .load()
        )
        scan_s = timed(lambda: table.write.format("noop").mode("overwrite").save())
        read_back = table.count()
    if read_back != rows:
        raise SystemExit(f"read back {read_back} rows, wrote {rows}")
    return {
        "nyala_first_job_s": first_job_s,
        "nyala_rows_per_s": rows / load_s,
        "nyala_scan_rows_per_s": rows / scan_s,
        "machine_cpu_us_per_row_nyala": machine_us,
        "tserver_cpu_us_per_row": servers_us,
        "tserver_faulted_bytes_per_row": faulted_per_row,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{ROWS_QUICK} rows")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--tservers", type=int, default=3)
    args = parser.parse_args()
    rows = args.rows or (ROWS_QUICK if args.quick else ROWS_FULL)
    started = time.perf_counter()
    figures = run(rows, args.tservers)
    figures["elapsed_s"] = round(time.perf_counter() - started, 1)
    for name, value in figures.items():
        shown = f"{value:,.3f}" if isinstance(value, float) and value < 100 else f"{value:,.0f}"
        print(f"{name:>26}: {shown}")
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}))


if __name__ == "__main__":
    main()
