"""The main job (``make demo``): a local 3-tserver cluster under a real workload.

It loads rows into a replicated tablet, SIGKILLs the tablet leader in the middle of the
workload, keeps writing and reading through the new leader, restarts the victim, waits for it
to catch up, and checks that every acknowledged row is there exactly once. It prints what it
proved, one line per step, and exits non-zero if any check fails.

Until the master and the client exist (issues 9 and 11) the demo places the tablet itself, as
the master will (``MiniCluster.create_tablet``), and writes through ``nyala.testing.tablet_ops``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from nyala._proto import consensus_pb2
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster
from nyala.testing.mini_cluster import ServerProcess
from nyala.testing.tablet_ops import scan, write_to_leader

TABLET = "d" * 32
SCHEMA = Schema(
    [
        Column("id", "int64"),
        Column("name", "string", nullable=True),
        Column("value", "double"),
        Column("ts", "timestamp"),
    ],
    ["id"],
)
CLIENT_ID = "nyala-demo"
CATCH_UP_TIMEOUT_S = 120.0


def _rows(first: int, count: int) -> dict[str, object]:
    ids = np.arange(first, first + count, dtype=np.int64)
    return {
        "id": ids,
        "name": pa.array([f"row-{i}" for i in range(first, first + count)]),
        "value": ids.astype(np.float64) * 0.5,
        "ts": ids * 1_000,
    }


class Demo:
    """One run of the workload against one cluster."""

    def __init__(self, cluster: MiniCluster, batch_rows: int) -> None:
        self.cluster = cluster
        self.batch_rows = batch_rows
        self.seq_no = 0
        self.acknowledged_through = 0  # rows [0, acknowledged_through) were acknowledged

    def load(self, rows: int) -> float:
        """Upserts the next ``rows`` rows in batches; returns rows/s."""
        start = time.perf_counter()
        end = self.acknowledged_through + rows
        while self.acknowledged_through < end:
            count = min(self.batch_rows, end - self.acknowledged_through)
            response = write_to_leader(
                self.cluster,
                TABLET,
                SCHEMA,
                _rows(self.acknowledged_through, count),
                op="upsert",
                client_id=CLIENT_ID,
                seq_no=self.seq_no,
            )
            if response.per_row_errors:
                raise SystemExit(f"demo: row errors: {list(response.per_row_errors)[:3]}")
            self.seq_no += 1
            self.acknowledged_through += count
        return rows / (time.perf_counter() - start)

    def verify(self) -> int:
        """Scans through the leader and checks every acknowledged row, exactly once."""
        leader = self.cluster.leader_of(TABLET)
        table = scan(leader, TABLET, SCHEMA).sort_by("id").cast(SCHEMA.to_arrow())
        expected = pa.table(_rows(0, self.acknowledged_through), schema=SCHEMA.to_arrow())
        if table.num_rows != expected.num_rows:
            raise SystemExit(f"demo: {table.num_rows} rows read, {expected.num_rows} acknowledged")
        if not table.equals(expected):
            raise SystemExit("demo: rows read differ from the rows acknowledged")
        return int(table.num_rows)


def _committed_index(ts: ServerProcess) -> int:
    request = consensus_pb2.GetConsensusStateRequestPB(dest_uuid=ts.uuid, tablet_ids=[TABLET])
    with ts.proxy() as proxy:
        response = proxy.call(proxy.consensus.GetConsensusState, request)
    return int(response.tablets[0].committed_index)


def _wait_caught_up(victim: ServerProcess, leader: ServerProcess) -> float:
    start = time.perf_counter()
    target = _committed_index(leader)
    while _committed_index(victim) < target:
        if time.perf_counter() - start > CATCH_UP_TIMEOUT_S:
            raise SystemExit(f"demo: {victim.name} did not catch up in {CATCH_UP_TIMEOUT_S} s")
        time.sleep(0.1)
    return time.perf_counter() - start


def run(rows: int, batch_rows: int, base_dir: Path | None) -> None:
    """The whole demo; raises ``SystemExit`` with a message on the first failed check."""
    with MiniCluster(3, base_dir=base_dir, keep_dir=base_dir is not None) as cluster:
        print(f"started 3 tservers under {cluster.base_dir}")
        cluster.create_tablet(TABLET, SCHEMA, table_name="demo")
        leader = cluster.leader_of(TABLET)
        print(f"created tablet {TABLET[:8]}… replicated 3 ways; leader is {leader.name}")
        demo = Demo(cluster, batch_rows)
        rate = demo.load(rows)
        print(f"loaded {rows:,} rows (fsync'd on a majority) at {rate:,.0f} rows/s")
        print(f"verified {demo.verify():,} rows read back through the leader")
        leader.kill()
        print(f"SIGKILLed the leader {leader.name}")
        failover_start = time.perf_counter()
        demo.load(batch_rows)
        failover_s = time.perf_counter() - failover_start
        new_leader = cluster.leader_of(TABLET)
        print(f"first write after the kill acknowledged in {failover_s:.2f} s by {new_leader.name}")
        demo.load(rows // 10)
        print(f"verified {demo.verify():,} rows with one of three servers dead")
        leader.restart()
        caught_up_s = _wait_caught_up(leader, cluster.leader_of(TABLET))
        print(f"restarted {leader.name}; it caught up from the leader's WAL in {caught_up_s:.2f} s")
        print(f"verified {demo.verify():,} rows: nothing acknowledged was lost or duplicated")
    print("demo OK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-rows", type=int, default=20_000)
    parser.add_argument("--dir", type=Path, default=None, help="keep the cluster's files here")
    args = parser.parse_args()
    run(args.rows, args.batch_rows, args.dir)


if __name__ == "__main__":
    main()
