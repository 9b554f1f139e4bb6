"""Micro-benchmark of the replicated log (``nyala.consensus.runtime.wal_log``) on a real WAL.

Figures, each the median of several runs in this process:

* follower: received batches of 100 entries x 100 bytes, each decoded from wire bytes and
  appended with one ``append_replicated`` call (fdatasync on, durable at the end), in
  entries/s;
* baseline: the same entries appended to the bare WAL binding (``nyala._native.Log``) as one
  Python tuple per entry, the path a follower without native batches would take;
* leader: single-entry ``append`` calls (what a proposal costs) and ``read_batch`` of 1 MiB
  batches from the log cache.

The last line is one JSON object: ``follower_entries_per_s``, ``baseline_entries_per_s``,
``ratio`` (follower / baseline), ``leader_appends_per_s``, ``read_batch_mb_per_s``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from nyala import _native
from nyala.consensus.runtime.wal_log import WalEntryBatch, WalLog, WalLogOptions
from nyala.consensus.types import MIN_OP_ID, EntryKind, OpId

TABLET_ID = "0" * 32
ENTRIES_PER_BATCH = 100
PAYLOAD_BYTES = 100


def make_wire_batches(root: Path, batches: int) -> list[bytes]:
    """Wire encodings of ``batches`` consecutive batches, built by a leader log."""
    with WalLog(root / "source", TABLET_ID, WalLogOptions(sync="none")) as leader:
        payload = b"r" * PAYLOAD_BYTES
        for _ in range(batches * ENTRIES_PER_BATCH):
            leader.append(1, EntryKind.WRITE, payload)
        out = []
        after = 0
        bytes_max = 24 + ENTRIES_PER_BATCH * (24 + PAYLOAD_BYTES)
        while (batch := leader.read_batch(after, bytes_max)) is not None:
            out.append(batch.to_wire())
            after = batch.last_op_id.index
    assert len(out) == batches
    return out


def follower_run(directory: Path, wire: list[bytes]) -> float:
    with WalLog(directory, TABLET_ID) as follower:
        start = time.perf_counter()
        preceding = MIN_OP_ID
        for data in wire:
            batch = WalEntryBatch.from_wire(data)
            result = follower.append_replicated(preceding, batch, 0)
            assert result.matched
            preceding = batch.last_op_id
        assert follower.wait_durable(timeout_s=60)
        elapsed = time.perf_counter() - start
    return len(wire) * ENTRIES_PER_BATCH / elapsed


def baseline_run(directory: Path, batches: int) -> float:
    log = _native.Log(str(directory), TABLET_ID)
    try:
        payload = b"r" * PAYLOAD_BYTES
        start = time.perf_counter()
        index = 1
        last_ticket = 0
        for _ in range(batches):
            entries = [(1, index + i, 1, payload) for i in range(ENTRIES_PER_BATCH)]
            last_ticket, _ = log.append(entries)
            index += ENTRIES_PER_BATCH
        assert log.wait(last_ticket, 60)
        elapsed = time.perf_counter() - start
    finally:
        log.close()
    return batches * ENTRIES_PER_BATCH / elapsed


def leader_run(directory: Path, appends: int) -> tuple[float, float]:
    with WalLog(directory, TABLET_ID) as leader:
        payload = b"p" * PAYLOAD_BYTES
        start = time.perf_counter()
        for _ in range(appends):
            leader.append(1, EntryKind.WRITE, payload)
        appends_per_s = appends / (time.perf_counter() - start)
        assert leader.wait_durable(timeout_s=60)
        start = time.perf_counter()
        total_bytes = 0
        after = 0
        while (batch := leader.read_batch(after, 1 << 20)) is not None:
            total_bytes += batch.size_bytes
            after = batch.last_op_id.index
        read_mb_per_s = total_bytes / (time.perf_counter() - start) / 1e6
        assert leader.last_op_id() == OpId(1, appends)
    return appends_per_s, read_mb_per_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small run (< 1 minute)")
    args = parser.parse_args()
    batches = 1000 if args.quick else 5000
    runs = 5 if args.quick else 7
    with tempfile.TemporaryDirectory(prefix="wal-log-bench-") as tmp:
        root = Path(tmp)
        wire = make_wire_batches(root, batches)
        follower, baseline, leader, reads = [], [], [], []
        for run in range(runs):
            # Alternate so drift in the machine's load hits both alike.
            follower.append(follower_run(root / f"follower-{run}", wire))
            baseline.append(baseline_run(root / f"baseline-{run}", batches))
            appends, read_mb = leader_run(root / f"leader-{run}", batches * ENTRIES_PER_BATCH)
            leader.append(appends)
            reads.append(read_mb)
    results = {
        "follower_entries_per_s": round(statistics.median(follower)),
        "baseline_entries_per_s": round(statistics.median(baseline)),
        "ratio": round(statistics.median(follower) / statistics.median(baseline), 2),
        "leader_appends_per_s": round(statistics.median(leader)),
        "read_batch_mb_per_s": round(statistics.median(reads), 1),
        "entries_per_batch": ENTRIES_PER_BATCH,
        "payload_bytes": PAYLOAD_BYTES,
    }
    print(
        f"follower append_replicated: {results['follower_entries_per_s']} entries/s "
        f"(baseline per-entry tuples into the WAL: {results['baseline_entries_per_s']})"
    )
    print(f"leader append: {results['leader_appends_per_s']} appends/s")
    print(f"read_batch from the cache: {results['read_batch_mb_per_s']} MB/s")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
