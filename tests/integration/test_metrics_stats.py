"""Metrics that show the data, and ``table statistics`` from tablet reports (issue 35, item 2):
after a load, each tserver's ``/metrics`` counts the rows and bytes written (labelled by table
and tablet), write errors by row status, the rows and bytes scanned, flushes and their time,
MemRowSet, rowset and WAL sizes, tracked memory; the master answers the table's rows and bytes
on disk from its leaders' reports, without a scan, within a heartbeat or two. The storage
engine's own size-triggered flushes are counted too."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner

import nyala
from nyala.cli import main
from nyala.local_cluster import LocalCluster
from nyala.testing.mini_cluster import FAST_TSERVER_FLAGS, fast_master_flags

SCHEMA = nyala.Schema.parse("id:int64, v:double?, s:string?", key=["id"])
# Tservers report to the master every 200 ms (FAST_TSERVER_FLAGS) and flush every second.
HEARTBEAT_S = 0.2
TSERVER_FLAGS = [*FAST_TSERVER_FLAGS, "--flush-interval-ms", "1000"]
_SAMPLE = re.compile(r"^(?P<name>\w+)(\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")


def _scrape(http_addr: str) -> list[tuple[str, dict[str, str], float]]:
    with urllib.request.urlopen(f"http://{http_addr}/metrics", timeout=10) as page:
        text = page.read().decode()
    out = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"] or ""))
            out.append((match["name"], labels, float(match["value"])))
    return out


def _total(cluster: LocalCluster, name: str, table: str) -> float:
    return sum(
        value
        for ts in cluster.mini.tservers
        for metric, labels, value in _scrape(ts.http_addr)
        if metric == name and labels.get("table") == table
    )


def _statistics(cluster: LocalCluster, table: str) -> dict[str, Any]:
    result = CliRunner(env={"NYALA_MASTERS": cluster.masters}).invoke(
        main, ["table", "statistics", table, "--format", "json"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def _until(check: Callable[[], bool], timeout_s: float) -> float:
    """Seconds until ``check()`` is true; fails after ``timeout_s``."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout_s, f"not within {timeout_s} s"
        time.sleep(0.05)
    return time.monotonic() - start


@pytest.mark.parametrize(
    "rows",
    [pytest.param(100_000, id="100k"), pytest.param(1_000_000, id="1M", marks=pytest.mark.scale)],
)
def test_metrics_and_statistics_reflect_a_load(rows: int) -> None:
    with LocalCluster(1, 3, master_flags=fast_master_flags(), tserver_flags=TSERVER_FLAGS) as lc:
        table = lc.client.create_table(
            "m", SCHEMA, partitioning=nyala.HashPartitioning("id", 4), replicas=3
        )
        assert _statistics(lc, "m")["rows"] == 0
        batch = 100_000
        for first in range(0, rows, batch):
            ids = np.arange(first, first + batch, dtype=np.int64)
            data = pa.table({"id": ids, "v": ids / 2, "s": pa.array(ids.astype(str))})
            assert table.insert(data).ok
        loaded_s = time.monotonic()

        # The master's view: every tablet's leader reported its rows at the next heartbeat.
        _until(lambda: lc.client.table_statistics("m")["rows"] == rows, timeout_s=10)
        seen_s = time.monotonic() - loaded_s
        print(f"\ntable statistics showed {rows:,} rows {seen_s * 1000:.0f} ms after the load")
        stats = _statistics(lc, "m")
        assert stats["rows"] == rows
        assert len(stats["tablets"]) == 4
        assert all(t["reported"] for t in stats["tablets"])
        assert stats["on_disk_bytes"] > rows * 8  # at least the WAL holds every key

        # Each tserver's metrics: every replica applied every row of its tablet (a follower
        # applies the last batch once the next heartbeat carries the commit index).
        _until(lambda: _total(lc, "nyala_rows_written_total", "m") == 3 * rows, timeout_s=10)
        assert _total(lc, "nyala_write_errors_total", "m") == 0
        assert _total(lc, "nyala_bytes_written_total", "m") > 3 * rows * 8  # ids alone
        assert _total(lc, "nyala_wal_bytes", "m") > 3 * rows * 8
        assert _total(lc, "nyala_wal_segments", "m") >= 12
        # Rows sit in MemRowSets until the periodic flush moves them to rowsets.
        _until(lambda: _total(lc, "nyala_data_rows", "m") == 3 * rows, timeout_s=30)
        assert _total(lc, "nyala_flushes_total", "m") >= 12  # each of the 12 replicas once
        assert _total(lc, "nyala_flush_duration_seconds_total", "m") > 0
        assert _total(lc, "nyala_data_rowsets", "m") >= 12
        assert _total(lc, "nyala_data_bytes", "m") > 3 * rows  # compressed, still > 1 B/row
        assert _total(lc, "nyala_memrowset_rows", "m") == 0
        # What the rowsets hold while open counts against the memory limit: at least each
        # replica's bloom filters, 10 bits a key.
        _until(lambda: _tracked(lc, "rowset indexes") >= 3 * rows * 10 / 8, timeout_s=10)

        # A duplicate key fails its row on every replica, counted by its row status.
        assert not table.insert({"id": [0, 1]}).ok
        # (the followers count it once they apply it, right after the majority acknowledged)
        expected = {"ALREADY_PRESENT": 3 * 2}
        _until(lambda: _by_label(lc, "nyala_write_errors_total", "code") == expected, 10)

        assert table.scan().to_arrow().num_rows == rows
        assert _total(lc, "nyala_rows_scanned_total", "m") == rows  # leaders only served it
        assert _total(lc, "nyala_bytes_scanned_total", "m") > rows * 8
        # One leader per tablet (once an election a loaded machine may cause has settled).
        _until(lambda: _leaders(lc) == 4, timeout_s=10)
    # Within one heartbeat of the last acknowledged write, plus what applying the last batch
    # and a loaded 2-core machine add.
    assert seen_s < HEARTBEAT_S + 0.8, seen_s


def _leaders(cluster: LocalCluster) -> float:
    return sum(
        value
        for ts in cluster.mini.tservers
        for metric, _, value in _scrape(ts.http_addr)
        if metric == "nyala_leaders"
    )


def _tracked(cluster: LocalCluster, kind: str) -> float:
    """``nyala_memory_tracked_bytes`` of ``kind``, summed over every tserver."""
    return _by_label(cluster, "nyala_memory_tracked_bytes", "kind").get(kind, 0.0)


def _by_label(cluster: LocalCluster, name: str, label: str) -> dict[str, float]:
    """``name`` summed over every tserver, by the value of ``label``."""
    out: dict[str, float] = {}
    for ts in cluster.mini.tservers:
        for metric, labels, value in _scrape(ts.http_addr):
            if metric == name:
                out[labels[label]] = out.get(labels[label], 0.0) + value
    return out


def test_size_triggered_flushes_are_counted() -> None:
    # A 1 MiB flush threshold and no periodic flush within the test: every flush is the
    # storage engine's own, started by the MemRowSet's size.
    flags = [*FAST_TSERVER_FLAGS, "--flush-threshold-mb", "1", "--flush-interval-ms", "600000"]
    with LocalCluster(1, 1, master_flags=fast_master_flags(), tserver_flags=flags) as lc:
        table = lc.client.create_table("f", SCHEMA, replicas=1)
        for first in range(0, 200_000, 50_000):
            ids = np.arange(first, first + 50_000, dtype=np.int64)
            assert table.insert({"id": ids, "s": pa.array(ids.astype(str))}).ok

        # A flush may finish between the two scrapes; wait for a quiet moment where every
        # rowset on disk is counted as a flush.
        def counted() -> bool:
            rowsets = _total(lc, "nyala_data_rowsets", "f")
            return rowsets >= 2 and _total(lc, "nyala_flushes_total", "f") == rowsets

        _until(counted, timeout_s=30)
        memory = _by_label(lc, "nyala_memory_tracked_bytes", "kind")
        kinds = {"MemRowSet", "log cache", "scanners", "key blocks", "rowset indexes", "untracked"}
        assert set(memory) == kinds
        assert memory["untracked"] > 0  # an idle tserver's interpreter at least
        assert _by_label(lc, "nyala_tablet_copy_bytes_total", "direction") == {
            "fetched": 0.0,
            "served": 0.0,
        }


def test_background_compactions_leave_a_large_old_rowset_alone() -> None:
    # One large rowset, then a small one per flush round (every 300 ms) and a compaction once
    # there are 3: the policy merges the small ones among themselves. Merging every rowset
    # (the policy before) would rewrite the large one each time: at least its bytes per
    # compaction.
    flags = [
        *FAST_TSERVER_FLAGS,
        "--flush-interval-ms",
        "300",
        "--compaction-rowsets-min",
        "3",
    ]
    with LocalCluster(1, 1, master_flags=fast_master_flags(), tserver_flags=flags) as lc:
        table = lc.client.create_table("c", SCHEMA, replicas=1)
        ids = np.arange(200_000, dtype=np.int64)
        assert table.insert({"id": ids, "s": pa.array(ids.astype(str))}).ok
        _until(lambda: _total(lc, "nyala_data_rowsets", "c") == 1, timeout_s=30)
        large = _total(lc, "nyala_data_bytes", "c")
        key = 200_000
        deadline = time.monotonic() + 90
        while (compactions := _total(lc, "nyala_compactions_total", "c")) < 6:
            assert time.monotonic() < deadline, f"{compactions} compactions within 90 s"
            assert table.insert({"id": [key], "s": ["x"]}).ok
            key += 1
            if key == 200_003:  # a tombstone merged without the rowset it hides
                assert table.delete({"id": [7]}).ok
            time.sleep(0.35)
        written = _total(lc, "nyala_compaction_written_bytes_total", "c")
        compactions = _total(lc, "nyala_compactions_total", "c")
        assert written < large / 2, f"{compactions} compactions wrote {written} bytes"
        assert _total(lc, "nyala_data_rowsets", "c") < 3 + 1  # one may be just flushed
        assert table.scan().count() == key - 1
        assert table.scan(["id"], where=[("id", "=", 7)]).count() == 0


def test_statistics_of_a_missing_table_is_a_json_error() -> None:
    with LocalCluster(1, 1, master_flags=fast_master_flags(), tserver_flags=TSERVER_FLAGS) as lc:
        result = CliRunner(env={"NYALA_MASTERS": lc.masters}).invoke(
            main, ["table", "statistics", "nope", "--format", "json"], catch_exceptions=False
        )
    assert result.exit_code == 1
    assert json.loads(result.stderr)["error"] == "NotFoundError"
