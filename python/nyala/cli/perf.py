"""``nyala perf loadgen``: a write load generator (Kudu's ``kudu perf loadgen``).

It creates a table (``loadgen_auto_<hex>`` unless ``--table``; a key ``key:int64`` and
``--columns`` more columns cycling int64, double and string), lets ``--threads`` threads each
insert ``--rows-per-thread`` rows with distinct keys in batches of ``--batch-rows`` through one
client (writes of many threads are coalesced per tablet server), and prints the rows written,
the time taken and rows per second. The table is deleted afterwards unless
``--keep-auto-table``.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import click

from nyala.cli.cluster_client import client_for, masters_option, one_line
from nyala.cli.output import emit_one, format_option

_TYPES = ("int64", "double", "string")


@click.group(name="perf")
def group() -> None:
    """Load generators: measure write throughput."""


def loadgen_schema(columns: int) -> Any:
    """``key:int64`` and ``columns`` nullable columns ``c0``, ``c1``, ... of cycling types."""
    from nyala.schema import Column, Schema

    cols = [Column("key", "int64")]
    cols += [Column(f"c{i}", _TYPES[i % len(_TYPES)], nullable=True) for i in range(columns)]
    return Schema(cols, ["key"])


def loadgen_batch(schema: Any, first: int, count: int) -> Any:
    """``count`` rows with keys ``first``.. and values derived from the key."""
    import numpy as np
    import pyarrow as pa

    keys = np.arange(first, first + count, dtype=np.int64)
    data: dict[str, Any] = {"key": keys}
    for column in schema.columns[1:]:
        if column.type == "int64":
            data[column.name] = keys * 7
        elif column.type == "double":
            data[column.name] = keys.astype(np.float64) / 3
        else:
            data[column.name] = pa.array(keys.astype(str)).cast(pa.string())
    return pa.table(data)


@group.command(name="loadgen")
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--rows-per-thread", type=click.IntRange(min=1), default=10_000, show_default=True)
@click.option(
    "--columns", type=click.IntRange(min=0), default=4, show_default=True, help="Non-key columns."
)
@click.option("--batch-rows", type=click.IntRange(min=1), default=1_000, show_default=True)
@click.option("--buckets", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--table", "table_name", default=None, help="Name of the table to create.")
@click.option("--keep-auto-table", is_flag=True, help="Do not delete the table afterwards.")
@masters_option
@format_option
@one_line
def loadgen(
    threads: int,
    rows_per_thread: int,
    columns: int,
    batch_rows: int,
    buckets: int,
    replicas: int,
    table_name: str | None,
    keep_auto_table: bool,
    masters: str,
    fmt: str,
) -> None:
    """Insert generated rows from several threads into a new table; print rows per second."""
    from nyala.partition import HashPartitioning

    name = table_name or f"loadgen_auto_{uuid.uuid4().hex[:12]}"
    schema = loadgen_schema(columns)
    with client_for(masters) as client:
        partitioning = HashPartitioning(["key"], buckets) if buckets > 1 else None
        table = client.create_table(name, schema, partitioning=partitioning, replicas=replicas)
        written = [0] * threads
        failures: list[BaseException] = []

        def run(index: int) -> None:
            first = index * rows_per_thread
            try:
                for start in range(first, first + rows_per_thread, batch_rows):
                    count = min(batch_rows, first + rows_per_thread - start)
                    result = table.insert(loadgen_batch(schema, start, count))
                    written[index] += result.applied
            except BaseException as exc:  # reported after the other threads finish
                failures.append(exc)

        started = time.monotonic()
        workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        elapsed = time.monotonic() - started
        if not keep_auto_table:
            client.delete_table(name)
    if failures:
        raise failures[0]
    rows = sum(written)
    emit_one(
        {
            "table": name if keep_auto_table else None,
            "threads": threads,
            "rows": rows,
            "failed": threads * rows_per_thread - rows,
            "seconds": round(elapsed, 3),
            "rows_per_s": round(rows / elapsed) if elapsed > 0 else None,
        },
        fmt,
    )
    if rows != threads * rows_per_thread:
        raise SystemExit(1)


__all__ = ["group", "loadgen_batch", "loadgen_schema"]
