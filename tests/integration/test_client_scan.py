"""Scans against a real cluster (1 master, 3 tservers on loopback): follower reads within a
staleness bound, their refusal by a follower cut off from its leader, the fallback to another
replica, read-your-writes through the leader, and resuming after the last key (issue 11 item 4).

Tablet leaders here are declared dead after 30 missed 100 ms heartbeats (3 s and more), so a
follower whose leader is frozen stays without a leader well past a 300 ms staleness bound.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest

import nyala
from nyala.testing import MiniCluster, ServerProcess, logs_on_failure

RAFT_FLAGS = ["--heartbeat-interval-ms", "100", "--leader-failure-max-missed-heartbeat-periods"]
MASTER_FLAGS = [*RAFT_FLAGS, "3", "--background-task-interval-ms", "100"]
TSERVER_FLAGS = [*RAFT_FLAGS, "30", "--master-heartbeat-interval-ms", "200"]

SCHEMA = nyala.Schema.parse("id:int64, name:string?, v:double?", key=["id"])
COMPOSITE = nyala.Schema.parse("a:int64, b:string, v:double?", key=["a", "b"])


@pytest.fixture(scope="module")
def cluster() -> Iterator[MiniCluster]:
    with logs_on_failure(
        MiniCluster(3, num_masters=1, master_flags=MASTER_FLAGS, tserver_flags=TSERVER_FLAGS)
    ) as mini:
        yield mini


@pytest.fixture
def client(cluster: MiniCluster) -> Iterator[nyala.Client]:
    with nyala.connect(cluster.master_addrs, timeout_ms=60_000) as c:
        yield c


def rows(start: int, count: int) -> pa.Table:
    ids = np.arange(start, start + count, dtype=np.int64)
    return pa.table(
        {"id": ids, "name": pa.array([f"n{i}" for i in ids]), "v": ids.astype(np.float64) / 2}
    )


def metrics(ts: ServerProcess) -> str:
    with urllib.request.urlopen(f"http://{ts.http_addr}/metrics", timeout=5) as page:
        return str(page.read().decode())


def scans(ts: ServerProcess, code: str) -> int:
    """Scan calls the server answered with ``code`` (from its /metrics page)."""
    pattern = rf'^nyala_rpc_requests_total\{{method="Scan",code="{code}"\}} (\d+)$'
    match = re.search(pattern, metrics(ts), re.MULTILINE)
    return 0 if match is None else int(match.group(1))


def applied_index(ts: ServerProcess, tablet_id: str) -> int:
    pattern = rf'^nyala_tablet_last_applied_index\{{tablet_id="{tablet_id}"\}} (\d+)$'
    match = re.search(pattern, metrics(ts), re.MULTILINE)
    return -1 if match is None else int(match.group(1))


def by_uuid(cluster: MiniCluster, uuid: str) -> ServerProcess:
    return next(ts for ts in cluster.tservers if ts.uuid == uuid)


def wait_all_applied(
    cluster: MiniCluster, table: nyala.Table, expected: list[int] | None = None
) -> None:
    """Waits until every replica applied all the leader has (a follower read may legitimately
    lag by up to its bound), checking meanwhile that follower reads show only ``expected``
    ids."""
    tablet_id = table.tablets()[0].tablet_id
    target = applied_index(cluster.leader_of(tablet_id), tablet_id)
    deadline = time.monotonic() + 20
    while True:
        if expected is not None:
            scan = table.scan(columns=["id"], replica="follower", max_staleness_ms=2_000)
            assert set(scan.to_arrow().column(0).to_pylist()) <= set(expected)
        if all(applied_index(ts, tablet_id) >= target for ts in cluster.tservers):
            return
        assert time.monotonic() < deadline, "the followers did not catch up"
        time.sleep(0.1)


def test_a_follower_serves_a_scan_within_the_staleness_bound(
    cluster: MiniCluster, client: nyala.Client
) -> None:
    table = client.create_table("followerscan", SCHEMA, replicas=3)
    assert table.insert(rows(0, 3000)).ok
    tablet_id = table.tablets()[0].tablet_id
    leader = cluster.leader_of(tablet_id)
    wait_all_applied(cluster, table, list(range(3000)))
    before = {ts.uuid: scans(ts, "OK") for ts in cluster.tservers}
    scan = table.scan(replica="follower", max_staleness_ms=2_000, where=[("id", ">=", 2990)])
    got = scan.to_arrow()
    assert got.column("id").to_pylist() == list(range(2990, 3000))
    assert got.column("name").to_pylist() == [f"n{i}" for i in range(2990, 3000)]
    server = by_uuid(cluster, scan.served_by[tablet_id])
    assert server is not leader
    assert scans(server, "OK") == before[server.uuid] + 1  # the follower answered it
    assert scans(leader, "OK") == before[leader.uuid]
    # "any" and "closest" may land on the leader or a follower; both give every row.
    for replica in ("any", "closest"):
        assert table.scan(replica=replica, columns=["id"]).count() == 3000


def test_rows_written_before_a_leader_scan_are_always_seen(client: nyala.Client) -> None:
    table = client.create_table("readyourwrites", SCHEMA, replicas=3)
    acked: list[int] = []
    for start in range(0, 2000, 100):
        assert table.insert(rows(start, 100)).ok
        acked.extend(range(start, start + 100))
        got = table.scan(columns=["id"], replica="leader").to_arrow().column("id").to_pylist()
        assert got == acked


def test_a_cut_off_follower_refuses_and_the_scan_reads_elsewhere(
    cluster: MiniCluster, client: nyala.Client
) -> None:
    table = client.create_table("cutoff", SCHEMA, replicas=3)
    assert table.insert(rows(0, 2000)).ok
    tablet_id = table.tablets()[0].tablet_id
    wait_all_applied(cluster, table, list(range(2000)))
    leader = cluster.leader_of(tablet_id)
    followers = [ts for ts in cluster.tservers if ts is not leader]
    refused = {ts.uuid: scans(ts, "SERVICE_UNAVAILABLE") for ts in followers}
    leader.pause()
    try:
        time.sleep(1.0)  # over the 300 ms bound, well before the followers elect a leader
        started = time.monotonic()
        scan = table.scan(
            columns=["id"], replica="follower", max_staleness_ms=300, attempt_timeout_ms=1_500
        )
        got = scan.to_arrow().column("id").to_pylist()
        assert got == list(range(2000))
        # Both followers refused first (stale); the frozen leader did not answer in time; the
        # rows came from the leader the followers elected meanwhile.
        for ts in followers:
            assert scans(ts, "SERVICE_UNAVAILABLE") > refused[ts.uuid], ts.name
        assert scan.served_by[tablet_id] in {ts.uuid for ts in followers}
        assert time.monotonic() - started < 30
    finally:
        leader.resume()


def test_a_follower_scan_resumes_after_the_last_key_on_another_replica(
    cluster: MiniCluster, client: nyala.Client
) -> None:
    table = client.create_table("resumekeys", COMPOSITE, replicas=3)
    a = np.repeat(np.arange(400, dtype=np.int64), 5)
    b = np.tile(np.array(["p", "q", "r", "s", "t"]), 400)
    assert table.insert({"a": a, "b": b, "v": np.ones(2000)}).ok
    tablet_id = table.tablets()[0].tablet_id
    leader = cluster.leader_of(tablet_id)
    wait_all_applied(cluster, table)
    seen: list[tuple[int, str]] = []
    scan = table.scan(
        columns=["b", "a"],
        replica="follower",
        max_staleness_ms=2_000,
        batch_size_bytes=2 * 1024,
        page_batches=1,
    )
    victim: ServerProcess | None = None
    try:
        for i, batch in enumerate(scan):
            a_b = zip(batch.column("a").to_pylist(), batch.column("b").to_pylist(), strict=True)
            seen.extend(a_b)
            if i == 1:
                victim = by_uuid(cluster, scan.served_by[tablet_id])
                assert victim is not leader
                victim.kill()
        assert seen == list(zip(a.tolist(), b.tolist(), strict=True))  # each row once, in order
        assert scan.served_by[tablet_id] != victim.uuid  # type: ignore[union-attr]
    finally:
        if victim is not None:
            victim.restart()
