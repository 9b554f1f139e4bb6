"""WAL benchmark: group commit and bandwidth against raw pwrite+fdatasync on the same disk.

Measured in one run, in one directory (``--dir``, default a temporary directory):

* baseline: one writer doing 4 KiB ``pwrite`` + ``fdatasync`` in a loop (syncs/s), and large
  writes followed by one ``fdatasync`` (MB/s);
* the WAL with 1, 8 and 64 concurrent writers appending 100-byte entries and waiting for
  durability (records/s, p50/p99 latency), and a pipelined writer of 1 MiB entries (MB/s).
  Writers are asyncio tasks on one event loop (``append_async``: a future per append, resolved
  from the log's eventfd; tablet servers learn durability from the same eventfd as an index
  and batch their appends, so they wait on the log less often than these writers do); the
  same with OS threads is reported as ``wal_threads_*`` (there the GIL hand-offs of 64
  Python threads, not the log, set the pace on a 2-core machine);
* segment preallocation by ``fallocate`` versus recycling GC'd segments, 64 writers, small
  segments and a GC thread so both reach their steady state;
* pipelined group commit: 64 writers with 1, 2 and 3 group syncs allowed in flight
  (``LogOptions.syncs_in_flight_max``), alternating (``syncs_in_flight_*`` keys), next to
  what the disk gives two syncs at once (``raw_sync_concurrency_2``);
* many logs (``many_logs_*`` keys), as on a tablet server with thousands of replicas:
  ``--many-logs`` (default 2,000) logs open in this process, one asyncio writer each, against a
  baseline of one log with 64 writers in the same run: the process's threads (the logs share
  the core's worker pools; each used to run two threads of its own), the disk they hold once
  each has one entry (an elected replica's NO_OP), and appends/s across all of them.

The headline figures are repeated ``--runs`` times (default 5, also with ``--quick``); each
run measures its own raw baselines right before and right after the 64-writer WAL run and
the WAL's MB/s, so every ratio compares the same minute of a noisy disk. It also counts the
stalls of each (syncs of ``STALL_MS`` or more, per second: ``wal_stalls_per_s_64``,
``raw_stalls_per_s``), which on a virtual machine that the host pauses under load set much
of the 64-writer p99.
The JSON holds the median of the per-run ratios (``group_commit_speedup``,
``bandwidth_ratio``, ``p99_64_in_raw_syncs``) and the per-run values (``*_runs``). The first
``WARM_UP_S`` of each WAL run (the background thread preparing the first segments) is not
measured. docs/wal-format.md ("Group commit latency") explains the figures.

The last line printed is one JSON object (DESIGN.md §9).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

from nyala.consensus.types import EntryKind
from nyala.testing.wal import Entry, Log, LogOptions

RECORD_BYTES = 100
BATCH_BYTES = 1 << 20
# Appends started this soon after the log is opened are not measured: the background thread
# is still preparing the first segments, which no steady-state append competes with.
WARM_UP_S = 0.3
# A sync that took 2**STALL_BUCKET microseconds (4.096 ms, some 25 raw syncs) or more counts
# as a stall: here, the host pausing the machine while its CPU and its disk are busy together
# (docs/wal-format.md, "Group commit latency", session 12). The log's sync histogram counts
# them from this bucket on.
STALL_BUCKET = 12
STALL_MS = (1 << STALL_BUCKET) / 1000


class RawSync(NamedTuple):
    """The raw baseline: 4 KiB pwrite + fdatasync, one writer."""

    per_s: float
    mean_ms: float
    p99_ms: float
    stalls: int


def quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def steal_s() -> float:
    """CPU time the hypervisor has taken from this machine so far (``steal`` in /proc/stat),
    in seconds summed over CPUs; 0 where the kernel does not report it."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def raw_syncs(directory: Path, seconds: float) -> RawSync:
    """4 KiB pwrite + fdatasync appending to a fresh file: syncs/s, mean and p99 per sync."""
    path = directory / "raw-sync"
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    page = b"r" * 4096
    samples: list[float] = []
    started = time.perf_counter()
    try:
        while time.perf_counter() - started < seconds:
            t = time.perf_counter()
            os.pwrite(fd, page, len(samples) * 4096)
            os.fdatasync(fd)
            samples.append((time.perf_counter() - t) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    elapsed = time.perf_counter() - started
    samples.sort()
    stalls = sum(1 for ms in samples if ms >= STALL_MS)
    mean_ms = elapsed / len(samples) * 1000
    return RawSync(len(samples) / elapsed, mean_ms, quantile(samples, 0.99), stalls)


def raw_overwrite_syncs(directory: Path, writers: int, seconds: float) -> float:
    """`writers` threads at once, each overwriting its own written 8 MiB file with 4 KiB
    pwrite + fdatasync (as the WAL's recycled and zero-filled segments are): total syncs/s."""
    counts = [0] * writers

    def writer(slot: int) -> None:
        path = directory / f"raw-overwrite-{slot}"
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        try:
            os.pwrite(fd, bytes(8 << 20), 0)
            os.fsync(fd)
            page = b"o" * 4096
            started = time.perf_counter()
            while time.perf_counter() - started < seconds:
                os.pwrite(fd, page, counts[slot] % 2048 * 4096)
                os.fdatasync(fd)
                counts[slot] += 1
        finally:
            os.close(fd)
            path.unlink()

    threads = [threading.Thread(target=writer, args=(slot,)) for slot in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts) / seconds


def raw_bandwidth(directory: Path, total_bytes: int) -> float:
    """1 MiB pwrites into a fresh file, then one fdatasync: MB/s."""
    path = directory / "raw-bw"
    chunk = os.urandom(BATCH_BYTES)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    started = time.perf_counter()
    try:
        for offset in range(0, total_bytes, BATCH_BYTES):
            os.pwrite(fd, chunk, offset)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - started
    path.unlink()
    return total_bytes / elapsed / 1e6


def wal_writers(
    directory: Path, writers: int, seconds: float, options: LogOptions, gc_every_s: float = 0
) -> dict[str, float]:
    """`writers` threads append one 100-byte entry at a time and wait for durability."""
    shutil.rmtree(directory, ignore_errors=True)
    log = Log(directory, "bench", options)
    lock = threading.Lock()
    state = {"next": 1}
    latencies: list[list[int]] = [[] for _ in range(writers)]
    payload = b"p" * RECORD_BYTES
    stop = threading.Event()

    def writer(slot: list[int]) -> None:
        while not stop.is_set():
            started = time.perf_counter_ns()
            with lock:
                index = state["next"]
                state["next"] = index + 1
                ticket = log.append([Entry(1, index, EntryKind.WRITE, payload)])
            log.wait(ticket.ticket)
            slot.append(time.perf_counter_ns() - started)

    def collector() -> None:
        while not stop.wait(gc_every_s):
            log.gc()

    threads = [threading.Thread(target=writer, args=(slot,)) for slot in latencies]
    if gc_every_s:
        threads.append(threading.Thread(target=collector))
    started = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    counters = log.counters()
    log.close()
    shutil.rmtree(directory, ignore_errors=True)
    all_ns = sorted(ns for slot in latencies for ns in slot)
    return {
        "records_per_s": len(all_ns) / elapsed,
        "p50_ms": all_ns[len(all_ns) // 2] / 1e6,
        "p99_ms": all_ns[min(len(all_ns) - 1, len(all_ns) * 99 // 100)] / 1e6,
        "mean_group": counters.entries_appended / max(1, counters.groups),
        "sync_ms": counters.sync_micros_total / max(1, counters.syncs) / 1000,
        "segments_recycled": counters.segments_recycled,
    }


def wal_tasks(
    directory: Path,
    writers: int,
    seconds: float,
    options: LogOptions,
    gc_every_s: float = 0,
    warm_up_s: float = WARM_UP_S,
) -> dict[str, float]:
    """`writers` asyncio tasks append one 100-byte entry at a time and await durability.
    Appends started in the first `warm_up_s` are not measured."""
    shutil.rmtree(directory, ignore_errors=True)
    log = Log(directory, "bench", options)
    payload = b"p" * RECORD_BYTES
    latencies: list[int] = []
    next_index = 1
    write = int(EntryKind.WRITE)

    async def writer(measure_from: int, deadline: int) -> None:
        # Per append only what any caller does (take the next index, build the entry as the
        # plain tuple the log takes, append, await durability) and one clock read, which
        # both ends the run and starts the latency.
        nonlocal next_index
        clock = time.perf_counter_ns
        append = log.append_async
        while (started := clock()) < deadline:
            # No await between taking the index and appending: the loop keeps them in order.
            index = next_index
            next_index = index + 1
            await append([(1, index, write, payload)])
            if started >= measure_from:
                latencies.append(clock() - started)

    async def main() -> float:
        measure_from = time.perf_counter_ns() + int(warm_up_s * 1e9)
        deadline = measure_from + int(seconds * 1e9)
        await asyncio.gather(*(writer(measure_from, deadline) for _ in range(writers)))
        return seconds

    stop = threading.Event()

    def collector() -> None:
        while not stop.wait(gc_every_s):
            log.gc()

    gc_thread = threading.Thread(target=collector)
    if gc_every_s:
        gc_thread.start()
    elapsed = asyncio.run(main())
    stop.set()
    if gc_every_s:
        gc_thread.join()
    counters = log.counters()
    log.close()
    shutil.rmtree(directory, ignore_errors=True)
    latencies.sort()
    return {
        "records_per_s": len(latencies) / elapsed,
        "p50_ms": latencies[len(latencies) // 2] / 1e6,
        "p99_ms": latencies[min(len(latencies) - 1, len(latencies) * 99 // 100)] / 1e6,
        "mean_group": counters.entries_appended / max(1, counters.groups),
        "sync_ms": counters.sync_micros_total / max(1, counters.syncs) / 1000,
        "stalls": sum(counters.sync_micros_histogram[STALL_BUCKET:]),
    }


def wal_bandwidth(directory: Path, total_bytes: int, options: LogOptions) -> float:
    """One writer appends 1 MiB entries without waiting for each (pipelined), then waits."""
    shutil.rmtree(directory, ignore_errors=True)
    log = Log(directory, "bench", options)
    payload = os.urandom(BATCH_BYTES)
    started = time.perf_counter()
    ticket = None
    for index in range(1, total_bytes // BATCH_BYTES + 1):
        ticket = log.append([Entry(1, index, EntryKind.WRITE, payload)])
    assert ticket is not None
    log.wait(ticket.ticket)
    elapsed = time.perf_counter() - started
    log.close()
    shutil.rmtree(directory, ignore_errors=True)
    return total_bytes / elapsed / 1e6


def native_group_commit(root: Path, runs: int, seconds: float) -> dict[str, float] | None:
    """The 64-writer group commit on the Rust API alone (64 OS threads, no GIL, no event loop),
    by ``rust/wal/examples/group_commit_latency.rs`` with its own raw baseline on the same
    directory: what the log itself does, next to what 64 asyncio tasks see through the binding.
    None (and a note) where cargo or the source tree is not at hand, e.g. a pip-installed nyala.
    """
    repo = Path(__file__).resolve().parent.parent
    cargo = shutil.which("cargo")
    if cargo is None or not (repo / "rust/wal/examples/group_commit_latency.rs").exists():
        print("native harness skipped: needs cargo and the source tree")
        return None
    env = dict(os.environ)
    env.setdefault("CARGO_TARGET_DIR", str(Path.home() / ".cache/nyala/target"))
    command = [cargo, "run", "--release", "--quiet", "-p", "nyala-wal"]
    command += ["--example", "group_commit_latency", "--", "--dir", str(root)]
    command += ["--writers", "64", "--runs", str(runs), "--seconds", str(seconds)]
    done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        print(f"native harness failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")
        return None
    for line in lines[:-1]:
        print(f"native {line}")
    figures: dict[str, float] = json.loads(lines[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short run (< 2 minutes)")
    parser.add_argument("--dir", type=Path, default=None, help="directory on the disk to test")
    parser.add_argument(
        "--runs", type=int, default=5, help="repetitions of the headline figures (median)"
    )
    parser.add_argument(
        "--many-logs", type=int, default=2000, help="logs of the many_logs figure (0: skip it)"
    )
    args = parser.parse_args()
    seconds = 2.5 if args.quick else 10.0
    total_bytes = (128 if args.quick else 512) * BATCH_BYTES
    root = Path(tempfile.mkdtemp(prefix="wal-bench-", dir=args.dir))
    try:
        results = run(root, seconds, total_bytes, max(1, args.runs))
        if args.many_logs > 0:
            results.update(many_logs(root, args.many_logs, seconds))
        native = native_group_commit(root, max(1, args.runs), seconds)
        if native is not None:
            results["native_group_commit_speedup"] = native["group_commit_speedup"]
            results["native_p99_64_in_raw_syncs"] = native["p99_in_raw_syncs"]
            results["native_p99_64_in_raw_p99_syncs"] = native["p99_in_raw_p99_syncs"]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(results))


def headline_run(root: Path, seconds: float, total_bytes: int) -> dict[str, float]:
    """One repetition of the headline figures, each ratio against a baseline measured
    next to it: raw syncs before and after the 64-writer run, raw MB/s before and after the
    WAL's."""
    default = LogOptions()
    before = raw_syncs(root, seconds * 0.3)
    stolen = steal_s()
    r = wal_tasks(root / "w64", 64, seconds, default)
    stolen = steal_s() - stolen
    after = raw_syncs(root, seconds * 0.3)
    raw_ms = (before.mean_ms + after.mean_ms) / 2
    raw_p99_ms = (before.p99_ms + after.p99_ms) / 2
    # Raw MB/s before and after the WAL's, averaged like the raw syncs: whichever of two
    # back-to-back bulk runs comes second pays for the first's writeback and the discards of
    # its deleted file (this disk is mounted with `discard`), which alone moved the ratio
    # between 0.73 and 1.42 (docs/wal-format.md, session 10).
    raw_mb_before = raw_bandwidth(root, total_bytes)
    wal_mb = wal_bandwidth(root / "bw", total_bytes, default)
    raw_mb = (raw_mb_before + raw_bandwidth(root, total_bytes)) / 2
    return {
        "raw_sync_ms": raw_ms,
        "raw_sync_p99_ms": raw_p99_ms,
        "raw_syncs_per_s": 1000 / raw_ms,
        "raw_mb_per_s": raw_mb,
        "wal_records_per_s_64": r["records_per_s"],
        "wal_p50_ms_64": r["p50_ms"],
        "wal_p99_ms_64": r["p99_ms"],
        "wal_mean_group_64": r["mean_group"],
        "wal_sync_ms_64": r["sync_ms"],
        # Milliseconds of CPU per second the hypervisor took during the 64-writer run
        # (docs/wal-format.md, "Group commit latency", session 10): the higher, the higher p99.
        "steal_ms_per_s_64": stolen * 1000 / (seconds + WARM_UP_S),
        # Syncs of STALL_MS or more per second, the WAL's in the 64-writer run and the raw
        # loop's around it: each WAL stall holds up all 64 writers at once.
        "wal_stalls_per_s_64": r["stalls"] / (seconds + WARM_UP_S),
        "raw_stalls_per_s": (before.stalls + after.stalls) / (2 * seconds * 0.3),
        "wal_mb_per_s": wal_mb,
        "group_commit_speedup": r["records_per_s"] * raw_ms / 1000,
        "bandwidth_ratio": wal_mb / raw_mb,
        "p99_64_in_raw_syncs": r["p99_ms"] / raw_ms,
        "p99_64_in_raw_p99_syncs": r["p99_ms"] / raw_p99_ms,
    }


def run(root: Path, seconds: float, total_bytes: int, runs: int) -> dict[str, object]:
    results: dict[str, object] = {"runs": runs}
    per_run: list[dict[str, float]] = []
    for number in range(1, runs + 1):
        h = headline_run(root, seconds, total_bytes)
        per_run.append(h)
        print(
            f"run {number}: raw {h['raw_sync_ms']:.2f} ms/sync (p99 {h['raw_sync_p99_ms']:.2f}),"
            f" {h['raw_mb_per_s']:.0f} MB/s; wal 64 asyncio writers:"
            f" {h['wal_records_per_s_64']:.0f} records/s, p50 {h['wal_p50_ms_64']:.2f} ms,"
            f" p99 {h['wal_p99_ms_64']:.2f} ms = {h['p99_64_in_raw_syncs']:.2f} raw syncs,"
            f" {h['wal_mean_group_64']:.1f} entries/group, {h['wal_sync_ms_64']:.2f} ms/sync,"
            f" steal {h['steal_ms_per_s_64']:.0f} ms/s,"
            f" stalls {h['wal_stalls_per_s_64']:.1f}/s (raw {h['raw_stalls_per_s']:.1f}/s);"
            f" wal 1 MiB batches {h['wal_mb_per_s']:.0f} MB/s"
        )
    for key in per_run[0]:
        values = [h[key] for h in per_run]
        results[key] = round(statistics.median(values), 3)
        if key in ("group_commit_speedup", "bandwidth_ratio", "p99_64_in_raw_syncs"):
            results[f"{key}_runs"] = [round(v, 3) for v in values]
    print(
        f"median of {runs} runs: group_commit_speedup {results['group_commit_speedup']},"
        f" bandwidth_ratio {results['bandwidth_ratio']},"
        f" p99_64_in_raw_syncs {results['p99_64_in_raw_syncs']}"
        f" (p99 in raw p99 syncs {results['p99_64_in_raw_p99_syncs']})"
    )
    default = LogOptions()
    for writers in (1, 8):
        r = wal_tasks(root / f"w{writers}", writers, seconds, default)
        print(
            f"wal {writers:>2} asyncio writers: {r['records_per_s']:.0f} records/s, "
            f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
            f"{r['mean_group']:.1f} entries/group, {r['sync_ms']:.2f} ms/sync"
        )
        results[f"wal_records_per_s_{writers}"] = round(r["records_per_s"], 1)
        results[f"wal_p50_ms_{writers}"] = round(r["p50_ms"], 3)
        results[f"wal_p99_ms_{writers}"] = round(r["p99_ms"], 3)
        results[f"wal_mean_group_{writers}"] = round(r["mean_group"], 1)
    threads = wal_writers(root / "threads", 64, seconds, default)
    print(
        f"wal 64 thread writers: {threads['records_per_s']:.0f} records/s, "
        f"p99 {threads['p99_ms']:.2f} ms, {threads['mean_group']:.1f} entries/group"
    )
    results["wal_threads_records_per_s_64"] = round(threads["records_per_s"], 1)
    results["wal_threads_p99_ms_64"] = round(threads["p99_ms"], 3)
    results.update(preallocation_comparison(root, seconds))
    results.update(in_flight_comparison(root, seconds))
    return results


def process_threads() -> int:
    """Threads of this process now."""
    return len(os.listdir("/proc/self/task"))


def disk_bytes(directory: Path) -> int:
    """Bytes of disk the files under ``directory`` occupy (allocated blocks, not lengths)."""
    return sum(
        os.stat(Path(parent) / name).st_blocks * 512
        for parent, _, names in os.walk(directory)
        for name in names
    )


def many_logs(root: Path, count: int, seconds: float) -> dict[str, object]:
    """``count`` logs in one process, one asyncio writer each appending 100-byte entries and
    awaiting durability, next to one log with 64 writers measured in the same run (see the
    module docstring). Threads are counted at their most while every log writes."""
    baseline = wal_tasks(root / "one-log", 64, seconds / 2, LogOptions())
    directory = root / "many-logs"
    shutil.rmtree(directory, ignore_errors=True)
    threads_before = process_threads()
    started = time.perf_counter()
    logs = [Log(directory / f"t{i}", f"t{i}", LogOptions()) for i in range(count)]
    open_s = time.perf_counter() - started
    threads_open = process_threads()
    payload = b"p" * RECORD_BYTES
    idle_disk, threads_max, appended, elapsed = asyncio.run(
        many_logs_writers(logs, directory, seconds / 2, payload)
    )
    for log in logs:
        log.close()
    shutil.rmtree(directory, ignore_errors=True)
    per_s = appended / elapsed
    print(
        f"many logs: {count} logs opened in {open_s:.1f} s; threads {threads_before} before,"
        f" {threads_open} once open, at most {threads_max} while all write; idle disk"
        f" {idle_disk / count / 1024:.0f} KiB per log; {per_s:.0f} records/s across them"
        f" (one writer each) against {baseline['records_per_s']:.0f} records/s of one log with"
        " 64 writers"
    )
    return {
        "many_logs": count,
        "many_logs_open_s": round(open_s, 2),
        "many_logs_threads_before": threads_before,
        "many_logs_threads_open": threads_open,
        "many_logs_threads_max": threads_max,
        "many_logs_idle_disk_bytes_per_log": idle_disk // count,
        "many_logs_records_per_s": round(per_s, 1),
        "one_log_records_per_s_64": round(baseline["records_per_s"], 1),
        "many_logs_vs_one_log": round(per_s / baseline["records_per_s"], 3),
    }


async def many_logs_writers(
    logs: list[Log], directory: Path, seconds: float, payload: bytes
) -> tuple[int, int, int, float]:
    """Gives every log one durable entry (an elected replica's NO_OP) and measures the disk
    they hold; then every log's writer appends one entry at a time and awaits it, for
    ``seconds``. Returns that disk in bytes, the most threads seen, the appends and the time
    they took."""
    write = int(EntryKind.WRITE)
    await asyncio.gather(*(log.append_async([(1, 1, write, payload)]) for log in logs))
    idle_disk = disk_bytes(directory)
    appended = 0
    threads_max = process_threads()
    deadline = time.perf_counter() + seconds

    async def writer(log: Log) -> None:
        nonlocal appended
        index = 2
        while time.perf_counter() < deadline:
            await log.append_async([(1, index, write, payload)])
            appended += 1
            index += 1

    async def sample() -> None:
        nonlocal threads_max
        while time.perf_counter() < deadline:
            threads_max = max(threads_max, process_threads())
            await asyncio.sleep(0.05)

    started = time.perf_counter()
    await asyncio.gather(sample(), *(writer(log) for log in logs))
    return idle_disk, threads_max, appended, time.perf_counter() - started


def in_flight_comparison(root: Path, seconds: float) -> dict[str, object]:
    """64 asyncio writers with 1, 2 and 3 group syncs in flight, in alternating rounds so drift
    in the machine's load hits all alike. Each round measures raw syncs once, before its three
    runs; ``syncs_in_flight_N_vs_1`` is the median over rounds of records/s with N in flight
    divided by records/s with 1 in the same round. ``raw_sync_concurrency_2`` is what the disk
    offers them: the syncs/s of two raw overwrite loops at once over those of one."""
    modes = (1, 2, 3)
    rates: dict[int, list[float]] = {m: [] for m in modes}
    speedups: dict[int, list[float]] = {m: [] for m in modes}
    p99s: dict[int, list[float]] = {m: [] for m in modes}
    groups: dict[int, list[float]] = {m: [] for m in modes}
    concurrency: list[float] = []
    for round_number in range(2):
        # One loop then two in the first round, two then one in the second: whichever comes
        # second on this disk pays for the first one's writeback.
        order = (1, 2) if round_number % 2 == 0 else (2, 1)
        per_s = {loops: raw_overwrite_syncs(root, loops, seconds * 0.2) for loops in order}
        concurrency.append(per_s[2] / per_s[1])
        raw = raw_syncs(root, seconds * 0.3)
        for mode in modes:
            r = wal_tasks(root / "inflight", 64, seconds / 2, LogOptions(syncs_in_flight_max=mode))
            rates[mode].append(r["records_per_s"])
            speedups[mode].append(r["records_per_s"] * raw.mean_ms / 1000)
            p99s[mode].append(r["p99_ms"] / raw.mean_ms)
            groups[mode].append(r["mean_group"])
    out: dict[str, object] = {"raw_sync_concurrency_2": round(statistics.median(concurrency), 2)}
    print(
        f"raw overwrite syncs, two loops at once: {out['raw_sync_concurrency_2']} x the syncs/s"
        " of one (what pipelined group syncs can gain on this disk)"
    )
    for mode in modes:
        versus_1 = statistics.median(a / b for a, b in zip(rates[mode], rates[1], strict=True))
        speedup = statistics.median(speedups[mode])
        p99 = statistics.median(p99s[mode])
        group = statistics.median(groups[mode])
        print(
            f"syncs_in_flight_max={mode}: {statistics.median(rates[mode]):.0f} records/s"
            f" ({versus_1:.2f} x with 1), group_commit_speedup {speedup:.1f},"
            f" p99 {p99:.2f} raw syncs, {group:.1f} entries/group (64 asyncio writers)"
        )
        out[f"syncs_in_flight_{mode}_vs_1"] = round(versus_1, 3)
        out[f"syncs_in_flight_{mode}_speedup"] = round(speedup, 2)
        out[f"syncs_in_flight_{mode}_p99_in_raw_syncs"] = round(p99, 2)
        out[f"syncs_in_flight_{mode}_mean_group"] = round(group, 1)
    return out


def preallocation_comparison(root: Path, seconds: float) -> dict[str, object]:
    """64 writers with 1 MiB segments and GC every 50 ms: fallocate'd vs recycled segments,
    alternating twice so drift in the machine's load hits both alike."""
    rates: dict[str, list[float]] = {"fallocate": [], "recycle": []}
    p99s: dict[str, list[float]] = {"fallocate": [], "recycle": []}
    for _ in range(2):
        for mode in ("fallocate", "recycle"):
            options = LogOptions(
                segment_size_bytes=1 << 20,
                preallocation=mode,
                min_segments_to_retain=1,
            )
            r = wal_tasks(root / mode, 64, seconds / 2, options, gc_every_s=0.05)
            rates[mode].append(r["records_per_s"])
            p99s[mode].append(r["p99_ms"])
    out: dict[str, object] = {}
    for mode in rates:
        rate = statistics.median(rates[mode])
        p99 = statistics.median(p99s[mode])
        print(f"preallocation={mode}: {rate:.0f} records/s, p99 {p99:.2f} ms (1 MiB segments)")
        out[f"{mode}_records_per_s_64"] = round(rate, 1)
        out[f"{mode}_p99_ms_64"] = round(p99, 3)
    out["recycle_speedup"] = round(
        statistics.median(rates["recycle"]) / statistics.median(rates["fallocate"]), 3
    )
    return out


if __name__ == "__main__":
    main()
