"""Re-replication benchmark: time from killing a tserver to every tablet at full voter count.

One master and four tservers on loopback; a table of ``--tablets`` tablets, three replicas
each, loaded with ``--rows`` rows of ``--row-bytes`` random bytes through the tablet leaders.
Then, ``--runs`` times: the tserver hosting the most replicas is killed (SIGKILL) and the clock
runs until every tablet's leader reports a committed config of three voters without it
(``seconds_to_full_replication``); the killed tserver is restarted (its stale replicas are
tombstoned) before the next run. The failure timeout
(``follower_unavailable_considered_failed_sec``) is part of that time by design, so it is
printed beside it, with ``seconds_after_detection`` = the figure minus the timeout.

Then, in a second cluster whose failure timeout is far longer than the bench (so nothing is
replaced because it timed out): ``--runs`` times, a follower's tserver is stopped, the
superblock of one tablet it hosts is damaged, and the tserver restarted; that tablet comes up
FAILED there while the server heartbeats normally. The clock runs from the moment the
restarted server listens until the tablet has three voters without it
(``seconds_to_replace_failed_replica``: the leader reports the peer FAILED_UNRECOVERABLE, the
master adds a replacement, copy, promote, evict).

Then, in the first cluster, a hot tablet (issue 31): a one-tablet table written by writer
threads at 50k rows/s or more all along; a follower's tserver is killed and the clock runs until
the tablet has three voters again (``hot_seconds_to_full_replication``), with the writers' rate
during that time (``hot_writer_rows_per_s``) and whether the replacement's tablet copy
succeeded on its first attempt (``hot_first_try``: one copy job, SUCCEEDED). The new replica's
copy fetches the leader's active WAL segment while it grows.

Baseline, in the same run and cluster: one explicit ``move_replica`` of one tablet of the same
data (add a NON_VOTER, copy, promote, evict: the replacement work without the failure
detection), timed through the client.

The last line printed is one JSON object with the medians over the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import threading
import time
from typing import Any

import pyarrow as pa

import nyala
from nyala._proto import tablet_copy_pb2
from nyala.errors import NyalaError
from nyala.rpc import split_host_port
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster
from nyala.testing import master_ops as ops
from nyala.testing.mini_cluster import ServerProcess, corrupt_file
from nyala.testing.replica_ops import committed_config, voters
from nyala.testing.tablet_ops import write_to_leader

SCHEMA = Schema([Column("id", "int64"), Column("blob", "binary")], ["id"])
RAFT = ["--heartbeat-interval-ms", "100", "--leader-failure-max-missed-heartbeat-periods", "3"]


#: The failure timeout of the FAILED-replica cluster: nothing there may time out.
NEVER_FAILED_S = 3600
#: The hot tablet's writers: rows per write, threads, bytes per row's blob.
HOT_BATCH_ROWS = 5000
HOT_WRITERS = 2
HOT_ROW_BYTES = 16
HOT_ROWS_PER_S_MIN = 50_000


def _master_flags(failed_after_s: int) -> list[str]:
    return [
        *RAFT,
        "--background-task-interval-ms",
        "100",
        "--background-rpc-retry-ms",
        "500",
        "--tserver-unresponsive-timeout-ms",
        str(failed_after_s * 1000),
        "--follower-unavailable-considered-failed-sec",
        str(failed_after_s),
    ]


def _load(cluster: MiniCluster, tablet_ids: list[str], rows: int, row_bytes: int) -> int:
    per_write = max(1, (1 << 20) // row_bytes)
    written, seq = 0, 0
    for t, tablet_id in enumerate(tablet_ids):
        for start in range(0, rows // len(tablet_ids), per_write):
            count = min(per_write, rows // len(tablet_ids) - start)
            data = {
                "id": pa.array(range(t * 10**9 + start, t * 10**9 + start + count), pa.int64()),
                "blob": pa.array([os.urandom(row_bytes) for _ in range(count)], pa.binary()),
            }
            write_to_leader(
                cluster, tablet_id, SCHEMA, data, op="insert", client_id="b", seq_no=seq
            )
            seq += 1
            written += count * row_bytes
    return written


def _full_without(cluster: MiniCluster, tablet_ids: list[str], dead: str) -> bool:
    for tablet_id in tablet_ids:
        try:
            leader = cluster.leader_of(tablet_id, timeout_s=1)
        except NyalaError:
            return False
        config = committed_config(leader, tablet_id)
        members = voters(config)
        if config is None or len(members) != 3 or dead in members or len(config.peers) != 3:
            return False
    return True


def _hosting(cluster: MiniCluster, tablet_ids: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for tablet_id in tablet_ids:
        for uuid in voters(committed_config(cluster.leader_of(tablet_id), tablet_id)):
            counts[uuid] = counts.get(uuid, 0) + 1
    return counts


def _one_failure(cluster: MiniCluster, tablet_ids: list[str]) -> float:
    counts = _hosting(cluster, tablet_ids)
    victim_uuid = max(counts, key=lambda u: counts[u])
    victim = next(ts for ts in cluster.tservers if ts.uuid == victim_uuid)
    start = time.monotonic()
    victim.kill()
    while not _full_without(cluster, tablet_ids, victim_uuid):
        time.sleep(0.05)
    elapsed = time.monotonic() - start
    victim.restart()
    return elapsed


def _one_move(cluster: MiniCluster, tablet_id: str) -> float:
    members = voters(committed_config(cluster.leader_of(tablet_id), tablet_id))
    leader = cluster.leader_of(tablet_id).uuid
    spare = next(str(ts.uuid) for ts in cluster.tservers if ts.uuid not in members)
    source = next(u for u in members if u != leader)
    with nyala.connect(",".join(cluster.master_addrs)) as client:
        start = time.monotonic()
        client.admin.move_replica(tablet_id, source, spare, timeout_s=120)
        return time.monotonic() - start


def _one_failed_replica(cluster: MiniCluster, tablet_id: str) -> float:
    leader = cluster.leader_of(tablet_id)
    members = voters(committed_config(leader, tablet_id))
    victim = next(ts for ts in cluster.tservers if ts.uuid in members - {leader.uuid})
    victim.kill()
    corrupt_file(victim.fs_root / "tablet-meta" / tablet_id)
    victim.start()
    start = _listening(victim.rpc_addr)
    victim.wait_ready()
    while not _full_without(cluster, [tablet_id], str(victim.uuid)):
        time.sleep(0.05)
    return time.monotonic() - start


class _HotWriters:
    """Threads inserting ``HOT_BATCH_ROWS``-row batches into one tablet until stopped."""

    def __init__(self, cluster: MiniCluster, tablet_id: str) -> None:
        self._cluster = cluster
        self._tablet_id = tablet_id
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.rows = 0
        self._threads = [
            threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(HOT_WRITERS)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _run(self, n: int) -> None:
        blob = os.urandom(HOT_ROW_BYTES)
        next_id, seq = n * 10**12, 0
        while not self._stop.is_set():
            ids = pa.array(range(next_id, next_id + HOT_BATCH_ROWS), pa.int64())
            data = {"id": ids, "blob": pa.array([blob] * HOT_BATCH_ROWS, pa.binary())}
            write_to_leader(
                self._cluster,
                self._tablet_id,
                SCHEMA,
                data,
                op="insert",
                client_id=f"hot{n}",
                seq_no=seq,
            )
            next_id += HOT_BATCH_ROWS
            seq += 1
            with self._lock:
                self.rows += HOT_BATCH_ROWS


def _copy_states(ts: ServerProcess, tablet_id: str) -> list[str]:
    with ts.proxy() as proxy:
        response = proxy.call(
            proxy.tablet_copy.ListTabletCopies, tablet_copy_pb2.ListTabletCopiesRequestPB()
        )
    return [j.state for j in response.jobs if j.tablet_id == tablet_id]


def _hot_rereplication(cluster: MiniCluster) -> tuple[float, float, bool]:
    """(seconds to three voters again, writers' rows/s meanwhile, copy's first try)."""
    ops.call(cluster, "CreateTable", ops.create_table_request("hot", SCHEMA))
    ops.wait_create_done(cluster, "hot")
    [tablet_id] = [t.tablet_id for t in ops.locations(cluster, "hot")]
    writers = _HotWriters(cluster, tablet_id)
    writers.start()
    try:
        time.sleep(2.0)  # the writers at full speed, the WAL's active segment growing
        leader = cluster.leader_of(tablet_id)
        members = voters(committed_config(leader, tablet_id))
        victim = next(ts for ts in cluster.tservers if ts.uuid in members - {leader.uuid})
        rows, start = writers.rows, time.monotonic()
        victim.kill()
        while not _full_without(cluster, [tablet_id], str(victim.uuid)):
            time.sleep(0.05)
        elapsed = time.monotonic() - start
        rows = writers.rows - rows
    finally:
        writers.stop()
    after = voters(committed_config(cluster.leader_of(tablet_id), tablet_id))
    newcomer = next(ts for ts in cluster.tservers if ts.uuid in after - members)
    first_try = _copy_states(newcomer, tablet_id) == ["SUCCEEDED"]
    victim.restart()
    return elapsed, rows / elapsed, first_try


def _listening(addr: str) -> float:
    """When ``addr`` accepts connections (raw TCP: a gRPC channel's reconnect back-off would
    see it up to a second late)."""
    host, port = split_host_port(addr)
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return time.monotonic()
        except OSError:
            time.sleep(0.01)


def _failed_replicas(args: argparse.Namespace) -> list[float]:
    """The second cluster: one damaged replica per run, each of another tablet."""
    out: list[float] = []
    never = str(NEVER_FAILED_S)
    with MiniCluster(
        4,
        num_masters=1,
        master_flags=_master_flags(NEVER_FAILED_S),
        tserver_flags=[
            *RAFT,
            "--master-heartbeat-interval-ms",
            "200",
            "--follower-unavailable-considered-failed-sec",
            never,
        ],
    ) as cluster:
        request = ops.create_table_request("failed", SCHEMA, buckets=args.runs)
        ops.call(cluster, "CreateTable", request)
        ops.wait_create_done(cluster, "failed")
        tablet_ids = [t.tablet_id for t in ops.locations(cluster, "failed")]
        # The same data per tablet as the first cluster's tablets.
        _load(cluster, tablet_ids, args.rows * len(tablet_ids) // args.tablets, args.row_bytes)
        for run, tablet_id in enumerate(tablet_ids):
            out.append(_one_failed_replica(cluster, tablet_id))
            print(f"run {run}: FAILED replica replaced {out[-1]:.1f} s after restart", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small data, 2 runs (< 2 min)")
    parser.add_argument("--tablets", type=int, default=4)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--row-bytes", type=int, default=16 << 10)
    parser.add_argument("--failed-after-s", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if args.quick:
        args.rows, args.runs, args.tablets = 1024, 2, 3
    failures: list[float] = []
    moves: list[float] = []
    with MiniCluster(
        4,
        num_masters=1,
        master_flags=_master_flags(args.failed_after_s),
        tserver_flags=[*RAFT, "--master-heartbeat-interval-ms", "200"],
    ) as cluster:
        request = ops.create_table_request("bench", SCHEMA, buckets=args.tablets)
        ops.call(cluster, "CreateTable", request)
        ops.wait_create_done(cluster, "bench")
        tablet_ids = [t.tablet_id for t in ops.locations(cluster, "bench")]
        data_bytes = _load(cluster, tablet_ids, args.rows, args.row_bytes)
        for run in range(args.runs):
            moves.append(_one_move(cluster, tablet_ids[run % len(tablet_ids)]))
            failures.append(_one_failure(cluster, tablet_ids))
            print(
                f"run {run}: full replication {failures[-1]:.1f} s after the kill "
                f"(timeout {args.failed_after_s} s); one move {moves[-1]:.1f} s",
                flush=True,
            )
        hot_s, hot_rows_s, hot_first_try = _hot_rereplication(cluster)
        print(
            f"hot tablet: full replication {hot_s:.1f} s after the kill, writers at "
            f"{hot_rows_s:.0f} rows/s meanwhile (at least {HOT_ROWS_PER_S_MIN} wanted), copy "
            f"{'succeeded on its first try' if hot_first_try else 'FAILED its first try'}",
            flush=True,
        )
    replaced = _failed_replicas(args)
    figure: dict[str, Any] = {
        "bench": "rereplication",
        "seconds_to_full_replication": round(statistics.median(failures), 2),
        "failure_timeout_s": args.failed_after_s,
        "seconds_after_detection": round(statistics.median(failures) - args.failed_after_s, 2),
        "seconds_to_replace_failed_replica": round(statistics.median(replaced), 2),
        "baseline_move_replica_s": round(statistics.median(moves), 2),
        "hot_seconds_to_full_replication": round(hot_s, 2),
        "hot_writer_rows_per_s": round(hot_rows_s),
        "hot_first_try": hot_first_try,
        "data_bytes": data_bytes,
        "tablets": len(tablet_ids),
        "runs": args.runs,
    }
    print(json.dumps(figure))


if __name__ == "__main__":
    main()
