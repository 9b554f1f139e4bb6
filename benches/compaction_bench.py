"""Background compaction over a tablet's life: bytes rewritten, time, space and scan cost.

Two storage engines are fed the same writes, flush by flush, alternately (so the machine's
noise falls on both): 320 flushes (96 with ``--quick``) of 5,000 rows each, four fifths fresh
keys in ascending order (an ingest) and one fifth updates of keys written before,
each batch at a later timestamp. After each flush:

* the policy (``StorageEngine.compact_some(mark, 8)``, the tablet server's background
  compaction: a run of rowsets picked by size; docs/storage-format.md, "Which rowsets");
* the baseline, the policy before it: every rowset merged once there are 8
  (``StorageEngine.compact(mark)``).

Both collect history at the timestamp of the flush 8 flushes back (older versions are past the
history retention). Reported per engine: the bytes compactions wrote over the bytes flushes
wrote (``*_write_amp``), the seconds compactions took, the rowsets and data bytes at the end,
and the mean rate of a full scan of 2 columns taken every 4 flushes and at the end (how many
rowsets a scan merges changes from flush to flush).

* ``write_amp_ratio`` = baseline / policy bytes written (target >= 3 at 320 flushes; it grows
  with the flushes);
* ``space_ratio`` = policy / baseline data bytes at the end (target <= 2: superseded rows stay
  in the rowsets left alone);
* ``scan_ratio`` = policy / baseline scan rows/s (target >= 0.5: both leave up to 7 rowsets,
  the baseline fewer on average).

Usage: ``python benches/compaction_bench.py [--quick]``; the last line printed is one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from nyala.rowops import OpType, make_op_batch
from nyala.schema import Schema
from nyala.storage import StorageEngine

SCHEMA = Schema.parse("id:int64, a:int64, b:double, s:string", key=["id"])
MIN_ROWSETS = 8  # the tablet servers' compaction_rowsets_min default
RETENTION_FLUSHES = 8
SCAN_EVERY = 4  # flushes between the scans whose rates are averaged


def batch(rng: np.random.Generator, fresh: np.ndarray[Any, Any], old: np.ndarray[Any, Any]) -> Any:
    ids = np.concatenate([fresh, old]).astype(np.int64)
    ids.sort()
    n = len(ids)
    data = {
        "id": ids,
        "a": rng.integers(0, 1 << 40, n, dtype=np.int64),
        "b": rng.random(n),
        "s": pa.array([f"row-{i:012d}-payload" for i in ids]),
    }
    return make_op_batch(data, OpType.UPSERT, SCHEMA)


class Side:
    """One engine and what its compactions cost."""

    def __init__(self, root: Path, name: str, policy: bool) -> None:
        self.engine = StorageEngine.create(root / name, SCHEMA, background_flush=False)
        self.policy = policy
        self.flushed_bytes = 0
        self.op_index = 0
        self.scan_rates: list[float] = []

    def write(self, ops: Any, timestamp: int) -> None:
        self.op_index += 1
        self.engine.apply(ops, self.op_index, timestamp)
        before = self.engine.stats()["data_bytes"]
        self.engine.flush()
        self.flushed_bytes += self.engine.stats()["data_bytes"] - before

    def compact(self, mark: int) -> None:
        if self.policy:
            while self.engine.compact_some(mark, MIN_ROWSETS):
                pass
        elif self.engine.stats()["rowsets"] >= MIN_ROWSETS:
            self.engine.compact(mark)

    def scan(self) -> int:
        """Times a full scan of 2 columns (the best of 2) into ``scan_rates``."""
        best, rows = float("inf"), 0
        for _ in range(2):
            start = time.perf_counter()
            rows = self.engine.scan(columns=["id", "a"]).num_rows
            best = min(best, time.perf_counter() - start)
        self.scan_rates.append(rows / best)
        return rows

    def figures(self, prefix: str) -> dict[str, Any]:
        stats = self.engine.stats()
        rows = self.scan()
        return {
            f"{prefix}_write_amp": round(stats["compaction_bytes_written"] / self.flushed_bytes, 3),
            f"{prefix}_written_bytes": stats["compaction_bytes_written"],
            f"{prefix}_compactions": stats["compactions"],
            f"{prefix}_compact_s": round(stats["compaction_duration_us"] / 1e6, 3),
            f"{prefix}_rowsets": stats["rowsets"],
            f"{prefix}_data_bytes": stats["data_bytes"],
            f"{prefix}_scan_rows_per_s": round(statistics.mean(self.scan_rates)),
            f"{prefix}_rows": rows,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="96 flushes, not 320")
    args = parser.parse_args()
    flushes, rows = (96, 5_000) if args.quick else (320, 5_000)
    fresh_rows = rows * 4 // 5
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory(prefix="nyala-compaction-bench-") as tmp:
        root = Path(tmp)
        policy, baseline = Side(root, "policy", True), Side(root, "baseline", False)
        next_key = 0
        started = time.perf_counter()
        for flush in range(flushes):
            fresh = np.arange(next_key, next_key + fresh_rows)
            next_key += fresh_rows
            written = next_key - fresh_rows  # keys of earlier flushes: some are updated
            old = rng.choice(written, min(written, rows - fresh_rows), replace=False)
            ops = batch(rng, fresh, old)
            timestamp = (flush + 1) * 1_000
            mark = max(0, (flush + 1 - RETENTION_FLUSHES) * 1_000)
            for side in (policy, baseline) if flush % 2 else (baseline, policy):
                side.write(ops, timestamp)
                side.compact(mark)
            if (flush + 1) % SCAN_EVERY == 0 and flush + 1 < flushes:
                policy.scan()
                baseline.scan()
            if (flush + 1) % 16 == 0:
                p, b = policy.engine.stats(), baseline.engine.stats()
                print(
                    f"flush {flush + 1:4d}: policy {p['rowsets']} rowsets, "
                    f"{p['compaction_bytes_written'] / 2**20:8.1f} MiB written; baseline "
                    f"{b['rowsets']} rowsets, {b['compaction_bytes_written'] / 2**20:8.1f} MiB",
                    flush=True,
                )
        total_s = time.perf_counter() - started
        out: dict[str, Any] = {"bench": "compaction", "flushes": flushes, "rows_per_flush": rows}
        out.update(policy.figures("policy"))
        out.update(baseline.figures("baseline"))
    assert out["policy_rows"] == out["baseline_rows"], "both engines hold the same rows"
    out["write_amp_ratio"] = round(out["baseline_written_bytes"] / out["policy_written_bytes"], 3)
    out["space_ratio"] = round(out["policy_data_bytes"] / out["baseline_data_bytes"], 3)
    out["scan_ratio"] = round(out["policy_scan_rows_per_s"] / out["baseline_scan_rows_per_s"], 3)
    out["compact_time_ratio"] = round(out["baseline_compact_s"] / out["policy_compact_s"], 3)
    out["total_s"] = round(total_s, 1)
    out["targets"] = {"write_amp_ratio": ">= 3", "space_ratio": "<= 2", "scan_ratio": ">= 0.5"}
    print(
        f"compaction wrote {out['policy_write_amp']}x the flushed bytes with the policy, "
        f"{out['baseline_write_amp']}x merging everything (ratio {out['write_amp_ratio']}); "
        f"space {out['space_ratio']}, scan {out['scan_ratio']}"
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
