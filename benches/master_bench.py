"""Master benchmark: DDL latency and leader-master failover, 3 masters and 3 tservers.

Figures (medians over the run):
* ``create_ack_ms``: CreateTable (2 hash buckets, RF 3) until acknowledged — the catalog lock,
  one replicated sys-catalog batch, the in-memory commit;
* ``create_done_ms``: until every tablet has a leader (``IsCreateTableDone``) — the background
  CreateTablet RPCs, the new tablets' first elections and the next tablet report;
* ``alter_ack_ms``: AlterTable (add a column) until acknowledged;
* ``failover_ms``: leader master SIGKILLed until another master serves with its catalog loaded.

Baseline, measured in the same run: ``connect_rpc_ms``, the median ConnectToMaster round trip to
the leader (what any master call costs at least), and the configured election timeout (what a
failover costs at least). ``--quick`` runs in well under two minutes. The last line printed is
one JSON object with the figures and the baselines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from nyala._proto import master_pb2
from nyala.master.settings import MasterSettings
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster
from nyala.testing import master_ops as ops

SCHEMA = Schema([Column("id", "int64"), Column("v", "string", nullable=True)], key=["id"])


def _ms(start_s: float) -> float:
    return (time.monotonic() - start_s) * 1000


def _ddl(cluster: MiniCluster, tables: int) -> dict[str, float]:
    ack, done, alter, connect = [], [], [], []
    for i in range(tables):
        name = f"bench_{i}"
        t0 = time.monotonic()
        ops.call(cluster, "CreateTable", ops.create_table_request(name, SCHEMA, buckets=2))
        ack.append(_ms(t0))
        ops.wait_create_done(cluster, name)
        done.append(_ms(t0))
        t0 = time.monotonic()
        ops.call(cluster, "AlterTable", ops.add_column_request(name, "extra", "int32"))
        alter.append(_ms(t0))
        leader = cluster.leader_master()
        with leader.proxy() as proxy:
            for _ in range(5):
                t0 = time.monotonic()
                proxy.call(proxy.master.ConnectToMaster, master_pb2.ConnectToMasterRequestPB())
                connect.append(_ms(t0))
    return {
        "create_ack_ms": statistics.median(ack),
        "create_done_ms": statistics.median(done),
        "alter_ack_ms": statistics.median(alter),
        "connect_rpc_ms": statistics.median(connect),
    }


def _failovers(cluster: MiniCluster, kills: int) -> list[float]:
    out = []
    for _ in range(kills):
        leader = cluster.leader_master()
        t0 = time.monotonic()
        leader.kill()
        cluster.leader_master(timeout_s=60)
        out.append(_ms(t0))
        leader.start()
        leader.wait_ready()
        time.sleep(1.0)  # let the restarted master catch up before the next kill
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer tables and kills")
    args = parser.parse_args()
    tables, kills = (5, 3) if args.quick else (20, 8)
    settings = MasterSettings(fs_root=Path("."))
    with MiniCluster(3, num_masters=3) as cluster:
        cluster.leader_master()
        figures = _ddl(cluster, tables)
        failovers = _failovers(cluster, kills)
    figures["failover_ms"] = statistics.median(failovers)
    figures["failover_ms_max"] = max(failovers)
    election_ms = (
        settings.heartbeat_interval_ms * settings.leader_failure_max_missed_heartbeat_periods
    )
    figures["election_timeout_ms"] = float(election_ms)
    for name, value in figures.items():
        print(f"{name:24} {value:10.1f}")
    print(json.dumps({k: round(v, 1) for k, v in figures.items()}))


if __name__ == "__main__":
    main()
