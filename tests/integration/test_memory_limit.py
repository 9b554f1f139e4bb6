"""A tablet server's memory limit on real processes (issue 30, item 3): a load several times
the limit goes through (MemRowSets flushed under pressure, writes refused above the soft limit
and retried by the client), no acknowledged row is lost, and /metrics shows the tracked
memory and the refusals."""

from __future__ import annotations

import urllib.request

import numpy as np
import pyarrow as pa

import nyala
from nyala.common.process import default_memory_limit_bytes
from nyala.testing import MiniCluster, logs_on_failure

SCHEMA = nyala.Schema.parse("id:int64, a:int64, s:string", key=["id"])
# An idle tserver's own ~110 MiB counts against the limit (nyala.tserver.memory): soft limit
# 128 MiB, flushes from 96 MiB, so every measurement flushes and writes are refused whenever the
# MemRowSets hold something while the process is above 128 MiB.
LIMIT_BYTES = 160 << 20
ROWS = 1_200_000  # about 60 MB of op batches per replica
BATCH_ROWS = 100_000


def _metrics(cluster: MiniCluster) -> list[str]:
    lines = []
    for server in cluster.tservers:
        url = f"http://{server.http_addr}/metrics"
        lines += urllib.request.urlopen(url, timeout=30).read().decode().splitlines()
    return lines


def _sum(lines: list[str], prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(prefix))


def test_a_load_over_the_memory_limit_is_flushed_refused_retried_and_kept() -> None:
    flags = [
        "--memory-limit-bytes",
        str(LIMIT_BYTES),
        # Measured seldom, so the writes admitted in between reach the soft limit even on a
        # slow machine (each server holds a replica of every tablet: about 50 MB in all).
        "--memory-pressure-check-interval-ms",
        "2000",
    ]
    with (
        logs_on_failure(MiniCluster(3, num_masters=1, tserver_flags=flags)) as cluster,
        nyala.connect(cluster.master_addrs, timeout_ms=120_000) as client,
    ):
        table = client.create_table(
            "mem", SCHEMA, partitioning=nyala.HashPartitioning(["id"], buckets=2), replicas=3
        )
        for start in range(0, ROWS, BATCH_ROWS):
            ids = np.arange(start, start + BATCH_ROWS, dtype=np.int64)
            rows = pa.table(
                {"id": ids, "a": ids * 3, "s": pa.array(np.char.add("x" * 20, ids.astype(str)))}
            )
            result = table.insert(rows)
            assert result.ok, (result.row_errors[:3], result.unknown[:3])
        ids = pa.concat_arrays(
            [b.column(0) for b in table.scan(columns=["id"]).to_reader()]
        ).to_numpy()
        assert len(ids) == ROWS
        assert np.array_equal(np.sort(ids), np.arange(ROWS))
        lines = _metrics(cluster)
    assert _sum(lines, "nyala_writes_refused_memory_total") > 0
    assert _sum(lines, 'nyala_memory_limit_bytes{threshold="hard"}') == 3 * LIMIT_BYTES
    assert any(line.startswith('nyala_memory_tracked_bytes{kind="MemRowSet"}') for line in lines)
    # 160 MiB with pressure at 60 %: the key block cache gets a quarter of 96 MiB, not 256 MiB.
    assert _sum(lines, "nyala_key_block_cache_capacity_bytes") == 3 * (LIMIT_BYTES * 60 // 100 // 4)
    assert _sum(lines, "nyala_flushes_total{") > 0  # flushed under pressure


def test_the_servers_of_a_mini_cluster_share_the_machines_memory() -> None:
    """Each tablet server of a MiniCluster gets an equal share of the default limit (80 % of
    the machine), unless its flags name one: together they stay within the machine."""
    share = default_memory_limit_bytes() // 3
    own = [[], [], ["--memory-limit-bytes", str(10**9)]]
    with logs_on_failure(MiniCluster(3, num_masters=1, each_tserver_flags=own)) as cluster:
        limits = []
        for server in cluster.tservers:
            url = f"http://{server.http_addr}/metrics"
            lines = urllib.request.urlopen(url, timeout=30).read().decode().splitlines()
            limits.append(_sum(lines, 'nyala_memory_limit_bytes{threshold="hard"}'))
    assert limits == [share, share, 10**9]
