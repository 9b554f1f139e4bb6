"""Client bulk-write benchmark: ``table.upsert(pyarrow.Table)`` of 1M rows × 10 columns into a
3-tserver cluster (1 master), replication factor 3, 4 hash buckets; fsync on.

Measured in one run:

* client encode: the client-side work alone, without sending, exactly as ``Writer._requests``
  does it: converting the same pyarrow Table to an op batch (``rowops.make_op_batch``) and
  routing + splitting + IPC-encoding it into capped requests per tablet
  (``PartitionRouter.split_requests``), i.e. the ceiling the client's own CPU sets
  (``client_encode_rows_per_s``, median of 5);
* upsert: ``table.upsert(data)`` end to end (every row durable on a majority): rows/s and MB/s
  (Arrow bytes of the input per second), median of the runs; and where the CPU went: CPU
  microseconds per row in the client process and in the three tservers together (the servers'
  figure includes replication to followers and fsync), which says who limits the end-to-end
  figure on a shared machine;
* upsert with 1 % bad rows (issue 32): the same upsert where half a percent of the rows hold a
  null in a NOT NULL column and half a percent a value out of range for their int32 column
  (given as int64), each run right after an all-good one: input rows/s, and its ratio to the
  all-good figure of the same run (``bad_rows_ratio``, target >= 0.9). Every bad row must come
  back as its own row error and every other row be applied.

The last line is one JSON object with ``rows_per_s``, ``mb_per_s``, ``client_encode_rows_per_s``,
the CPU split, the memory the servers faulted in per input byte, ``bad_rows_rows_per_s`` and
``bad_rows_ratio``. Target (issue 11): ``rows_per_s >= 300000`` on the 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import pyarrow as pa

import nyala
from nyala.rowops import prepare_op_batch
from nyala.testing import MiniCluster
from nyala.testing.procstat import cpu_seconds, faulted_bytes

RAFT_FLAGS = ["--heartbeat-interval-ms", "200"]
COLUMNS = 10
#: Share of rows made bad in the bad-rows runs (half nulls, half out of range).
BAD_ROWS_SHARE = 0.01


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


def with_bad_rows(rows: pa.Table, seed: int) -> tuple[pa.Table, int]:
    """``rows`` with ``BAD_ROWS_SHARE`` of them broken: a null in NOT NULL ``c1`` (double) for
    half, a value out of range for int32 ``c3`` (given as int64) for the other half. Returns
    the table and how many rows are bad."""
    n = rows.num_rows
    rng = np.random.default_rng(seed)
    bad = rng.choice(n, size=int(n * BAD_ROWS_SHARE), replace=False)
    nulls, out_of_range = bad[: len(bad) // 2], bad[len(bad) // 2 :]
    mask = np.zeros(n, dtype=bool)
    mask[nulls] = True
    c1 = pa.array(rows.column("c1").to_numpy(), mask=mask)
    c3 = rows.column("c3").to_numpy().astype(np.int64)
    c3[out_of_range] = (1 << 40) + out_of_range
    rows = rows.set_column(rows.schema.get_field_index("c1"), "c1", c1)
    rows = rows.set_column(rows.schema.get_field_index("c3"), "c3", pa.array(c3))
    return rows, len(bad)


def encode_seconds(table: nyala.Table, rows: pa.Table) -> float:
    """Seconds to build the op batch of ``rows`` and cut it into encoded per-tablet requests
    (what ``Writer._requests`` does) without sending them."""
    from nyala.client.write import WRITE_REQUEST_BYTES_MAX, WRITE_REQUEST_ROWS_MAX

    locations = table._client._cache.locations(table._info)
    start = time.perf_counter()
    prepared = prepare_op_batch(rows, "upsert", table.schema)
    requests, _ = locations.router.split_requests(
        prepared.batch, WRITE_REQUEST_ROWS_MAX, WRITE_REQUEST_BYTES_MAX
    )
    elapsed = time.perf_counter() - start
    if sum(len(positions) for _, positions, _ in requests) != rows.num_rows:  # type: ignore[arg-type,misc]
        raise SystemExit("bench: the requests do not hold every row once")
    return elapsed


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
        encode_s = statistics.median(encode_seconds(table, rows) for _ in range(5))
        pids = [p for p in (cluster.tserver(i).pid for i in range(3)) if p is not None]
        timings, client_cpu, server_cpu, server_faulted = [], [], [], []
        bad_timings, written = [], 0
        for run in range(runs):
            batch = data(args.rows, first=2 * run * args.rows) if run else rows
            start, cpu0, servers0 = time.perf_counter(), time.process_time(), cpu_seconds(pids)
            faulted0 = faulted_bytes(pids)
            result = table.upsert(batch, timeout_ms=120_000)
            timings.append(time.perf_counter() - start)
            client_cpu.append(time.process_time() - cpu0)
            server_cpu.append(cpu_seconds(pids) - servers0)
            server_faulted.append(faulted_bytes(pids) - faulted0)
            if not result.ok:
                raise SystemExit(f"bench: {len(result.row_errors)} row errors")
            # The same upsert with bad rows mixed in, right after (the same machine state).
            mixed, bad = with_bad_rows(data(args.rows, first=(2 * run + 1) * args.rows), run)
            start = time.perf_counter()
            mixed_result = table.upsert(mixed, timeout_ms=120_000)
            bad_timings.append(time.perf_counter() - start)
            if len(mixed_result.row_errors) != bad or mixed_result.applied != args.rows - bad:
                raise SystemExit(f"bench: {mixed_result!r}, expected {bad} bad rows")
            written += 2 * args.rows - bad
            print(
                f"run {run}: {args.rows / timings[-1]:,.0f} rows/s; with 1 % bad rows "
                f"{args.rows / bad_timings[-1]:,.0f} rows/s"
            )
        total = table.count()
        if total != written:
            raise SystemExit(f"bench: {total} rows read back, {written} written")
    upsert_s = statistics.median(timings)
    result_doc = {
        "rows": args.rows,
        "columns": COLUMNS,
        "runs": runs,
        "rows_per_s": round(args.rows / upsert_s),
        "mb_per_s": round(megabytes / upsert_s, 1),
        "client_encode_rows_per_s": round(args.rows / encode_s),
        "client_encode_mb_per_s": round(megabytes / encode_s, 1),
        "client_share_of_time": round(encode_s / upsert_s, 3),
        "client_cpu_us_per_row": round(statistics.median(client_cpu) / args.rows * 1e6, 2),
        "tservers_cpu_us_per_row": round(statistics.median(server_cpu) / args.rows * 1e6, 2),
        # Memory the servers faulted in per byte of input (the last run: the first one also
        # grows the servers' heaps to their working size).
        "tservers_faulted_per_input_byte": round(server_faulted[-1] / rows.nbytes, 2),
        "bad_rows_share": BAD_ROWS_SHARE,
        "bad_rows_rows_per_s": round(args.rows / statistics.median(bad_timings)),
        "bad_rows_ratio": round(statistics.median(timings) / statistics.median(bad_timings), 3),
    }
    print(
        f"upsert {result_doc['rows_per_s']:,} rows/s ({result_doc['mb_per_s']} MB/s); "
        f"client encode+split alone {result_doc['client_encode_rows_per_s']:,} rows/s; "
        f"CPU per row: client {result_doc['client_cpu_us_per_row']} us, "
        f"tservers {result_doc['tservers_cpu_us_per_row']} us; with 1 % bad rows "
        f"{result_doc['bad_rows_rows_per_s']:,} rows/s ({result_doc['bad_rows_ratio']}x)"
    )
    print(json.dumps(result_doc))


if __name__ == "__main__":
    main()
