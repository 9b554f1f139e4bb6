"""A compaction's memory does not grow with the row versions it merges.

Every upsert keeps a row version until history older than the ancient history mark is
collected (15 minutes by default), so a hot key set updated all the time gives rowsets of
millions of versions over a few thousand keys. Compaction merged them by loading every
version of every rowset at once: with ``benches/tserver_write_bench.py``'s data (50,000 keys
upserted ~45 M times in two minutes) each tablet server grew past 7 GB and the kernel killed
one. It now streams the merge (docs/storage-format.md, "Row versions (MVCC)").
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

# Runs in a process of its own: its peak resident set is the compaction's (VmHWM, reset just
# before it through /proc/self/clear_refs).
_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from nyala.rowops import OpType, make_op_batch
    from nyala.schema import Schema
    from nyala.storage import StorageEngine

    directory, flushes, keys, rounds = sys.argv[1], *map(int, sys.argv[2:])
    schema = Schema.parse("id:int64, payload:string", key=["id"])
    engine = StorageEngine.create(directory, schema, background_flush=False)
    payload = ["x" * 92] * keys
    op_index = 0
    for _ in range(flushes):
        for _ in range(rounds):  # every key upserted once more: one more version each
            op_index += 1
            batch = make_op_batch({"id": np.arange(keys), "payload": payload}, "upsert", schema)
            engine.apply(batch, op_index, op_index)
        engine.flush()

    def status(field):
        for line in open("/proc/self/status"):
            if line.startswith(field):
                return int(line.split()[1]) * 1024

    stats = engine.stats()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak resident set starts again from here
    before = status("VmRSS:")
    assert engine.compact(0)
    print(json.dumps({
        "rowsets": stats["rowsets"], "versions": stats["disk_rows"],
        "before": before, "peak": status("VmHWM:"),
        "after_rowsets": engine.stats()["rowsets"], "after_rows": engine.stats()["disk_rows"],
    }))
    """
)


def test_compacting_millions_of_versions_of_a_few_keys_stays_in_bounded_memory(
    tmp_path: Path,
) -> None:
    # 8 rowsets of 1.5 M versions (50,000 keys, thirty versions each): 12 M versions of
    # about 110 bytes, 1.3 GB in memory had they been loaded at once.
    flushes, keys, rounds = 8, 50_000, 30
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _SCRIPT,
            str(tmp_path / "tablet"),
            str(flushes),
            str(keys),
            str(rounds),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["rowsets"] == flushes
    versions = flushes * keys * rounds
    assert figures["versions"] == versions
    # Every version is newer than the mark (0): all kept, in one rowset.
    assert (figures["after_rowsets"], figures["after_rows"]) == (1, versions)
    grown = figures["peak"] - figures["before"]
    # What stays: a row group of each rowset being read, one output chunk, the Parquet
    # writer's row group and the bloom filter of the output's keys: 70-110 MiB here, a tenth
    # of the versions' bytes at most (all of them, and more, when they were loaded at once).
    assert grown < 0.1 * versions * 110, f"compaction grew the process by {grown >> 20} MiB"
