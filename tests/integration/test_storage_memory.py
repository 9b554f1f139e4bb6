"""A tablet's compaction and its scans hold a bounded amount of memory, whatever it stores.

* **Compaction.** Every upsert keeps a row version until history older than the ancient
  history mark is collected (15 minutes by default), so a hot key set updated all the time
  gives rowsets of millions of versions over a few thousand keys. Compaction merged them by
  loading every version of every rowset at once: with ``benches/tserver_write_bench.py``'s
  data (50,000 keys upserted ~45 M times in two minutes) each tablet server grew past 7 GB
  and the kernel killed one.
* **Scans.** Rowsets whose key ranges overlap (every flush of a table written in random key
  order) were each read whole into memory before being merged: a full scan of a tablet held
  every row it stores.

Both now merge as streams (docs/storage-format.md, "Row versions (MVCC)"; docs/scans.md).
Each case runs in a process of its own, whose peak resident set (VmHWM, reset through
``/proc/self/clear_refs`` just before) is the operation's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

_COMMON = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from nyala.rowops import make_op_batch
    from nyala.schema import Schema
    from nyala.storage import StorageEngine

    SCHEMA = Schema.parse("id:int64, payload:string", key=["id"])

    def status(field):
        for line in open("/proc/self/status"):
            if line.startswith(field):
                return int(line.split()[1]) * 1024

    def reset_peak():
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak resident set starts again from here
        return status("VmRSS:")
    """
)

_WRITE_VERSIONS = """
directory, flushes, keys, rounds = sys.argv[1], *map(int, sys.argv[2:])
engine = StorageEngine.create(directory, SCHEMA, background_flush=False)
payload = ["x" * 92] * keys
op_index = 0
for _ in range(flushes):
    for _ in range(rounds):  # every key upserted once more: one more version each
        op_index += 1
        batch = make_op_batch({"id": np.arange(keys), "payload": payload}, "upsert", SCHEMA)
        engine.apply(batch, op_index, op_index)
    engine.flush()
"""

_WRITE_INTERLEAVED = """
directory, flushes, rows = sys.argv[1], *map(int, sys.argv[2:])
engine = StorageEngine.create(directory, SCHEMA, background_flush=False)
payload = ["x" * 92] * 100_000
op_index = 0
for f in range(flushes):
    for start in range(0, rows, 100_000):  # keys interleaved: every rowset spans the range
        op_index += 1
        ids = np.arange(start, start + 100_000) * flushes + f
        batch = make_op_batch({"id": ids, "payload": payload}, "insert", SCHEMA)
        engine.apply(batch, op_index, op_index)
    engine.flush()
"""

_COMPACT = """
engine = StorageEngine.open(sys.argv[1], background_flush=False)
stats = engine.stats()
before = reset_peak()
assert engine.compact(0)
print(json.dumps({
    "rowsets": stats["rowsets"], "rows": stats["disk_rows"], "grown": status("VmHWM:") - before,
    "after_rowsets": engine.stats()["rowsets"], "after_rows": engine.stats()["disk_rows"],
}))
"""

_SCAN = """
engine = StorageEngine.open(sys.argv[1], background_flush=False)
rowsets = engine.stats()["rowsets"]
before = reset_peak()
cursor = engine.open_scan(snapshot_ts=None if sys.argv[2] == "latest" else 10**9)
rows, last = 0, -1
while (batch := cursor.next_batch(4 << 20)) is not None:
    ids = batch.column(0).to_numpy()
    assert len(ids) == 0 or (ids[0] > last and (np.diff(ids) > 0).all()), "in key order"
    last = ids[-1] if len(ids) else last
    rows += batch.num_rows
print(json.dumps({"rowsets": rowsets, "rows": rows, "grown": status("VmHWM:") - before}))
"""


_UPDATE = """
engine = StorageEngine.open(sys.argv[1], background_flush=False)
def write(op, ids, op_index):
    batch = make_op_batch({"id": ids, "payload": ["y"] * len(ids)}, op, SCHEMA)
    assert engine.apply(batch, op_index, op_index).ok
write("upsert", np.array([0]), 10**6)  # the MemRowSet and the write path set up
before = reset_peak()
write("update", np.arange(0, 50_000, 50), 10**6 + 1)  # 1,000 keys: each checked for presence
print(json.dumps({"rowsets": engine.stats()["rowsets"], "grown": status("VmHWM:") - before}))
"""

_WRITE_KEYS = """
directory, keys = sys.argv[1], int(sys.argv[2])
engine = StorageEngine.create(directory, SCHEMA, background_flush=False)
for op_index, start in enumerate(range(0, keys, 500_000), 1):
    ids = np.arange(start, min(keys, start + 500_000)) * 3
    batch = make_op_batch({"id": ids, "payload": ["p"] * len(ids)}, "insert", SCHEMA)
    engine.apply(batch, op_index, op_index)
engine.flush()
"""

_UPDATE_SPREAD = """
from nyala import _native
directory, keys, budget = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
_native.set_key_block_cache_bytes(budget)
engine = StorageEngine.open(directory, background_flush=False)
batch = make_op_batch({"id": np.array([-1]), "payload": ["y"]}, "upsert", SCHEMA)
assert engine.apply(batch, 10**6, 10**6).ok  # the MemRowSet and the write path set up
before = reset_peak()
rng = np.random.default_rng(5)
for round in range(5):  # 1,000 keys spread over the tablet each time: all are there
    ids = np.sort(rng.choice(keys, 1_000, replace=False)) * 3
    batch = make_op_batch({"id": ids, "payload": ["y"] * len(ids)}, "update", SCHEMA)
    assert engine.apply(batch, 10**6 + 1 + round, 10**6 + 1 + round).ok
print(json.dumps({"grown": status("VmHWM:") - before, **_native.key_block_cache_stats()}))
"""


def _run(script: str, *args: Any) -> dict[str, Any]:
    """Runs ``script`` in a fresh process; its last line, a JSON object (empty if none)."""
    done = subprocess.run(
        [sys.executable, "-c", _COMMON + script, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    lines = done.stdout.strip().splitlines()
    figures: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    return figures


def _versions(tmp_path: Path, flushes: int, keys: int, rounds: int) -> Path:
    """A tablet of ``flushes`` rowsets, each with ``rounds`` versions of ``keys`` keys."""
    tablet = tmp_path / "tablet"
    _run(_WRITE_VERSIONS, tablet, flushes, keys, rounds)
    return tablet


def test_compacting_millions_of_versions_of_a_few_keys_stays_in_bounded_memory(
    tmp_path: Path,
) -> None:
    # 8 rowsets of 1.5 M versions (50,000 keys, thirty versions each): 12 M versions of
    # about 110 bytes, 1.3 GB in memory had they been loaded at once.
    flushes, keys, rounds = 8, 50_000, 30
    figures = _run(_COMPACT, _versions(tmp_path, flushes, keys, rounds))
    versions = flushes * keys * rounds
    assert (figures["rowsets"], figures["rows"]) == (flushes, versions)
    # Every version is newer than the mark (0): all kept, in one rowset.
    assert (figures["after_rowsets"], figures["after_rows"]) == (1, versions)
    # What stays: a row group of each rowset being read, one output chunk, the Parquet
    # writer's row group and the bloom filter of the output's keys: about 155 MiB here, which
    # does not grow with the versions; a quarter of their bytes at most (2,867 MiB when they
    # were loaded at once).
    grown = figures["grown"]
    assert grown < 0.25 * versions * 110, f"compaction grew the process by {grown >> 20} MiB"


def test_a_full_scan_of_overlapping_rowsets_stays_in_bounded_memory(tmp_path: Path) -> None:
    # 4 rowsets of 1.5 M rows whose keys interleave: one group of overlapping sources, 6 M
    # rows of about 110 bytes.
    flushes, rows = 4, 1_500_000
    tablet = tmp_path / "tablet"
    _run(_WRITE_INTERLEAVED, tablet, flushes, rows)
    for mode in ("latest", "snapshot"):
        figures = _run(_SCAN, tablet, mode)
        assert (figures["rowsets"], figures["rows"]) == (flushes, flushes * rows), mode
        # A row group being decoded and a batch of each rowset, and one merged chunk: about
        # 115 MiB, the same for 3 M rows as for 13 M; a quarter of the rows' bytes at most
        # here (1,409 MiB for 6 M rows when each rowset was read whole).
        grown = figures["grown"]
        assert grown < 0.25 * flushes * rows * 110, f"{mode} scan grew by {grown >> 20} MiB"


def test_an_update_of_a_hot_key_set_loads_a_key_index_of_its_keys_not_its_versions(
    tmp_path: Path,
) -> None:
    # 2 rowsets of 3 M versions of 50,000 keys: an UPDATE checks that each key is present,
    # in the newest rowset's key index, which used to hold every version's key (3 M).
    flushes = 2
    figures = _run(_UPDATE, _versions(tmp_path, flushes, 50_000, 60))
    assert figures["rowsets"] == flushes
    # The index of 50,000 keys and a row group being decoded: about 4 MiB (3 with 100,000
    # versions); 3 M keys with their offsets and flags were several times the limit here.
    grown = figures["grown"]
    assert grown < 16 << 20, f"an update grew the process by {grown >> 20} MiB"


def test_updates_spread_over_millions_of_keys_hold_the_key_block_cache_at_most(
    tmp_path: Path,
) -> None:
    # One rowset of 4 M keys. Each key an UPDATE checks is looked up in the one block of
    # 4,096 rows that may hold it, through a cache of 8 MiB here: 5,000 keys spread over the
    # tablet touch most of its ~1,000 blocks. A rowset used to keep every key it held in
    # memory once one key was checked (6 M keys: 92 MiB grown), and a cache as large as the
    # blocks grows by 66 MiB here (tried).
    keys, budget = 4_000_000, 8 << 20
    tablet = tmp_path / "tablet"
    _run(_WRITE_KEYS, tablet, keys)
    figures = _run(_UPDATE_SPREAD, tablet, keys, budget)
    assert figures["bytes"] <= budget
    assert figures["misses"] > 500
    grown = figures["grown"]
    assert grown < 32 << 20, f"updates grew the process by {grown >> 20} MiB"
