"""Many threads of one client writing single rows (coalesced by the client's write pipe into
shared ``WriteMulti`` calls) while the tablet leader is killed: no acknowledged row is lost and
none is applied twice. Real processes: one master, three tservers."""

from __future__ import annotations

import threading
import time

import pytest

import nyala
from nyala.testing import MiniCluster, dump_logs
from nyala.testing.mini_cluster import FAST_TSERVER_FLAGS, fast_master_flags

MASTER_FLAGS = fast_master_flags()
TSERVER_FLAGS = FAST_TSERVER_FLAGS
SCHEMA = nyala.Schema.parse("id:int64, name:string", key=["id"])
WRITERS = 32
BEFORE_KILL_S = 2.0
AFTER_KILL_S = 4.0


@pytest.mark.slow
def test_coalesced_single_row_writes_survive_a_leader_kill() -> None:
    with (
        MiniCluster(
            3, num_masters=1, master_flags=MASTER_FLAGS, tserver_flags=TSERVER_FLAGS
        ) as cluster,
        nyala.connect(cluster.master_addrs, timeout_ms=30_000) as client,
    ):
        try:
            _run(cluster, client)
        except BaseException:
            dump_logs(cluster)
            raise


def _run(cluster: MiniCluster, client: nyala.Client) -> None:
    table = client.create_table("pipe_failover", SCHEMA, replicas=3)
    acked: list[list[int]] = [[] for _ in range(WRITERS)]
    unknown: list[int] = []  # writes whose outcome the client could not learn
    failures: list[BaseException] = []
    stop = threading.Event()

    def writer(k: int) -> None:
        key = k
        while not stop.is_set():
            try:
                # INSERT: a write applied twice would answer ALREADY_PRESENT, a row error.
                result = table.insert({"id": [key], "name": [f"row-{key}"]}, timeout_ms=30_000)
            except nyala.errors.TimedOutError:
                unknown.append(key)
            except BaseException as exc:
                failures.append(exc)
                return
            else:
                if not result.ok:
                    failures.append(AssertionError(f"row {key}: {result.row_errors}"))
                    return
                acked[k].append(key)
            key += WRITERS

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(WRITERS)]
    for t in threads:
        t.start()
    try:
        time.sleep(BEFORE_KILL_S)
        tablet_id = table.tablets()[0].tablet_id
        victim = cluster.leader_of(tablet_id)
        acked_at_kill = sum(len(a) for a in acked)
        victim.kill()
        time.sleep(AFTER_KILL_S)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not failures, failures[:3]
    acknowledged = sorted(k for per in acked for k in per)
    assert acked_at_kill > 0
    assert len(acknowledged) > acked_at_kill, "no write was acknowledged after the kill"
    # Writes from many threads really shared calls.
    pipes = client._writer._pipes.values()
    assert sum(p.writes_sent for p in pipes) > 2 * sum(p.calls_sent for p in pipes)

    victim.restart()
    rows = table.scan().to_arrow()
    ids = rows.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "a key is stored twice"
    stored = set(ids)
    assert not set(acknowledged) - stored, "acknowledged rows are missing"
    # Everything stored was either acknowledged or its outcome is unknown to the writer.
    assert stored <= set(acknowledged) | set(unknown)
    names = dict(zip(ids, rows.column("name").to_pylist(), strict=True))
    assert all(names[k] == f"row-{k}" for k in acknowledged)
