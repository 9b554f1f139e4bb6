"""Scan benchmark at size (issue 30): 3 tservers (1 master), replication factor 3, 4 hash
buckets, rows of 10 columns loaded and flushed to rowsets; then 4 concurrent full scans through
the leaders, next to the baseline measured in the same run: ``pyarrow.parquet`` reading the same
tablets' rowset files (one replica of each), also by 4 concurrent readers.

Reported: scan rows/s and parquet rows/s (each: 4 × rows / wall time of the 4 readers), their
ratio ``scan_vs_parquet_ratio``; the largest growth of any tserver's RSS over its level before
the scans, sampled every 50 ms while they run (``tserver_rss_growth_mib_max``); and how many
tablet terms changed during the scans (``term_changes_during_scans``). The last line is one
JSON object with the figures and the baseline.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import nyala
from nyala.testing import MiniCluster, ServerProcess
from nyala.testing.procstat import rss_kib

SCHEMA = nyala.Schema.parse(
    "id:int64, a:int64, b:int64, c:int32, d:double, e:double, f:float, g:bool, s:string, t:string?",
    key=["id"],
)
#: Memory flushed often and soon, so the scans (and the baseline) read rowset files.
TSERVER_FLAGS = [
    "--heartbeat-interval-ms",
    "200",
    "--master-heartbeat-interval-ms",
    "200",
    "--flush-threshold-mb",
    "32",
    "--flush-interval-ms",
    "2000",
]
LOAD_BATCH_ROWS = 500_000
SCANS = 4
RSS_SAMPLE_S = 0.05


def data(start: int, rows: int) -> pa.Table:
    rng = np.random.default_rng(start)
    ids = np.arange(start, start + rows, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "a": rng.integers(0, 1 << 40, rows),
            "b": ids * 7,
            "c": (ids % 100_000).astype(np.int32),
            "d": rng.random(rows),
            "e": ids / 3,
            "f": rng.random(rows).astype(np.float32),
            "g": ids % 2 == 0,
            "s": pa.array(np.char.add("v", (ids % 10_000).astype(str))),
            "t": pa.array(np.char.add("w", (ids % 997).astype(str))),
        }
    )


def term_sum(cluster: MiniCluster) -> int:
    """Each tablet's Raft term on each tserver, summed (any election raises it)."""
    total = 0
    for server in cluster.tservers:
        url = f"http://{server.http_addr}/metrics"
        body = urllib.request.urlopen(url, timeout=30).read().decode()
        for line in body.splitlines():
            if line.startswith("nyala_tablet_raft_term{"):
                total += int(float(line.rsplit(" ", 1)[1]))
    return total


def concurrently(readers: int, read: Callable[[], int]) -> tuple[float, int]:
    """(wall seconds, rows) of ``readers`` threads each running ``read`` once."""
    counts: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            counts.append(read())
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(readers)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - start, sum(counts)


def rowset_files(cluster: MiniCluster, table: nyala.Table) -> list[Path]:
    """The rowset files of one replica (the leader's) of each of ``table``'s tablets."""
    by_uuid: dict[str, ServerProcess] = {ts.uuid: ts for ts in cluster.tservers}
    files: list[Path] = []
    for tablet in table.tablets():
        assert tablet.leader_uuid is not None
        server = by_uuid[tablet.leader_uuid]
        files += sorted((server.fs_root / "data" / tablet.tablet_id).glob("rs-*.parquet"))
    return files


def wait_flushed(cluster: MiniCluster, table: nyala.Table, rows: int, timeout_s: float) -> None:
    """Waits until the leaders' rowset files hold every row (memory flushed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            files = rowset_files(cluster, table)
            on_disk = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        except (OSError, pa.ArrowInvalid):
            on_disk = -1  # a rowset being written or replaced
        if on_disk == rows:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {on_disk} of {rows} rows reached rowset files")
        time.sleep(0.5)


class RssSampler:
    """The highest RSS of each process while running, sampled in a thread."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.peak_kib = {pid: rss_kib(pid) for pid in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(RSS_SAMPLE_S):
            for pid in self.pids:
                self.peak_kib[pid] = max(self.peak_kib[pid], rss_kib(pid))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2M rows (< 2 minutes)")
    parser.add_argument("--rows", type=int, default=0, help="rows to load (default 10M)")
    args = parser.parse_args()
    rows = args.rows or (2_000_000 if args.quick else 10_000_000)
    with (
        MiniCluster(
            3,
            num_masters=1,
            tserver_flags=TSERVER_FLAGS,
            master_flags=["--heartbeat-interval-ms", "200"],
        ) as cluster,
        nyala.connect(cluster.master_addrs, timeout_ms=300_000) as client,
    ):
        table = client.create_table(
            "scanbench", SCHEMA, partitioning=nyala.HashPartitioning(["id"], 4), replicas=3
        )
        load_start = time.perf_counter()
        for start in range(0, rows, LOAD_BATCH_ROWS):
            assert table.insert(data(start, min(LOAD_BATCH_ROWS, rows - start))).ok
        load_s = time.perf_counter() - load_start
        wait_flushed(cluster, table, rows, timeout_s=120)
        files = rowset_files(cluster, table)

        def parquet_read() -> int:
            return sum(pq.read_table(f).num_rows for f in files)

        def scan_read() -> int:
            return sum(batch.num_rows for batch in table.scan().to_reader())

        parquet_s, parquet_rows = concurrently(SCANS, parquet_read)
        pids = [ts.pid for ts in cluster.tservers if ts.pid is not None]
        before_kib = {pid: rss_kib(pid) for pid in pids}
        terms_before = term_sum(cluster)
        with RssSampler(pids) as sampler:
            scan_s, scanned = concurrently(SCANS, scan_read)
        term_changes = term_sum(cluster) - terms_before
    assert scanned == SCANS * rows, (scanned, rows)
    assert parquet_rows == SCANS * rows, (parquet_rows, rows)
    scan_rps = scanned / scan_s
    parquet_rps = parquet_rows / parquet_s
    growth_mib = max(sampler.peak_kib[p] - before_kib[p] for p in pids) / 1024
    print(f"loaded {rows:,} rows × 10 columns in {load_s:.1f} s ({rows / load_s:,.0f} rows/s)")
    print(f"{SCANS} parquet reads of the rowset files (baseline): {parquet_rps:12,.0f} rows/s")
    print(f"{SCANS} full scans through the leaders:              {scan_rps:12,.0f} rows/s")
    print(f"scan / parquet: {scan_rps / parquet_rps:.2f}")
    print(f"largest tserver RSS growth during the scans: {growth_mib:.1f} MiB")
    print(f"term changes during the scans: {term_changes}")
    result = {
        "rows": rows,
        "columns": 10,
        "concurrent_scans": SCANS,
        "scan_rows_per_s": round(scan_rps),
        "scan_vs_parquet_ratio": round(scan_rps / parquet_rps, 3),
        "tserver_rss_growth_mib_max": round(growth_mib, 1),
        "term_changes_during_scans": term_changes,
        "load_rows_per_s": round(rows / load_s),
        "baseline": {"parquet_rows_per_s": round(parquet_rps)},
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
