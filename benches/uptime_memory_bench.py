"""Resident memory over uptime: a mixed load for minutes, and what each tablet server holds.

One master and three tablet servers (real processes on loopback), one table of 24 hash
buckets with three replicas, so every server holds a replica of every tablet and sees the same
load. For ``--minutes`` (``--quick``: 3) the load runs throughout: ``--writers`` threads of
single-row upserts over 200,000 keys, one thread of 5,000-row inserts each followed by a
delete and a re-upsert of 500 earlier keys, and a thread of scans (a range and a snapshot
read) every 2 s. The servers flush every 2 s and keep 30 s of history, so flushes and
compactions run all the time.

The baseline, in the same run: ``tserver-0`` is restarted before the load with
``MALLOC_ARENA_MAX`` set to glibc's own default (eight heaps per core), which a server's
``tune_allocator`` leaves alone; the other two allocate from ``SERVER_MALLOC_ARENAS`` heaps as
every server does (docs/performance.md, "Resident memory that grows with uptime").

Each server's RSS is sampled every 15 s. Reported: ``rss_start_mib`` (the first sample, 30 s
in) and ``rss_end_mib`` (the median of the last three) per server, ``growth_mib`` for the
capped servers (their median) and ``growth_mib_default_heaps`` for the baseline,
``growth_ratio`` (capped over baseline; below 1 is better), the master's RSS at the same
two points (``master_rss_start_mib``, ``master_rss_end_mib``), the writes done and ``errors``
(any failed write or scan; must be 0). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import threading
import time

import numpy as np

import nyala
from nyala.errors import NyalaError
from nyala.testing import MiniCluster
from nyala.testing.mini_cluster import FAST_TSERVER_FLAGS, fast_master_flags
from nyala.testing.procstat import rss_kib

SCHEMA = nyala.Schema.parse("id:int64, v:int64?, s:string?", key=["id"])
SAMPLE_EVERY_S = 15.0
FIRST_SAMPLE_S = 30.0
#: glibc's default number of heaps on 64-bit: eight per core.
GLIBC_ARENAS_PER_CORE = 8


def rss_mib(pid: int) -> float:
    return rss_kib(pid) / 1024


class Load:
    """The mixed load's threads; counts what they did and every error."""

    def __init__(self, table: nyala.Table, writers: int) -> None:
        self.table = table
        self.stop = threading.Event()
        self.counts = {"single": 0, "batch": 0, "scan": 0, "errors": 0}
        self._lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._single, args=(seed,), daemon=True)
            for seed in range(writers)
        ] + [
            threading.Thread(target=self._batches, daemon=True),
            threading.Thread(target=self._scans, daemon=True),
        ]

    def _count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    def _failed(self, what: str, error: Exception) -> None:
        self._count("errors")
        print(f"{what} failed: {error!r}"[:300], flush=True)
        time.sleep(0.5)

    def _single(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            row = {"id": [rng.randrange(200_000)], "v": [rng.randrange(1000)], "s": ["x" * 50]}
            try:
                self.table.upsert(row).raise_for_errors()
                self._count("single")
            except NyalaError as error:
                self._failed("single", error)

    def _batches(self) -> None:
        rng = np.random.default_rng(1)
        next_id = 1_000_000
        while not self.stop.is_set():
            ids = np.arange(next_id, next_id + 5_000)
            next_id += 5_000
            old = rng.choice(200_000, 500, replace=False)
            try:
                self.table.insert(
                    {"id": ids, "v": rng.integers(0, 1000, 5_000), "s": ["y" * 40] * 5_000}
                ).raise_for_errors()
                self.table.delete({"id": old})  # some are gone already: row errors expected
                self.table.upsert(
                    {"id": old, "v": rng.integers(0, 9, 500), "s": ["z"] * 500}
                ).raise_for_errors()
                self._count("batch")
            except NyalaError as error:
                self._failed("batch", error)
            time.sleep(0.2)

    def _scans(self) -> None:
        while not self.stop.is_set():
            try:
                self.table.scan(["id"], where=[("id", "<", 50_000)]).count()
                self.table.scan(["id", "v"], read_mode="snapshot").count()
                self._count("scan")
            except NyalaError as error:
                self._failed("scan", error)
            self.stop.wait(2.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 minutes")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--writers", type=int, default=6)
    args = parser.parse_args()
    minutes = 3.0 if args.quick else args.minutes

    flags = [*FAST_TSERVER_FLAGS, "--flush-interval-ms", "2000", "--tablet-history-max-age-s", "30"]
    with MiniCluster(3, num_masters=1, master_flags=fast_master_flags(), tserver_flags=flags) as c:
        baseline = c.tservers[0]
        baseline.env["MALLOC_ARENA_MAX"] = str(GLIBC_ARENAS_PER_CORE * (os.cpu_count() or 1))
        baseline.restart()
        with nyala.connect(c.master_addrs, timeout_ms=60_000) as client:
            table = client.create_table(
                "uptime",
                SCHEMA,
                partitioning=nyala.HashPartitioning(["id"], buckets=24),
                replicas=3,
            )
            load = Load(table, args.writers)
            for thread in load.threads:
                thread.start()
            started = time.monotonic()
            samples: list[list[float]] = []
            masters: list[float] = []  # the master's RSS (heartbeats, reports, no data)
            master_pid = c.masters[0].pid
            assert master_pid is not None
            next_sample = started + FIRST_SAMPLE_S
            while time.monotonic() - started < minutes * 60:
                time.sleep(max(0.0, next_sample - time.monotonic()))
                next_sample += SAMPLE_EVERY_S
                samples.append([rss_mib(ts.pid) for ts in c.tservers if ts.pid is not None])
                masters.append(rss_mib(master_pid))
                print(
                    f"[{time.monotonic() - started:5.0f} s] {load.counts} RSS MiB "
                    + " ".join(f"{r:.0f}" for r in samples[-1]),
                    flush=True,
                )
            load.stop.set()
            for thread in load.threads:
                thread.join(timeout=60)

    # The end is each server's median over the last three samples: RSS moves by a few MiB
    # with every flush and compaction.
    first = samples[0]
    last = [statistics.median(column) for column in zip(*samples[-3:], strict=True)]
    growth = [b - a for a, b in zip(first, last, strict=True)]
    capped = statistics.median(growth[1:])
    print(
        json.dumps(
            {
                "minutes": minutes,
                "rss_start_mib": [round(x, 1) for x in first],
                "rss_end_mib": [round(x, 1) for x in last],
                "growth_mib": round(capped, 1),
                "growth_mib_default_heaps": round(growth[0], 1),
                "growth_ratio": round(capped / growth[0], 3) if growth[0] > 0 else None,
                "master_rss_start_mib": round(masters[0], 1),
                "master_rss_end_mib": round(statistics.median(masters[-3:]), 1),
                "single_writes": load.counts["single"],
                "batches": load.counts["batch"],
                "scans": load.counts["scan"],
                "errors": load.counts["errors"],
            }
        )
    )


if __name__ == "__main__":
    main()
