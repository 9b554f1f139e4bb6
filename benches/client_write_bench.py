"""Client bulk-write benchmark: ``table.upsert(pyarrow.Table)`` of 1M rows × 10 columns into a
3-tserver cluster (1 master), replication factor 3, 4 hash buckets; fsync on.

Measured in one run:

* baseline: the client-side work alone, without sending: converting the same pyarrow Table
  to op batches (``rowops.make_op_batch``) and routing + splitting + IPC-encoding them per
  tablet (``PartitionRouter.split_ipc``), i.e. the ceiling the client's own CPU sets;
* upsert: ``table.upsert(data)`` end to end (every row durable on a majority): rows/s and MB/s
  (Arrow bytes of the input per second), median of the runs.

The last line is one JSON object with ``rows_per_s``, ``mb_per_s`` and the baseline. Target
(issue 11): ``rows_per_s >= 300000`` on the 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import pyarrow as pa

import nyala
from nyala.rowops import make_op_batch
from nyala.testing import MiniCluster

RAFT_FLAGS = ["--heartbeat-interval-ms", "200"]
COLUMNS = 10


def schema() -> nyala.Schema:
    text = "id:int64, " + ", ".join(
        f"c{i}:{kind}"
        for i, kind in enumerate(["int64", "double", "string", "int32", "double"] * 2)
        if i < COLUMNS - 1
    )
    return nyala.Schema.parse(text, key=["id"])


def data(rows: int, first: int = 0) -> pa.Table:
    rng = np.random.default_rng(first)
    ids = np.arange(first, first + rows, dtype=np.int64)
    cols: dict[str, pa.Array] = {"id": pa.array(ids)}
    for column in schema().columns[1:]:
        if column.type == "int64":
            cols[column.name] = pa.array(rng.integers(0, 1 << 40, rows))
        elif column.type == "int32":
            cols[column.name] = pa.array(rng.integers(0, 1 << 30, rows).astype(np.int32))
        elif column.type == "double":
            cols[column.name] = pa.array(rng.random(rows))
        else:
            cols[column.name] = pa.array(np.char.add("v", (ids % 100_000).astype(str)))
    return pa.table(cols)


def baseline(table: nyala.Table, rows: pa.Table) -> float:
    """Seconds to build and split the op batches of ``rows`` without sending them."""
    from nyala.client.write import _chunks

    locations = table._client._cache.locations(table._info)
    start = time.perf_counter()
    batch = make_op_batch(rows, "upsert", table.schema)
    for _, chunk in _chunks(batch, len(locations.tablets)):
        locations.router.split_ipc(chunk)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1M rows, 2 runs (< 2 minutes)")
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    runs = 2 if args.quick else 5
    with (
        MiniCluster(3, num_masters=1, master_flags=RAFT_FLAGS, tserver_flags=RAFT_FLAGS) as cluster,
        nyala.connect(cluster.master_addrs, timeout_ms=120_000) as client,
    ):
        table = client.create_table(
            "bench", schema(), partitioning=nyala.HashPartitioning("id", 4), replicas=3
        )
        rows = data(args.rows)
        megabytes = rows.nbytes / 1e6
        base_s = statistics.median(baseline(table, rows) for _ in range(3))
        timings = []
        for run in range(runs):
            batch = data(args.rows, first=run * args.rows) if run else rows
            start = time.perf_counter()
            result = table.upsert(batch, timeout_ms=120_000)
            timings.append(time.perf_counter() - start)
            if not result.ok:
                raise SystemExit(f"bench: {len(result.row_errors)} row errors")
            print(f"run {run}: {args.rows / timings[-1]:,.0f} rows/s")
        total = table.count()
        if total != args.rows * runs:
            raise SystemExit(f"bench: {total} rows read back, {args.rows * runs} written")
    upsert_s = statistics.median(timings)
    result_doc = {
        "rows": args.rows,
        "columns": COLUMNS,
        "runs": runs,
        "rows_per_s": round(args.rows / upsert_s),
        "mb_per_s": round(megabytes / upsert_s, 1),
        "baseline_encode_split_rows_per_s": round(args.rows / base_s),
        "baseline_encode_split_mb_per_s": round(megabytes / base_s, 1),
        "client_share_of_time": round(base_s / upsert_s, 3),
    }
    print(
        f"upsert {result_doc['rows_per_s']:,} rows/s ({result_doc['mb_per_s']} MB/s); "
        f"client encode+split alone {result_doc['baseline_encode_split_rows_per_s']:,} rows/s"
    )
    print(json.dumps(result_doc))


if __name__ == "__main__":
    main()
