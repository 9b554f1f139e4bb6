"""Many tablets per server: what thousands of idle replicas cost a tablet server.

One master and three tablet servers (real processes on loopback), replication factor 3, so
every tablet has a replica on every server. The benchmark steps through 300, 1,000 and 2,000
replicas per tablet server (``--steps``; ``--quick``: 30 and 2,000), adding tables of up to
``--buckets-per-table`` hash buckets until the step's count is reached, and for each step
measures:

* ``create_s``: seconds to create the step's new tables (every tablet has a leader);
* ``idle_cpu_core_fraction_max``: the busiest tablet server's CPU (user + system, from
  ``/proc``) over ``--idle-s`` seconds of idleness, as a fraction of one core;
* ``threads_max``, ``rss_mib_max`` and ``fds_max``: the most threads, resident memory and open
  file descriptors of a tablet server at the end of the idle period;
* ``idle_term_changes``: Raft term changes summed over every tablet during the idle period
  (from each server's ``nyala_tablet_raft_term`` gauges; 0 means no election while idle);
* ``write_rows_per_s`` and ``write_timeouts``: a write of ``--rows`` rows spread over every
  tablet of every table (each table gets an equal share, hashed over its buckets), and the
  writes that failed.

The first step (30 replicas per server with ``--quick``, or whatever ``--steps`` starts with)
is the baseline measured in the same run. The last line is one JSON object:
``{"steps": [{"replicas_per_tserver": N, "create_s": ..., "idle_cpu_core_fraction_max": ...,
"threads_max": ..., "rss_mib_max": ..., "idle_term_changes": ..., "write_rows_per_s": ...,
"write_timeouts": ...}, ...]}``. Goal at 2,000 replicas per tablet server (issue "Thousands of
tablet replicas per server"): idle CPU <= 0.10 of a core, <= 200 threads, no term change,
no write timeout, RSS <= 1,536 MiB per tablet server.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.request

import numpy as np
import pyarrow as pa

from nyala.client import connect
from nyala.client.client import Client
from nyala.errors import NyalaError
from nyala.partition import HashPartitioning
from nyala.schema import Schema
from nyala.testing import MiniCluster
from nyala.testing.mini_cluster import ServerProcess
from nyala.testing.procstat import cpu_seconds, status_field

SCHEMA = Schema.parse("id:int64, v:string?", key=["id"])
CREATE_TIMEOUT_S = 1_800.0


def terms(server: ServerProcess) -> dict[str, float]:
    """Each tablet's Raft term on one server, from its /metrics (that family only)."""
    url = f"http://{server.http_addr}/metrics?metrics=nyala_tablet_raft_term"
    body = urllib.request.urlopen(url, timeout=30).read()
    out = {}
    for line in body.decode().splitlines():
        if line.startswith("nyala_tablet_raft_term{"):
            tablet = line.split('tablet_id="', 1)[1].split('"', 1)[0]
            out[tablet] = float(line.rsplit(" ", 1)[1])
    return out


def term_sum(cluster: MiniCluster) -> float:
    """The highest term each tablet has on any server, summed over tablets."""
    best: dict[str, float] = {}
    for server in cluster.tservers:
        for tablet, term in terms(server).items():
            best[tablet] = max(best.get(tablet, 0.0), term)
    return sum(best.values())


def pid_of(server: ServerProcess) -> int:
    assert server.pid is not None, "the server runs"
    return server.pid


def grow(client: Client, tables: list[str], tablets_now: int, wanted: int, buckets: int) -> int:
    """Creates tables of up to ``buckets`` buckets until there are ``wanted`` tablets."""
    while tablets_now < wanted:
        count = min(buckets, wanted - tablets_now)
        name = f"t{len(tables)}"
        client.create_table(
            name,
            SCHEMA,
            partitioning=HashPartitioning(["id"], buckets=count),
            replicas=3,
        )
        tables.append(name)
        tablets_now += count
    return tablets_now


def idle(cluster: MiniCluster, idle_s: float) -> tuple[float, int, float, float, int]:
    """(busiest server's CPU fraction, most threads, most RSS MiB, term changes, most open
    file descriptors) over an idle period."""
    pids = [pid_of(s) for s in cluster.tservers]
    terms_before = term_sum(cluster)
    cpu_before = [cpu_seconds([p]) for p in pids]
    start = time.monotonic()
    time.sleep(idle_s)
    elapsed = time.monotonic() - start
    cpu = max((cpu_seconds([p]) - b) / elapsed for p, b in zip(pids, cpu_before, strict=True))
    threads = max(status_field(p, "Threads") for p in pids)
    rss_mib = max(status_field(p, "VmRSS") for p in pids) / 1024
    fds = max(len(os.listdir(f"/proc/{p}/fd")) for p in pids)
    return cpu, threads, rss_mib, term_sum(cluster) - terms_before, fds


def write_everywhere(client: Client, tables: list[str], rows: int) -> tuple[float, int]:
    """(rows/s, failed writes) of ``rows`` rows spread over every table's tablets."""
    per_table = max(1, rows // len(tables))
    rng = np.random.default_rng(7)
    batches = []
    for name in tables:
        ids = rng.integers(0, 2**62, per_table, dtype=np.int64)
        batches.append((name, pa.table({"id": ids, "v": pa.array(["x"] * per_table)})))
    failures = 0
    start = time.monotonic()
    for name, batch in batches:
        try:
            result = client.table(name).upsert(batch)
            failures += len(result.row_errors)
        except NyalaError:
            failures += 1
    elapsed = time.monotonic() - start
    return per_table * len(tables) / elapsed, failures


def run(steps: list[int], buckets: int, idle_s: float, rows: int) -> list[dict[str, float]]:
    out: list[dict[str, float]] = []
    flags = ["--heartbeat-interval-ms", "500"]
    with MiniCluster(3, num_masters=1, tserver_flags=flags, start_timeout_s=120) as cluster:
        client = connect(
            ",".join(cluster.master_addrs), admin_timeout_ms=int(CREATE_TIMEOUT_S * 1000)
        )
        tables: list[str] = []
        tablets = 0
        try:
            for wanted in steps:
                start = time.monotonic()
                tablets = grow(client, tables, tablets, wanted, buckets)
                create_s = time.monotonic() - start
                cpu, threads, rss_mib, term_changes, fds = idle(cluster, idle_s)
                rows_per_s, failures = write_everywhere(client, tables, rows)
                step = {
                    "replicas_per_tserver": wanted,
                    "create_s": round(create_s, 1),
                    "idle_cpu_core_fraction_max": round(cpu, 3),
                    "threads_max": threads,
                    "rss_mib_max": round(rss_mib, 1),
                    "idle_term_changes": int(term_changes),
                    "write_rows_per_s": round(rows_per_s),
                    "write_timeouts": failures,
                    "fds_max": fds,
                }
                out.append(step)
                print(json.dumps(step), flush=True)
        finally:
            client.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="30 and 2,000 replicas only")
    parser.add_argument("--steps", default="30,300,1000,2000", help="replicas per tserver")
    parser.add_argument("--buckets-per-table", type=int, default=100)
    parser.add_argument("--idle-s", type=float, default=60.0)
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()
    steps = [30, 2000] if args.quick else [int(s) for s in args.steps.split(",")]
    idle_s = min(args.idle_s, 20.0) if args.quick else args.idle_s
    result = run(steps, args.buckets_per_table, idle_s, args.rows)
    base = result[0]
    print(
        f"baseline ({base['replicas_per_tserver']} replicas per tserver): idle CPU "
        f"{base['idle_cpu_core_fraction_max']:.3f} core, {base['threads_max']} threads, "
        f"{base['rss_mib_max']} MiB"
    )
    for step in result[1:]:
        print(
            f"{step['replicas_per_tserver']} replicas per tserver: create {step['create_s']} s,"
            f" idle CPU {step['idle_cpu_core_fraction_max']:.3f} core, "
            f"{step['threads_max']} threads, {step['rss_mib_max']} MiB, "
            f"{step['idle_term_changes']} term changes, {step['write_rows_per_s']} rows/s,"
            f" {step['write_timeouts']} failed writes"
        )
    print(json.dumps({"steps": result}))


if __name__ == "__main__":
    main()
