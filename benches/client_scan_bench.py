"""Client scan benchmark: a 3-tserver cluster (1 master), replication factor 3, 4 hash buckets,
200k rows × 4 columns (quick) loaded once; then, in one run:

* full scans: rows/s of ``table.scan().to_arrow()`` through the leaders (baseline, ReadIndex on
  each tablet) and through followers (``replica="follower"``, no ReadIndex);
* point lookups (``where id = k``, one row): latency through the leader with partition pruning
  (one tablet), the same lookup written as ``id >= k and id <= k`` which cannot be pruned (the
  baseline: every tablet is asked), and the pruned lookup served by a follower;
* snapshot scans (issue 34): a quarter of the rows is then updated twice (so they have three
  versions), and full scans at the latest state (baseline) and at a snapshot timestamp taken
  between the two updates run alternately: ``snapshot_vs_latest_ratio`` (target >= 0.8).

Medians of the runs. The last line is one JSON object with the figures and the baselines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import nyala
from nyala.testing import MiniCluster

RAFT_FLAGS = ["--heartbeat-interval-ms", "200"]
SCHEMA = nyala.Schema.parse("id:int64, a:int64, b:double, c:string", key=["id"])


def data(rows: int) -> pa.Table:
    rng = np.random.default_rng(7)
    ids = np.arange(rows, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "a": rng.integers(0, 1 << 40, rows),
            "b": rng.random(rows),
            "c": pa.array(np.char.add("v", (ids % 10_000).astype(str))),
        }
    )


def rows_per_s(scan: Callable[[], pa.Table], rows: int, runs: int) -> float:
    rates = []
    for _ in range(runs):
        start = time.perf_counter()
        got = scan()
        rates.append(rows / (time.perf_counter() - start))
        assert got.num_rows == rows, got.num_rows
    return statistics.median(rates)


def lookup_ms(table: nyala.Table, rows: int, lookups: int, pruned: bool, replica: str) -> float:
    rng = np.random.default_rng(11)
    times = []
    for key in rng.integers(0, rows, lookups).tolist():
        where = [("id", "=", key)] if pruned else [("id", ">=", key), ("id", "<=", key)]
        start = time.perf_counter()
        got = table.scan(where=where, replica=replica, max_staleness_ms=5_000).to_arrow()
        times.append((time.perf_counter() - start) * 1000)
        assert got.num_rows == 1
    return statistics.median(times)


def snapshot_vs_latest(table: nyala.Table, rows: int, runs: int) -> tuple[float, float]:
    """(latest, snapshot) full-scan rows/s, run alternately, over rows of which a quarter
    has three versions; the snapshot is taken between the two updates."""
    full = data(rows)
    changed = full.filter(pc.equal(pc.bit_wise_and(full["id"], 3), 0))
    first = changed.set_column(1, "a", pa.array(np.zeros(changed.num_rows, dtype=np.int64)))
    assert table.update(first).ok
    between = table.scan(columns=["id"], read_mode="snapshot")
    assert between.count() == rows
    snapshot_ts = between.snapshot_ts
    second = changed.set_column(1, "a", pa.array(np.ones(changed.num_rows, dtype=np.int64)))
    assert table.update(second).ok
    latest, snapshot = [], []
    for _ in range(runs):
        latest.append(rows_per_s(lambda: table.scan().to_arrow(), rows, 1))
        snapshot.append(
            rows_per_s(
                lambda: table.scan(read_mode="snapshot", snapshot_ts=snapshot_ts).to_arrow(),
                rows,
                1,
            )
        )
    return statistics.median(latest), statistics.median(snapshot)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200k rows, 3 runs (< 2 minutes)")
    args = parser.parse_args()
    rows = 200_000 if args.quick else 1_000_000
    runs = 3 if args.quick else 5
    lookups = 100 if args.quick else 500
    flags = [*RAFT_FLAGS, "--master-heartbeat-interval-ms", "200"]
    with (
        MiniCluster(3, num_masters=1, tserver_flags=flags, master_flags=RAFT_FLAGS) as cluster,
        nyala.connect(cluster.master_addrs, timeout_ms=120_000) as client,
    ):
        table = client.create_table(
            "scanbench", SCHEMA, partitioning=nyala.HashPartitioning("id", 4), replicas=3
        )
        assert table.upsert(data(rows)).ok
        # Followers learn the last commit index with the next heartbeat.
        deadline = time.monotonic() + 30
        while table.scan(columns=["id"], replica="follower").count() < rows:
            assert time.monotonic() < deadline, "followers did not catch up"
            time.sleep(0.2)
        leader_rps = rows_per_s(lambda: table.scan().to_arrow(), rows, runs)
        follower_rps = rows_per_s(lambda: table.scan(replica="follower").to_arrow(), rows, runs)
        unpruned_ms = lookup_ms(table, rows, lookups, pruned=False, replica="leader")
        pruned_ms = lookup_ms(table, rows, lookups, pruned=True, replica="leader")
        follower_ms = lookup_ms(table, rows, lookups, pruned=True, replica="follower")
        latest_rps, snapshot_rps = snapshot_vs_latest(table, rows, runs)
    print(f"full scan, leader (baseline): {leader_rps:12,.0f} rows/s")
    print(f"full scan, follower:          {follower_rps:12,.0f} rows/s")
    print(f"point lookup, unpruned (baseline, 4 tablets): {unpruned_ms:7.2f} ms")
    print(f"point lookup, pruned, leader:                 {pruned_ms:7.2f} ms")
    print(f"point lookup, pruned, follower:               {follower_ms:7.2f} ms")
    print(f"full scan, latest, 3 versions of 1/4 (baseline): {latest_rps:12,.0f} rows/s")
    print(f"full scan, at a snapshot:                        {snapshot_rps:12,.0f} rows/s")
    result = {
        "rows": rows,
        "scan_rows_per_s_leader": round(leader_rps),
        "scan_rows_per_s_follower": round(follower_rps),
        "lookup_ms_unpruned_baseline": round(unpruned_ms, 3),
        "lookup_ms_pruned_leader": round(pruned_ms, 3),
        "lookup_ms_pruned_follower": round(follower_ms, 3),
        "latest_scan_rows_per_s": round(latest_rps),
        "snapshot_scan_rows_per_s": round(snapshot_rps),
        "snapshot_vs_latest_ratio": round(snapshot_rps / latest_rps, 3),
        "baseline": {
            "scan_rows_per_s_leader": round(leader_rps),
            "lookup_ms_unpruned": round(unpruned_ms, 3),
        },
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
