"""Tablet copy benchmark: two real tserver processes on loopback, one single-replica tablet.

The source tablet is loaded with incompressible rows (a binary column of random bytes) until its
rowset files hold ``--size-mib`` MiB, flushed, and its WAL garbage-collected down to the
unflushed tail. Then, ``--runs`` times: the target copies it (StartTabletCopy; MB/s = bytes
copied / the job's elapsed time, session setup included), and the target's replica is
tombstoned again. Baseline, in the same run: a raw copy of the same files (read, write, fsync
each file, like the copy does): the files the copy produced, into a scratch directory.

Sizes: the full run copies 1 GiB (issue 8). ``--quick`` copies 256 MiB: loading 1 GiB through
Raft and fsync takes minutes on the shared two-core machine, over the two-minute budget of
``--quick``; the ratio is what is compared and it does not depend on the size once chunks
stream (each file is many 4 MiB chunks either way).

Then once more under load (issue 31): writer threads insert rows into the source tablet all
through one more copy (its active WAL segment then grows while it is fetched chunk by chunk),
and the figure is the writers' rows/s during the copy, the copy's MB/s, and
``under_load_first_try``: whether that copy succeeded on its first attempt (before issue 31 a
live segment read piece by piece gave a log that did not open, and the copy failed).

The last line printed is one JSON object: ``copy_mb_per_s``, ``raw_copy_mb_per_s``, ``ratio``
(medians over the runs), ``bytes``, and ``under_load_rows_per_s``, ``under_load_copy_mb_per_s``,
``under_load_first_try``, and ``data_channel`` (false with ``--no-data-channel``: the copy then
goes over FetchData RPCs, the path of servers with TLS). Target: ``ratio >= 0.6``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from nyala._proto import common_pb2, metadata_pb2, tablet_copy_pb2, tserver_admin_pb2
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster
from nyala.testing.mini_cluster import LOOPBACK, ServerProcess
from nyala.testing.tablet_ops import write_to_leader

SCHEMA = Schema([Column("id", "int64"), Column("blob", "binary")], ["id"])
TABLET = "cb" * 16
ROW_BYTES = 64 << 10
ROWS_PER_WRITE = 64  # 4 MiB per write
UNDER_LOAD_WRITERS = 2
UNDER_LOAD_BATCH_ROWS = 2000
UNDER_LOAD_ROW_BYTES = 64
FLAGS = (
    "--flush-interval-ms",
    "500",
    "--wal-gc-interval-ms",
    "500",
    "--wal-min-segments-to-retain",
    "0",
    "--wal-segment-bytes",
    str(32 << 20),
)


def _files(ts: ServerProcess) -> list[Path]:
    roots = [ts.fs_root / "data" / TABLET, ts.fs_root / "wals" / TABLET]
    return sorted(
        p
        for root in roots
        for p in root.iterdir()
        if p.is_file() and not p.name.startswith("wal-recycle") and not p.name.endswith(".tmp")
    )


def _copied_files(target: ServerProcess, copied_bytes: int) -> list[Path]:
    """The target's files the copy wrote: rowsets, manifest, then WAL segments in order, up to
    the bytes copied (the target's own new WAL segment, opened after the copy, comes last)."""
    out, total = [], 0
    for path in _files(target):
        if total >= copied_bytes:
            break
        out.append(path)
        total += path.stat().st_size
    return out


def _rowset_bytes(ts: ServerProcess) -> int:
    return sum(p.stat().st_size for p in (ts.fs_root / "data" / TABLET).iterdir() if p.is_file())


def _load(cluster: MiniCluster, source: ServerProcess, size_bytes: int) -> None:
    next_id = 0
    seq = 0
    while _rowset_bytes(source) < size_bytes:
        ids = list(range(next_id, next_id + ROWS_PER_WRITE))
        data = {"id": ids, "blob": [os.urandom(ROW_BYTES) for _ in ids]}
        write_to_leader(cluster, TABLET, SCHEMA, data, op="insert", client_id="bench", seq_no=seq)
        next_id += ROWS_PER_WRITE
        seq += 1
        if seq % 16 == 0:
            time.sleep(0.6)  # let the periodic flush catch up
    time.sleep(1.5)  # the last flush and WAL GC


def _call(ts: ServerProcess, method: str, request: Any, timeout_ms: int = 30_000) -> Any:
    with ts.proxy() as proxy:
        return proxy.call(getattr(proxy.tablet_copy, method), request, timeout_ms=timeout_ms)


def _copy_once(source: ServerProcess, target: ServerProcess, term: int) -> tuple[int, float]:
    request = tablet_copy_pb2.StartTabletCopyRequestPB(
        dest_uuid=target.uuid,
        tablet_id=TABLET,
        copy_peer_uuid=source.uuid,
        copy_peer_addr=common_pb2.HostPortPB(host=LOOPBACK, port=source.rpc_port),
        caller_term=term,
    )
    job_id = _call(target, "StartTabletCopy", request).job_id
    while True:
        jobs = _call(target, "ListTabletCopies", tablet_copy_pb2.ListTabletCopiesRequestPB()).jobs
        job = next(j for j in jobs if j.job_id == job_id)
        if job.state == "SUCCEEDED":
            return job.bytes_done, job.elapsed_s
        if job.state != "RUNNING":
            raise RuntimeError(f"copy {job_id} ended {job.state}: {job.error}")
        time.sleep(0.02)


class _Writers:
    """Threads inserting small rows into the source tablet until stopped; counts the rows."""

    def __init__(self, cluster: MiniCluster, threads: int, first_id: int) -> None:
        self._cluster = cluster
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.rows = 0
        self._threads = [
            threading.Thread(target=self._run, args=(first_id + n * 10**9, n), daemon=True)
            for n in range(threads)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _run(self, next_id: int, n: int) -> None:
        seq = 0
        blob = os.urandom(UNDER_LOAD_ROW_BYTES)
        while not self._stop.is_set():
            ids = list(range(next_id, next_id + UNDER_LOAD_BATCH_ROWS))
            data = {"id": ids, "blob": [blob] * len(ids)}
            write_to_leader(
                self._cluster, TABLET, SCHEMA, data, op="insert", client_id=f"w{n}", seq_no=seq
            )
            next_id += len(ids)
            seq += 1
            with self._lock:
                self.rows += len(ids)


def _copy_under_load(
    cluster: MiniCluster, source: ServerProcess, target: ServerProcess, term: int
) -> tuple[float, float, bool]:
    """(writers' rows/s during the copy, copy MB/s, whether the first attempt succeeded)."""
    writers = _Writers(cluster, UNDER_LOAD_WRITERS, 10**12)
    writers.start()
    try:
        time.sleep(1.0)  # the writers are under way, the active segment growing
        rows_before, started = writers.rows, time.perf_counter()
        try:
            copied, elapsed = _copy_once(source, target, term)
            first_try = True
        except RuntimeError as exc:
            print(f"under load: {exc}", flush=True)
            return (writers.rows - rows_before) / (time.perf_counter() - started), 0.0, False
        rows = writers.rows - rows_before
        wall = time.perf_counter() - started
    finally:
        writers.stop()
    return rows / wall, copied / elapsed / 1e6, first_try


def _tombstone(target: ServerProcess) -> None:
    request = tserver_admin_pb2.DeleteTabletRequestPB(
        dest_uuid=target.uuid,
        tablet_id=TABLET,
        delete_type=metadata_pb2.TABLET_DATA_TOMBSTONED,
    )
    with target.proxy() as proxy:
        proxy.admin_call(proxy.admin.DeleteTablet, request)


def _raw_copy(files: list[Path], scratch: Path) -> tuple[int, float]:
    """Copies ``files`` into ``scratch`` (fsyncing each); the bytes copied and the seconds.
    A WAL segment the target's replica garbage-collected since it was listed is skipped: the
    figure is a rate, over the bytes that were copied."""
    total = 0
    started = time.perf_counter()
    for path in files:
        dest = scratch / f"{path.parent.name}-{path.name}"
        try:
            shutil.copyfile(path, dest)
        except FileNotFoundError:
            continue
        fd = os.open(dest, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        total += dest.stat().st_size
    elapsed = time.perf_counter() - started
    for dest in scratch.iterdir():
        dest.unlink()
    return total, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="256 MiB instead of 1 GiB")
    parser.add_argument("--size-mib", type=int, default=None)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--no-data-channel",
        action="store_true",
        help="copy over FetchData RPCs, as servers with TLS do (docs/tablet-copy.md)",
    )
    args = parser.parse_args()
    size_mib = args.size_mib or (256 if args.quick else 1024)

    flags = (*FLAGS, "--no-tablet-copy-data-channel") if args.no_data_channel else FLAGS
    with MiniCluster(2, tserver_flags=flags) as cluster:
        source, target = cluster.tservers
        cluster.create_tablet(TABLET, SCHEMA, servers=[source])
        cluster.leader_of(TABLET)
        t0 = time.perf_counter()
        _load(cluster, source, size_mib << 20)
        print(
            f"loaded {_rowset_bytes(source) >> 20} MiB of rowsets in "
            f"{time.perf_counter() - t0:.1f} s",
            flush=True,
        )
        term = 1_000_000  # any term at or above the source's is accepted
        copy_rates, raw_rates = [], []
        copied = 0
        with tempfile.TemporaryDirectory(prefix="nyala-raw-copy-") as scratch:
            for run in range(args.runs):
                copied, elapsed = _copy_once(source, target, term)
                copy_rates.append(copied / elapsed / 1e6)
                # The baseline copies exactly the files the copy produced.
                raw_bytes, raw_elapsed = _raw_copy(_copied_files(target, copied), Path(scratch))
                _tombstone(target)
                raw_rates.append(raw_bytes / raw_elapsed / 1e6)
                print(
                    f"run {run}: copy {copied >> 20} MiB at {copy_rates[-1]:.0f} MB/s, "
                    f"raw {raw_bytes >> 20} MiB at {raw_rates[-1]:.0f} MB/s",
                    flush=True,
                )
        load_rows_s, load_mb_s, first_try = _copy_under_load(cluster, source, target, term)
        print(
            f"under load: writers {load_rows_s:.0f} rows/s during the copy, copy "
            f"{load_mb_s:.0f} MB/s, first try {'succeeded' if first_try else 'FAILED'}",
            flush=True,
        )
    copy_mb_s = statistics.median(copy_rates)
    raw_mb_s = statistics.median(raw_rates)
    print(
        json.dumps(
            {
                "bench": "tablet_copy",
                "size_mib": size_mib,
                "bytes": copied,
                "copy_mb_per_s": round(copy_mb_s, 1),
                "raw_copy_mb_per_s": round(raw_mb_s, 1),
                "ratio": round(copy_mb_s / raw_mb_s, 3),
                "runs": args.runs,
                "data_channel": not args.no_data_channel,
                "target_ratio": 0.6,
                "under_load_rows_per_s": round(load_rows_s),
                "under_load_copy_mb_per_s": round(load_mb_s, 1),
                "under_load_first_try": first_try,
            }
        )
    )


if __name__ == "__main__":
    main()
