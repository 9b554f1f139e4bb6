"""Memory-limit benchmark (issue 30): the same load into two clusters of 3 tservers (1 master,
replication factor 3, 4 hash buckets, rows of 10 columns), one with the default memory limit (a
fraction of the machine, in effect none) and one with ``--memory-limit-bytes``.

Reported: the highest RSS of any tserver during the limited load, sampled every 50 ms
(``peak_rss_mib_max``, next to ``memory_limit_mib``; target ≤ 1.25 × the limit), the rows
acknowledged but not found by a scan afterwards (``acknowledged_rows_lost``, target 0; a write
refused above the soft limit is retried by the client, so every insert must end OK), and the
limited load's rate over the unlimited one's (``load_ratio_vs_unlimited``, target ≥ 0.7). Also:
the largest tserver RSS before the load (``rss_before_load_mib_max``: an idle server's
interpreter, pyarrow and gRPC, which count against the limit as untracked memory), RSS after the
load once the servers are idle, and writes refused. The full run loads 30M rows with a 1 GiB
limit; ``--quick`` loads 3M rows with 256 MiB (the limit scales less than the rows: an idle
tserver's own RSS is about 110 MiB, and it counts against the limit). The last line is one JSON
object with the figures and the baseline.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import nyala
from nyala.testing import MiniCluster
from nyala.testing.procstat import rss_kib

sys.path.insert(0, str(Path(__file__).resolve().parent))
scan_bench: Any = importlib.import_module("scan_bench")

LOAD_BATCH_ROWS = 500_000
IDLE_WAIT_S = 10.0


def metric(cluster: MiniCluster, name: str) -> float:
    """``name`` (unlabelled) summed over the tservers' /metrics."""
    total = 0.0
    for server in cluster.tservers:
        body = urllib.request.urlopen(f"http://{server.http_addr}/metrics", timeout=30).read()
        for line in body.decode().splitlines():
            if line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
    return total


def load(rows: int, limit_bytes: int | None) -> dict[str, float]:
    """Loads ``rows`` into a fresh cluster (with ``--memory-limit-bytes`` if given)."""
    flags = ["--heartbeat-interval-ms", "200", "--master-heartbeat-interval-ms", "200"]
    if limit_bytes is not None:
        flags += ["--memory-limit-bytes", str(limit_bytes)]
    with (
        MiniCluster(
            3, num_masters=1, tserver_flags=flags, master_flags=["--heartbeat-interval-ms", "200"]
        ) as cluster,
        nyala.connect(cluster.master_addrs, timeout_ms=600_000) as client,
    ):
        table = client.create_table(
            "membench", scan_bench.SCHEMA, partitioning=nyala.HashPartitioning(["id"], 4)
        )
        pids = [ts.pid for ts in cluster.tservers if ts.pid is not None]
        # An idle tserver (interpreter, pyarrow, gRPC, the replicas): untracked memory.
        before_mib = max(rss_kib(pid) for pid in pids) / 1024
        acknowledged = 0
        with scan_bench.RssSampler(pids) as sampler:
            start = time.perf_counter()
            for first in range(0, rows, LOAD_BATCH_ROWS):
                count = min(LOAD_BATCH_ROWS, rows - first)
                result = table.insert(scan_bench.data(first, count))
                acknowledged += result.applied
            load_s = time.perf_counter() - start
        time.sleep(IDLE_WAIT_S)
        idle_mib = max(rss_kib(pid) for pid in pids) / 1024
        found = sum(b.num_rows for b in table.scan(columns=["id"]).to_reader())
        refused = metric(cluster, "nyala_writes_refused_memory_total")
    return {
        "rows_per_s": rows / load_s,
        "peak_rss_mib": max(sampler.peak_kib.values()) / 1024,
        "before_rss_mib": before_mib,
        "idle_rss_mib": idle_mib,
        "acknowledged": acknowledged,
        "lost": acknowledged - found if found <= acknowledged else 0,
        "extra": max(0, found - acknowledged),
        "refused": refused,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3M rows, 256 MiB (< 2 minutes)")
    parser.add_argument("--rows", type=int, default=0, help="rows to load (default 30M)")
    parser.add_argument("--limit-mib", type=int, default=0, help="limit (default 1024)")
    args = parser.parse_args()
    rows = args.rows or (3_000_000 if args.quick else 30_000_000)
    limit_mib = args.limit_mib or (256 if args.quick else 1024)
    unlimited = load(rows, None)
    limited = load(rows, limit_mib << 20)
    ratio = limited["rows_per_s"] / unlimited["rows_per_s"]
    print(f"{rows:,} rows × 10 columns, 3 tservers, RF 3")
    for name, run in (("no limit (baseline)", unlimited), (f"{limit_mib} MiB limit", limited)):
        print(
            f"{name:>20}: {run['rows_per_s']:10,.0f} rows/s, peak RSS {run['peak_rss_mib']:7.0f}"
            f" MiB, idle RSS {run['idle_rss_mib']:6.0f} MiB (before the load"
            f" {run['before_rss_mib']:4.0f}), refused {run['refused']:.0f},"
            f" lost {run['lost']:.0f}"
        )
    result = {
        "rows": rows,
        "columns": 10,
        "memory_limit_mib": limit_mib,
        "peak_rss_mib_max": round(limited["peak_rss_mib"], 1),
        "acknowledged_rows_lost": int(limited["lost"]),
        "load_ratio_vs_unlimited": round(ratio, 3),
        "load_rows_per_s": round(limited["rows_per_s"]),
        "idle_rss_mib_max": round(limited["idle_rss_mib"], 1),
        "rss_before_load_mib_max": round(limited["before_rss_mib"], 1),
        "writes_refused": int(limited["refused"]),
        "baseline": {
            "load_rows_per_s": round(unlimited["rows_per_s"]),
            "peak_rss_mib_max": round(unlimited["peak_rss_mib"], 1),
            "idle_rss_mib_max": round(unlimited["idle_rss_mib"], 1),
            "rss_before_load_mib_max": round(unlimited["before_rss_mib"], 1),
            "acknowledged_rows_lost": int(unlimited["lost"]),
        },
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
