"""Metrics that show the data, and ``table statistics`` from tablet reports (issue 35, item 2):
after a load, each tserver's ``/metrics`` counts the rows written (labelled by table and
tablet), the rows scanned, flushes, MemRowSet and rowset sizes; the master answers the table's
rows and bytes on disk from its leaders' reports, without a scan, within a heartbeat or two."""

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
    [pytest.param(100_000, id="100k"), pytest.param(1_000_000, id="1M", marks=pytest.mark.slow)],
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
        _until(lambda: _statistics(lc, "m")["rows"] == rows, timeout_s=10)
        seen_s = time.monotonic() - loaded_s
        stats = _statistics(lc, "m")
        assert len(stats["tablets"]) == 4
        assert all(t["reported"] for t in stats["tablets"])
        assert stats["on_disk_bytes"] > rows * 8  # at least the WAL holds every key

        # Each tserver's metrics: every replica applied every row of its tablet.
        assert _total(lc, "nyala_rows_written_total", "m") == 3 * rows
        assert _total(lc, "nyala_write_errors_total", "m") == 0
        # Rows sit in MemRowSets until the periodic flush moves them to rowsets.
        _until(lambda: _total(lc, "nyala_data_rows", "m") == 3 * rows, timeout_s=30)
        assert _total(lc, "nyala_flushes_total", "m") >= 12  # each of the 12 replicas once
        assert _total(lc, "nyala_data_rowsets", "m") >= 12
        assert _total(lc, "nyala_memrowset_rows", "m") == 0

        assert table.scan().to_arrow().num_rows == rows
        assert _total(lc, "nyala_rows_scanned_total", "m") == rows  # leaders only served it
        leaders = sum(
            value
            for ts in lc.mini.tservers
            for metric, _, value in _scrape(ts.http_addr)
            if metric == "nyala_leaders"
        )
        assert leaders == 4
    # Within a few heartbeats of the last acknowledged write (polling included).
    assert seen_s < 10 * HEARTBEAT_S + 1.0, seen_s


def test_statistics_of_a_missing_table_is_a_json_error() -> None:
    with LocalCluster(1, 1, master_flags=fast_master_flags(), tserver_flags=TSERVER_FLAGS) as lc:
        result = CliRunner(env={"NYALA_MASTERS": lc.masters}).invoke(
            main, ["table", "statistics", "nope", "--format", "json"], catch_exceptions=False
        )
    assert result.exit_code == 1
    assert json.loads(result.stderr)["error"] == "NotFoundError"
