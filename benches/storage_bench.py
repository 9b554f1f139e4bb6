"""Storage engine benchmark: apply and scan rates next to a pyarrow Parquet baseline.

Apply: upserts of 10-column rows in batches of 10k into an engine that already holds 1M rows,
through the Arrow IPC bytes path (the WAL payload form), across at least one background flush.
Scan: a full scan of 2 of the 10 columns and a selective predicate, from the compacted tablet,
next to ``pyarrow.parquet.read_table`` reading the same rows from one Parquet file in the same
run (``scan_vs_parquet_ratio`` = engine rows/s / pyarrow rows/s; target >= 0.5). Also reported:
the scan of the uncompacted tablet (a merge across rowsets), and apply through pyarrow FFI.

Spark-shaped apply (issue 12): the 5-column table of ``benches/spark_load_bench.py`` (int64
key, double, string, timestamp, nullable int32), one tablet's share of the bulk load (1M rows,
500k with ``--quick``) in batches of 10k ascending keys from two interleaved key ranges (two
Spark partitions), applied through the IPC path as INSERT batches of fresh keys and then as
UPSERT batches of the same keys. Reported per phase: wall rows/s and rows per CPU second of the
whole process (the applying thread plus the background flush thread, which is what a tserver
pays). Baseline in the same run: pyarrow decoding the same IPC bytes and sorting each batch by
key (``spark_*_vs_sort_ratio`` = engine rows per CPU second / baseline rows per CPU second).
Medians before/after the November 2026 apply work are in docs/storage-format.md (Performance):
INSERT 1.44 M -> 2.71 M rows/CPU s, UPSERT 2.16 M -> 3.43 M, baseline ~27 M in both.

Typed columns (issue 33): the same rows applied (IPC path, INSERT batches of 10k, 500k rows,
250k with ``--quick``) into a fresh engine and scanned (3 value columns, after a flush), once
with ``a:decimal(18,2), b:date, s:varchar(32)`` and once with ``a:int64, b:int64, s:string`` (the
decimals' unscaled values and the dates' day numbers as the integers), alternating, 5 rounds;
``typed_apply_ratio`` and ``typed_scan_ratio`` are the typed table's median rate over the other
one's (target >= 0.8 each).

Row versions (issue 34): every batch above is applied with a commit timestamp (its op index),
as a tablet replica applies WRITE entries, and the compaction collects history at the newest
timestamp (the steady state: older versions are past the history retention). Then, on one
engine (1M keys, 500k with ``--quick``, inserted, then 20 % of the keys updated in each of 3
later rounds, flushed after each round and compacted with mark 0 so every version is kept in
one file): ``latest_scan_rows_per_s`` (a full scan of 2 columns, newest versions) and
``snapshot_scan_rows_per_s`` (the same scan at the timestamp after the first update round), in
the same run, and ``snapshot_vs_latest_ratio`` = snapshot rows/s / latest rows/s (target
>= 0.8).

Usage: ``python benches/storage_bench.py [--quick] [--typed-only] [--mvcc-only]``; the last line
printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Before numpy loads: idle OpenBLAS worker threads spin, and the Spark-shaped figures count the
# CPU time of the whole process.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from nyala.rowops import OpType, encode, make_op_batch
from nyala.schema import Schema
from nyala.storage import StorageEngine

BATCH_ROWS = 10_000
BASE_ROWS = 1_000_000
SCHEMA = Schema.parse(
    "id:int64, a:int64, b:int64, c:int64, d:int64, e:double, f:double, g:double, h:double?, "
    "s:string?",
    key=["id"],
)


def rows(ids: np.ndarray[Any, Any], seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    n = len(ids)
    data: dict[str, Any] = {"id": ids.astype(np.int64)}
    for name in "abcd":
        data[name] = rng.integers(0, 1 << 40, n, dtype=np.int64)
    for name in "efgh":
        data[name] = rng.random(n)
    data["s"] = pa.array(np.char.add("v", (ids % 997).astype(str)))
    return data


def batches(ids: np.ndarray[Any, Any], seed: int) -> list[pa.Buffer]:
    out = []
    for start in range(0, len(ids), BATCH_ROWS):
        chunk = ids[start : start + BATCH_ROWS]
        out.append(encode(make_op_batch(rows(chunk, seed + start), OpType.UPSERT, SCHEMA)))
    return out


SPARK_SCHEMA = Schema.parse("id:int64, v:double, s:string, ts:timestamp, n:int32?", key=["id"])


def spark_payloads(rows: int, op: OpType, seed: int) -> list[pa.Buffer]:
    """``rows`` Spark-shaped rows as op batches of ``BATCH_ROWS``: distinct ascending keys with
    gaps (a hash partition's share), the batches alternating between the lower and upper half
    of the key range (two Spark partitions writing at once)."""
    rng = np.random.default_rng(seed)
    ids = np.arange(rows, dtype=np.int64) * 6 + rng.integers(0, 6, rows)
    halves = [ids[: rows // 2], ids[rows // 2 :]]
    chunks = [
        [half[i : i + BATCH_ROWS] for i in range(0, len(half), BATCH_ROWS)] for half in halves
    ]
    out = []
    for pair in zip(*chunks, strict=False):
        for chunk in pair:
            nulls = chunk % 10 == 0
            data = {
                "id": chunk,
                "v": rng.random(len(chunk)),
                "s": pa.array(chunk.astype(str).astype(object), pa.string()),
                "ts": pa.array(chunk * 1000, pa.timestamp("us")),
                "n": pa.array((chunk % 1000).astype(np.int32), mask=nulls),
            }
            out.append(encode(make_op_batch(data, op, SPARK_SCHEMA)))
    assert sum(len(c) for pair in chunks for c in pair) == rows
    return out


def spark_apply(root: Path, rows: int) -> dict[str, Any]:
    """INSERT then UPSERT of one tablet's share of the Spark load, next to the sort baseline."""
    inserts = spark_payloads(rows, OpType.INSERT, 11)
    upserts = spark_payloads(rows, OpType.UPSERT, 11)
    engine = StorageEngine.create(root / "spark", SPARK_SCHEMA)
    op_index = 0
    figures: dict[str, Any] = {}
    for name, payloads in (("insert", inserts), ("upsert", upserts)):
        start, cpu_start = time.perf_counter(), time.process_time()
        for payload in payloads:
            op_index += 1
            assert engine.apply(payload, op_index, op_index).ok
        engine.flush()
        wall_s = time.perf_counter() - start
        cpu_s = time.process_time() - cpu_start
        assert engine.background_error() is None
        figures[f"spark_{name}_rows_per_s"] = round(rows / wall_s)
        figures[f"spark_{name}_cpu_rows_per_s"] = round(rows / cpu_s)
    assert engine.scan(columns=["id"]).num_rows == rows
    # Baseline: decode the same IPC bytes and sort each batch by key, in pyarrow.
    start, cpu_start = time.perf_counter(), time.process_time()
    for payload in inserts:
        batch = pa.ipc.open_stream(payload).read_next_batch()
        batch.sort_by([("id", "descending")])
    base_cpu_s = time.process_time() - cpu_start
    base_rows_per_cpu_s = rows / base_cpu_s
    figures["spark_sort_baseline_cpu_rows_per_s"] = round(base_rows_per_cpu_s)
    for name in ("insert", "upsert"):
        figures[f"spark_{name}_vs_sort_ratio"] = round(
            figures[f"spark_{name}_cpu_rows_per_s"] / base_rows_per_cpu_s, 3
        )
    figures["spark_rows"] = rows
    return figures


TYPED_SCHEMA = Schema.parse("id:int64, a:decimal(18,2), b:date, s:varchar(32)?", key=["id"])
PLAIN_SCHEMA = Schema.parse("id:int64, a:int64, b:int64, s:string?", key=["id"])


def typed_payloads(schema: Schema, count: int) -> list[pa.Buffer]:
    """INSERT batches of ``count`` rows of ``schema`` (typed or plain: the same values)."""
    rng = np.random.default_rng(11)
    typed = schema is TYPED_SCHEMA
    out = []
    for start in range(0, count, BATCH_ROWS):
        ids = np.arange(start, min(start + BATCH_ROWS, count), dtype=np.int64)
        cents = rng.integers(-(10**15), 10**15, len(ids), dtype=np.int64)
        days = rng.integers(-20_000, 30_000, len(ids), dtype=np.int64)
        text = pa.array(np.char.add("customer-", (ids % 100_003).astype(str)))
        data: dict[str, Any] = {
            "id": ids,
            "s": text,
        }
        if typed:
            data["a"] = pa.Array.from_buffers(
                pa.decimal128(18, 2), len(ids), [None, pa.py_buffer(_i128(cents))]
            )
            data["b"] = pa.array(days.astype(np.int32)).cast(pa.date32())
        else:
            data["a"] = pa.array(cents)
            data["b"] = pa.array(days)
        out.append(encode(make_op_batch(data, OpType.INSERT, schema)))
    return out


def _i128(values: np.ndarray[Any, Any]) -> bytes:
    """Little-endian 128-bit two's complement of int64 ``values`` (Arrow's decimal128 layout)."""
    wide = np.empty((len(values), 2), dtype=np.int64)
    wide[:, 0] = values
    wide[:, 1] = np.where(values < 0, -1, 0)
    return wide.tobytes()


def typed_round(
    root: Path, schema: Schema, payloads: list[pa.Buffer], count: int
) -> tuple[float, float]:
    """(apply rows/s, scan rows/s) of one fresh engine of ``schema``."""
    engine = StorageEngine.create(root, schema, background_flush=False)
    start = time.perf_counter()
    for index, payload in enumerate(payloads, 1):
        assert engine.apply(payload, index, index).ok
    apply_rate = count / (time.perf_counter() - start)
    engine.flush()
    scan_s, table = timed(lambda: engine.scan(columns=["a", "b", "s"]), 3)
    assert table.num_rows == count
    return apply_rate, count / scan_s


def typed_figures(root: Path, count: int, rounds: int = 5) -> dict[str, Any]:
    """Apply and scan rates of the typed table next to the int64/string one, alternating."""
    payloads = {
        "typed": typed_payloads(TYPED_SCHEMA, count),
        "plain": typed_payloads(PLAIN_SCHEMA, count),
    }
    rates: dict[str, list[tuple[float, float]]] = {"typed": [], "plain": []}
    for i in range(rounds):
        for name, schema in (("plain", PLAIN_SCHEMA), ("typed", TYPED_SCHEMA)):
            rates[name].append(typed_round(root / f"{name}{i}", schema, payloads[name], count))
    apply = {k: statistics.median(r[0] for r in v) for k, v in rates.items()}
    scan = {k: statistics.median(r[1] for r in v) for k, v in rates.items()}
    return {
        "typed_apply_rows_per_s": round(apply["typed"]),
        "plain_apply_rows_per_s": round(apply["plain"]),
        "typed_scan_rows_per_s": round(scan["typed"]),
        "plain_scan_rows_per_s": round(scan["plain"]),
        "typed_apply_ratio": round(apply["typed"] / apply["plain"], 3),
        "typed_scan_ratio": round(scan["typed"] / scan["plain"], 3),
        "typed_rows": count,
    }


def apply_all(engine: StorageEngine, payloads: list[pa.Buffer], op_index: int) -> int:
    """Applies ``payloads`` as the ops after ``op_index``, each at its op index as timestamp;
    returns the last op index."""
    for payload in payloads:
        op_index += 1
        assert engine.apply(payload, op_index, op_index).ok
    return op_index


def mvcc_figures(root: Path, keys: int, repeats: int) -> dict[str, Any]:
    """Latest and snapshot scan rates over one multi-version rowset (see the module doc)."""
    engine = StorageEngine.create(root, SCHEMA, background_flush=False)
    ids = np.arange(keys, dtype=np.int64)
    op_index = apply_all(engine, batches(ids, 1), 0)
    engine.flush()
    rng = np.random.default_rng(11)
    snapshot_ts = 0
    for round_ in range(3):
        updated = np.sort(rng.choice(ids, keys // 5, replace=False))
        op_index = apply_all(engine, batches(updated, 20 + round_), op_index)
        engine.flush()
        if round_ == 0:
            snapshot_ts = op_index
    engine.compact(ancient_history_mark=0)
    # Alternating, so that both see the same machine.
    latest_times, snapshot_times = [], []
    for _ in range(repeats):
        seconds, latest = timed(lambda: engine.scan(columns=["a", "e"]), 1)
        latest_times.append(seconds)
        seconds, snapshot = timed(
            lambda: engine.scan(columns=["a", "e"], snapshot_ts=snapshot_ts), 1
        )
        snapshot_times.append(seconds)
    latest_s = statistics.median(latest_times)
    snapshot_s = statistics.median(snapshot_times)
    assert latest.num_rows == snapshot.num_rows == keys
    assert not latest.equals(snapshot)  # the later rounds changed rows
    return {
        "latest_scan_rows_per_s": round(keys / latest_s),
        "snapshot_scan_rows_per_s": round(keys / snapshot_s),
        "snapshot_vs_latest_ratio": round(latest_s / snapshot_s, 3),
        "mvcc_keys": keys,
        "mvcc_versions": keys + 3 * (keys // 5),
    }


def print_mvcc(mvcc: dict[str, Any]) -> None:
    print(
        f"mvcc    latest {mvcc['latest_scan_rows_per_s'] / 1e6:6.2f} M rows/s, snapshot "
        f"{mvcc['snapshot_scan_rows_per_s'] / 1e6:6.2f} M rows/s "
        f"(ratio {mvcc['snapshot_vs_latest_ratio']})"
    )


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median seconds of ``repeats`` calls, and the last result."""
    times = []
    result = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller run (< 2 minutes)")
    parser.add_argument(
        "--spark-apply-only", action="store_true", help="only the Spark-shaped apply figures"
    )
    parser.add_argument(
        "--typed-only", action="store_true", help="only the typed-column figures (issue 33)"
    )
    parser.add_argument(
        "--mvcc-only", action="store_true", help="only the row-version figures (issue 34)"
    )
    args = parser.parse_args()
    typed_rows = 250_000 if args.quick else 500_000
    mvcc_keys = 500_000 if args.quick else 1_000_000
    if args.mvcc_only:
        with tempfile.TemporaryDirectory() as tmp:
            mvcc = mvcc_figures(Path(tmp), mvcc_keys, 5)
        print_mvcc(mvcc)
        print(json.dumps(mvcc))
        return
    if args.typed_only:
        with tempfile.TemporaryDirectory() as tmp:
            typed = typed_figures(Path(tmp), typed_rows)
        print_typed(typed)
        print(json.dumps(typed))
        return
    if args.spark_apply_only:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(spark_apply(Path(tmp), 500_000 if args.quick else 1_000_000)))
        return
    upsert_rows = 500_000 if args.quick else 2_000_000
    repeats = 3 if args.quick else 5
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        spark_figures = spark_apply(root, 500_000 if args.quick else 1_000_000)
        typed = typed_figures(root / "typed", typed_rows)
        mvcc = mvcc_figures(root / "mvcc", mvcc_keys, 5)
        # 1M rows already in the engine, flushed to disk.
        engine = StorageEngine.create(
            root / "tablet", SCHEMA, flush_threshold_bytes=32 * 1024 * 1024
        )
        base = np.arange(BASE_ROWS, dtype=np.int64) * 2
        op_index = apply_all(engine, batches(base, 1), 0)
        engine.flush()
        # Upserts: half overwrite existing keys, half are new (odd) keys, in random order.
        rng = np.random.default_rng(7)
        keys = rng.permutation(
            np.concatenate([base[: upsert_rows // 2], np.arange(upsert_rows // 2) * 2 + 1])
        )
        payloads = batches(keys, 2)
        flushes_before = engine.stats()["rowsets"]
        start = time.perf_counter()
        cpu_start = time.thread_time()
        for payload in payloads:
            op_index += 1
            result = engine.apply(payload, op_index, op_index)
            assert result.ok
        apply_s = time.perf_counter() - start
        # CPU time of the applying thread alone: the figure without the machine's other load
        # and without the background flush thread (which runs on another core when idle).
        apply_cpu_s = time.thread_time() - cpu_start
        apply_rows_per_s = upsert_rows / apply_s
        engine.flush()
        flushes = engine.stats()["rowsets"] - flushes_before
        assert engine.background_error() is None

        # FFI path (pyarrow RecordBatch handed over through the C data interface), keys in
        # ascending order (the bulk-load case).
        ffi_batches = [
            make_op_batch(rows(base[i : i + BATCH_ROWS], 9), OpType.UPSERT, SCHEMA)
            for i in range(0, 200_000, BATCH_ROWS)
        ]
        start = time.perf_counter()
        for batch in ffi_batches:
            op_index += 1
            engine.apply(batch, op_index, op_index)
        apply_ffi_rows_per_s = 200_000 / (time.perf_counter() - start)
        engine.flush()

        total_rows = BASE_ROWS + upsert_rows // 2
        merge_s, merged = timed(lambda: engine.scan(columns=["id", "e"]), 1)
        assert merged.num_rows == total_rows
        compact_s, _ = timed(lambda: engine.compact(ancient_history_mark=op_index), 1)

        full_s, table = timed(lambda: engine.scan(columns=["a", "e"]), repeats)
        assert table.num_rows == total_rows
        threshold = int(base[-1] * 0.99)
        selective_s, selected = timed(
            lambda: engine.scan(columns=["id", "e"], where=[("id", ">=", threshold)]), repeats
        )

        # Baseline: the same rows in one Parquet file, read by pyarrow.
        everything = engine.scan()
        parquet_path = root / "baseline.parquet"
        pq.write_table(everything, parquet_path, compression="snappy")
        parquet_s, baseline = timed(
            lambda: pq.read_table(parquet_path, columns=["a", "e"]), repeats
        )
        assert baseline.num_rows == total_rows
        parquet_selective_s, baseline_selected = timed(
            lambda: pq.read_table(
                parquet_path, columns=["id", "e"], filters=[("id", ">=", threshold)]
            ),
            repeats,
        )
        assert baseline_selected.num_rows == selected.num_rows

    figures = {
        "apply_rows_per_s": round(apply_rows_per_s),
        "apply_thread_cpu_rows_per_s": round(upsert_rows / apply_cpu_s),
        "apply_ffi_sequential_rows_per_s": round(apply_ffi_rows_per_s),
        "flushes_during_apply": flushes,
        "scan_rows_per_s": round(total_rows / full_s),
        "parquet_rows_per_s": round(total_rows / parquet_s),
        "scan_vs_parquet_ratio": round(parquet_s / full_s, 3),
        "scan_selective_s": round(selective_s, 4),
        "parquet_selective_s": round(parquet_selective_s, 4),
        "selective_rows": selected.num_rows,
        "scan_merge_rows_per_s": round(total_rows / merge_s),
        "compact_s": round(compact_s, 3),
        "rows": total_rows,
        "upsert_rows": upsert_rows,
        "batch_rows": BATCH_ROWS,
        **spark_figures,
        **typed,
        **mvcc,
    }
    print(f"apply   {apply_rows_per_s / 1e6:6.2f} M rows/s (IPC path, {flushes} flush(es))")
    print(
        f"scan    {total_rows / full_s / 1e6:6.2f} M rows/s vs pyarrow "
        f"{total_rows / parquet_s / 1e6:6.2f} M rows/s"
    )
    for name in ("insert", "upsert"):
        print(
            f"spark {name} {spark_figures[f'spark_{name}_cpu_rows_per_s'] / 1e6:6.2f} M rows/CPU s"
            f" (sort baseline {spark_figures['spark_sort_baseline_cpu_rows_per_s'] / 1e6:.2f})"
        )
    print_typed(typed)
    print_mvcc(mvcc)
    print(json.dumps(figures))


def print_typed(typed: dict[str, Any]) -> None:
    print(
        f"typed apply {typed['typed_apply_rows_per_s'] / 1e6:6.2f} M rows/s vs int64/string "
        f"{typed['plain_apply_rows_per_s'] / 1e6:.2f} (ratio {typed['typed_apply_ratio']}); "
        f"scan {typed['typed_scan_rows_per_s'] / 1e6:.2f} vs "
        f"{typed['plain_scan_rows_per_s'] / 1e6:.2f} (ratio {typed['typed_scan_ratio']})"
    )


if __name__ == "__main__":
    main()
