"""Consensus benchmark: committed ops/s of three Raft replicas against the WAL's group commit.

Measured in one run, in one directory (``--dir``, default a temporary directory):

* baseline: the WAL alone, 64 asyncio writers appending 100-byte entries and awaiting
  durability (``benches/wal_bench.py``'s measuring function, imported);
* three ``RaftRuntime`` replicas in this process on one event loop, each over its own real
  WAL (fdatasync on) in the same directory, talking over the in-memory network; 64 concurrent
  proposers of 100-byte ops on the leader for a fixed time: committed ops/s and p50/p99 commit
  latency (propose -> majority durable -> committed).

``ratio`` = committed ops/s / WAL records/s (target >= 0.5: replication plus three logs on one
disk may cost at most half of a lone log's throughput). ``--profile`` prints a cProfile of the
consensus run. The last line printed is one JSON object (DESIGN.md §9).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import importlib
import json
import pstats
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nyala.common.clock import RealClock
from nyala.consensus import (
    MemoryLog,
    RaftConfig,
    RaftPeer,
    Role,
    bootstrap_cmeta,
)
from nyala.consensus.runtime import RaftRuntime
from nyala.consensus.runtime.cmeta_store import FileCmetaStore
from nyala.consensus.runtime.transport import InMemoryNetwork
from nyala.testing.wal import LogOptions

PROPOSERS = 64
RECORD_BYTES = 100
UUIDS = ("a", "b", "c")
LEADER_WAIT_S = 30.0


def wal_baseline(root: Path, seconds: float) -> dict[str, float]:
    """The WAL bench's own 64-writer measurement (asyncio writers when it has them)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    wal_bench = importlib.import_module("wal_bench")
    measure: Callable[..., dict[str, float]] = getattr(wal_bench, "wal_tasks", None) or (
        wal_bench.wal_writers
    )
    return measure(root / "wal-baseline", PROPOSERS, seconds, LogOptions())


def open_log(directory: Path, uuid: str, kind: str) -> Any:
    """The replica's Raft log: WAL-backed (it is also its durability notifier), or in memory
    and durable at once (``--log memory``: the CPU cost of consensus alone)."""
    if kind == "memory":
        return MemoryLog(sync_on_append=True)
    from nyala.consensus.runtime.wal_log import WalLog

    return WalLog(directory / "wal", uuid)


async def consensus_run(root: Path, seconds: float, kind: str) -> dict[str, float]:
    """64 proposers on the leader of three replicas for ``seconds``."""
    network = InMemoryNetwork()
    config = RaftConfig(tuple(RaftPeer(u, f"{u}:7050") for u in UUIDS))
    runtimes: list[RaftRuntime] = []
    logs = []
    for uuid in UUIDS:
        directory = root / f"replica-{uuid}"
        directory.mkdir(parents=True)
        store = FileCmetaStore(directory / "cmeta")
        bootstrap_cmeta(store, config)
        log = open_log(directory, uuid, kind)
        logs.append(log)
        runtimes.append(
            RaftRuntime(
                uuid,
                log,
                store,
                network.transport(uuid),
                RealClock(),
                notifier=None if kind == "memory" else log,
                rng=random.Random(uuid),
            )
        )
    latencies_ns: list[int] = []
    try:
        async with asyncio.TaskGroup() as group:
            for runtime in runtimes:
                runtime.start(group)
            leader = await elect(runtimes[0])
            started = time.perf_counter()
            deadline = started + seconds
            await asyncio.gather(
                *(proposer(leader, deadline, latencies_ns) for _ in range(PROPOSERS))
            )
            elapsed = time.perf_counter() - started
            commit_index = leader.core.commit_index
            for runtime in runtimes:
                runtime.stop()
    finally:
        for log in logs:
            if kind != "memory":
                log.close()
    latencies_ns.sort()
    count = len(latencies_ns)
    return {
        "committed_ops_per_s": count / elapsed,
        "p50_ms": latencies_ns[count // 2] / 1e6,
        "p99_ms": latencies_ns[min(count - 1, count * 99 // 100)] / 1e6,
        "commit_index": commit_index,
        "messages": network.messages_sent,
    }


async def elect(runtime: RaftRuntime) -> RaftRuntime:
    """Makes ``runtime`` campaign (instead of waiting out a timeout) and waits for its win."""
    await asyncio.sleep(0)  # let the runtimes start
    runtime.campaign()
    async with asyncio.timeout(LEADER_WAIT_S):
        while True:
            if runtime.role is Role.LEADER and runtime.core.commit_index > 0:
                break
            await asyncio.sleep(0.01)
    return runtime


async def proposer(leader: RaftRuntime, deadline: float, latencies_ns: list[int]) -> None:
    payload = b"p" * RECORD_BYTES
    while time.perf_counter() < deadline:
        started = time.perf_counter_ns()
        await leader.propose(payload)
        latencies_ns.append(time.perf_counter_ns() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short run (< 2 minutes)")
    parser.add_argument("--dir", type=Path, default=None, help="directory on the disk to test")
    parser.add_argument("--profile", action="store_true", help="cProfile the consensus run")
    parser.add_argument("--log", choices=("wal", "memory"), default="wal", help="replica logs")
    args = parser.parse_args()
    seconds = 5.0 if args.quick else 20.0
    root = Path(tempfile.mkdtemp(prefix="consensus-bench-", dir=args.dir))
    try:
        wal = wal_baseline(root, seconds)
        print(
            f"wal {PROPOSERS} writers: {wal['records_per_s']:.0f} records/s, "
            f"p50 {wal['p50_ms']:.2f} ms, p99 {wal['p99_ms']:.2f} ms"
        )
        profiler = cProfile.Profile() if args.profile else None
        if profiler is not None:
            profiler.enable()
        raft = asyncio.run(consensus_run(root / "raft", seconds, args.log))
        if profiler is not None:
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"raft 3 replicas, {PROPOSERS} proposers: {raft['committed_ops_per_s']:.0f} committed "
        f"ops/s, p50 {raft['p50_ms']:.2f} ms, p99 {raft['p99_ms']:.2f} ms, "
        f"{raft['messages'] / max(1, raft['commit_index']):.2f} messages/op"
    )
    results = {
        "committed_ops_per_s": round(raft["committed_ops_per_s"], 1),
        "wal_records_per_s": round(wal["records_per_s"], 1),
        "ratio": round(raft["committed_ops_per_s"] / wal["records_per_s"], 3),
        "p50_ms": round(raft["p50_ms"], 3),
        "p99_ms": round(raft["p99_ms"], 3),
        "wal_p50_ms": round(wal["p50_ms"], 3),
        "wal_p99_ms": round(wal["p99_ms"], 3),
    }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
