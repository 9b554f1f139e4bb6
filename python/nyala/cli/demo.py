"""The main job (``make demo``): a local cluster under a real workload, through the client.

It starts a local cluster (1 master, 3 tservers), creates a table with 4 hash buckets
replicated 3 ways, loads 1M rows through ``nyala.connect``, SIGKILLs the tablet server that
leads the most tablets while writing and reading continue, shows the new leaders and the dead
server, restarts it, waits until every replica of every tablet has caught up, and checks that
every acknowledged row is there exactly once. It prints what it proved, one line per step, and
exits non-zero if any check fails.
"""

from __future__ import annotations

import argparse
import collections
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

import nyala
from nyala._proto import consensus_pb2
from nyala.cli.output import render_table
from nyala.local_cluster import LocalCluster
from nyala.testing.mini_cluster import ServerProcess

SCHEMA = nyala.Schema.parse("id:int64, name:string?, value:double, ts:timestamp", key=["id"])
CATCH_UP_TIMEOUT_S = 120.0
# The master's tablet list must name the new leaders within one tserver heartbeat interval
# (1 s by default) of the writes that prove they lead: tservers report an election at once.
LEADER_VIEW_TIMEOUT_S = 1.0
FAST_RAFT = ["--heartbeat-interval-ms", "200"]


def rows(first: int, count: int) -> pa.Table:
    ids = np.arange(first, first + count, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "name": pa.array(np.char.add("row-", ids.astype(str))),
            "value": ids.astype(np.float64) * 0.5,
            "ts": pa.array(ids * 1_000, type=pa.timestamp("us")),
        }
    )


class Workload:
    """Writes consecutive ids in batches and remembers how far writes were acknowledged."""

    def __init__(self, table: nyala.Table, batch_rows: int) -> None:
        self.table = table
        self.batch_rows = batch_rows
        self.acknowledged = 0  # rows [0, acknowledged) were acknowledged

    def load(self, count: int) -> float:
        """Inserts the next ``count`` rows; returns rows/s. INSERT, so a retry that applied
        twice would come back as an ALREADY_PRESENT row error and stop the demo."""
        start = time.perf_counter()
        end = self.acknowledged + count
        while self.acknowledged < end:
            n = min(self.batch_rows, end - self.acknowledged)
            result = self.table.insert(rows(self.acknowledged, n), timeout_ms=60_000)
            if not result.ok:
                raise SystemExit(f"demo: row errors: {result.row_errors[:3]}")
            self.acknowledged += n
        return count / (time.perf_counter() - start)

    def verify(self) -> int:
        """Scans every row and checks them against what was acknowledged."""
        got = self.table.scan().to_arrow().sort_by("id")
        expected = rows(0, self.acknowledged)
        if got.num_rows != expected.num_rows:
            raise SystemExit(f"demo: {got.num_rows:,} rows read, {expected.num_rows:,} acked")
        if not got.cast(expected.schema).equals(expected):
            raise SystemExit("demo: rows read differ from the rows acknowledged")
        return int(got.num_rows)


def _leaders(client: nyala.Client) -> collections.Counter[str]:
    return collections.Counter(t["leader"] for t in client.admin.list_tablets("demo"))


def _live_leader_view(client: nyala.Client, dead_uuid: str) -> list[dict[str, object]]:
    """The master's tablet list once it names a leader for every tablet and none on the dead
    server; ``SystemExit`` after ``LEADER_VIEW_TIMEOUT_S``."""
    deadline = time.perf_counter() + LEADER_VIEW_TIMEOUT_S
    while True:
        tablets = client.admin.list_tablets("demo")
        stale = [t["tablet_id"] for t in tablets if t["leader"] in ("", None, dead_uuid)]
        if not stale:
            return tablets
        if time.perf_counter() > deadline:
            raise SystemExit(f"demo: the master still names no live leader for {stale}")
        time.sleep(0.05)


def _unresponsive_view(client: nyala.Client, dead_uuid: str) -> list[dict[str, object]]:
    """The master's tablet server list once it shows the dead server as not LIVE (1.5
    heartbeat intervals after its last heartbeat); ``SystemExit`` after 3 s."""
    deadline = time.perf_counter() + 3.0
    while True:
        servers = client.list_tablet_servers()
        if all(s["state"] != "LIVE" for s in servers if s["uuid"] == dead_uuid):
            return servers
        if time.perf_counter() > deadline:
            raise SystemExit(f"demo: the master still calls the killed {dead_uuid} LIVE")
        time.sleep(0.05)


def _committed(ts: ServerProcess, tablet_ids: list[str]) -> dict[str, int]:
    request = consensus_pb2.GetConsensusStateRequestPB(
        dest_uuid=ts.uuid or "", tablet_ids=tablet_ids
    )
    with ts.proxy() as proxy:
        response = proxy.call(proxy.consensus.GetConsensusState, request)
    return {t.tablet_id: int(t.committed_index) for t in response.tablets}


def _wait_caught_up(cluster: LocalCluster, victim: ServerProcess, tablet_ids: list[str]) -> float:
    start = time.perf_counter()
    while True:
        others = [ts for ts in cluster.mini.tservers if ts is not victim]
        target = {t: max(_committed(ts, [t]).get(t, 0) for ts in others) for t in tablet_ids}
        try:
            mine = _committed(victim, tablet_ids)
        except nyala.errors.NyalaError:
            mine = {}
        if all(mine.get(t, -1) >= target[t] for t in tablet_ids):
            return time.perf_counter() - start
        if time.perf_counter() - start > CATCH_UP_TIMEOUT_S:
            raise SystemExit(f"demo: {victim.name} did not catch up in {CATCH_UP_TIMEOUT_S} s")
        time.sleep(0.2)


def _ksck(cluster: LocalCluster) -> list[str]:
    from nyala.client import ksck

    _, findings = ksck.run(cluster.masters.split(","))
    return [f"{f.kind} {f.subject[:8]}: {f.problem}" for f in findings]


def _wait_healthy(cluster: LocalCluster) -> float:
    start = time.perf_counter()
    while findings := _ksck(cluster):
        if time.perf_counter() - start > CATCH_UP_TIMEOUT_S:
            raise SystemExit(f"demo: ksck still finds {findings}")
        time.sleep(0.5)
    return time.perf_counter() - start


def _read_while(table: nyala.Table, stop: threading.Event, counts: list[int]) -> None:
    while not stop.is_set():
        counts.append(table.count(where=[("id", "<", 1000)]))


def run(total_rows: int, batch_rows: int, base_dir: Path | None) -> None:
    """The whole demo; raises ``SystemExit`` with a message on the first failed check."""
    flags = FAST_RAFT
    with LocalCluster(1, 3, base_dir, master_flags=flags, tserver_flags=flags) as cluster:
        client = cluster.client
        print(f"started 1 master and 3 tservers under {cluster.path}; masters={cluster.masters}")
        table = client.create_table(
            "demo", SCHEMA, partitioning=nyala.HashPartitioning("id", 4), replicas=3
        )
        tablet_ids = [t.tablet_id for t in table.tablets()]
        print(f"created table demo: {len(tablet_ids)} tablets (HASH(id) 4), each on 3 tservers")
        work = Workload(table, batch_rows)
        rate = work.load(total_rows)
        print(f"loaded {total_rows:,} rows through the client at {rate:,.0f} rows/s")
        print(f"verified {work.verify():,} rows read back")
        uuid, led = _leaders(client).most_common(1)[0]
        victim = next(ts for ts in cluster.mini.tservers if ts.uuid == uuid)
        stop = threading.Event()
        counts: list[int] = []
        reader = threading.Thread(target=_read_while, args=(table, stop, counts))
        reader.start()
        victim.kill()
        print(f"SIGKILLed {victim.name}, leader of {led} of {len(tablet_ids)} tablets")
        failover_start = time.perf_counter()
        work.load(batch_rows)
        print(
            f"writes continued: first batch after the kill acked in "
            f"{time.perf_counter() - failover_start:.2f} s"
        )
        work.load(total_rows // 10)
        stop.set()
        reader.join()
        if not counts or any(c != 1000 for c in counts):
            raise SystemExit(f"demo: reads during the failover saw {set(counts)} rows, not 1000")
        print(f"reads continued: {len(counts)} scans during the failover, each saw all 1000 rows")
        view = _live_leader_view(client, victim.uuid or "")
        print(render_table(view, ["tablet_id", "partition", "leader"]))
        columns = ["uuid", "rpc_addr", "state", "seconds_since_heartbeat"]
        print(render_table(_unresponsive_view(client, victim.uuid or ""), columns))
        findings = _ksck(cluster)
        print(f"ksck with {victim.name} dead: {len(findings)} finding(s), e.g. {findings[0][:90]}")
        print(f"verified {work.verify():,} rows with one of three tservers dead")
        victim.restart()
        caught_up_s = _wait_caught_up(cluster, victim, tablet_ids)
        print(
            f"restarted {victim.name}; all {len(tablet_ids)} of its replicas caught up "
            f"in {caught_up_s:.2f} s (replication factor 3 again)"
        )
        healthy_s = _wait_healthy(cluster)
        print(f"ksck: healthy {healthy_s:.1f} s after the replicas caught up")
        print(f"verified {work.verify():,} rows: nothing acknowledged was lost or duplicated")
    print("demo OK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-rows", type=int, default=100_000)
    parser.add_argument("--dir", type=Path, default=None, help="keep the cluster's files here")
    args = parser.parse_args()
    run(args.rows, args.batch_rows, args.dir)


if __name__ == "__main__":
    main()
