"""Failover benchmark: seconds from SIGKILL of a tablet leader to the next acknowledged write.

Three real tserver processes on loopback host one tablet. A writer thread writes one row at a
time, following the leader (``GetConsensusState``; NOT_THE_LEADER and unreachable servers make
it look again). The leader is SIGKILLed ``--kills`` times (5 with ``--quick``), each time
restarted once writes flow again. For each kill: the time from the kill to the first write
acknowledged after it.

Baseline, measured in the same run: the writer's median round trip with no failure (what a
"failover" of zero would cost). Configured timing is printed next to the figures: the heartbeat
interval and the base election timeout (heartbeats missed before an election, x interval).

The last line printed is one JSON object (DESIGN.md §9) with ``failover_s_median``,
``failover_s_max``, ``heartbeat_interval_ms`` and ``election_timeout_ms``. Targets with default
settings (issue 7): median < 2 s, max < 4 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

from nyala._proto import tserver_pb2
from nyala.errors import NyalaError
from nyala.rowops import encode, make_op_batch
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster
from nyala.tserver.settings import TabletServerSettings

SCHEMA = Schema([Column("id", "int64"), Column("v", "string")], ["id"])
TABLET = "fa" * 16
WRITE_TIMEOUT_MS = 2_000


class Writer(threading.Thread):
    """Writes rows one at a time through the current leader; records each ack's time."""

    def __init__(self, cluster: MiniCluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        # (sent, acknowledged) time.monotonic() of each acknowledged write
        self.acks: list[tuple[float, float]] = []
        self.round_trips_ms: list[float] = []
        self.stopping = threading.Event()
        self._lock = threading.Lock()

    def first_ack_after(self, t: float) -> float | None:
        """The ack time of the first write sent after ``t`` (one in flight at ``t`` may have
        been answered by the killed leader just before it died)."""
        with self._lock:
            later = [done for sent, done in self.acks if sent > t]
        return min(later) if later else None

    def run(self) -> None:
        key = 0
        leader = None
        while not self.stopping.is_set():
            try:
                if leader is None or not leader.is_running():
                    leader = self.cluster.leader_of(TABLET, timeout_s=30)
                batch = make_op_batch({"id": [key], "v": ["v"]}, "upsert", SCHEMA)
                request = tserver_pb2.WriteRequestPB(
                    dest_uuid=leader.uuid, tablet_id=TABLET, ops=encode(batch).to_pybytes()
                )
                began = time.monotonic()
                with leader.proxy() as proxy:
                    proxy.call(proxy.tablet.Write, request, timeout_ms=WRITE_TIMEOUT_MS)
                done = time.monotonic()
                with self._lock:
                    self.acks.append((began, done))
                    self.round_trips_ms.append((done - began) * 1000)
                key += 1
            except NyalaError:
                leader = None
                time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 kills (< 2 minutes)")
    parser.add_argument("--kills", type=int, default=None)
    args = parser.parse_args()
    kills = args.kills or (5 if args.quick else 10)
    defaults = TabletServerSettings(fs_root=Path("."))
    failovers: list[float] = []
    with MiniCluster(3) as cluster:
        cluster.create_tablet(TABLET, SCHEMA, table_name="failover")
        writer = Writer(cluster)
        writer.start()
        deadline = time.monotonic() + 30
        while len(writer.round_trips_ms) < 200 and time.monotonic() < deadline:
            time.sleep(0.05)  # steady state
        baseline_ms = statistics.median(writer.round_trips_ms or [0.0])
        for _ in range(kills):
            victim = cluster.leader_of(TABLET)
            killed_at = time.monotonic()
            victim.kill()
            deadline = killed_at + 30
            while (ack := writer.first_ack_after(killed_at)) is None:
                if time.monotonic() > deadline:
                    raise SystemExit("no write was acknowledged within 30 s of the kill")
                time.sleep(0.01)
            failovers.append(ack - killed_at)
            print(f"kill {len(failovers)}: first ack after {failovers[-1]:.2f} s")
            victim.restart()
            time.sleep(2.0)  # let it rejoin before the next kill
        writer.stopping.set()
        writer.join(timeout=10)
    result = {
        "bench": "failover",
        "kills": kills,
        "failover_s_median": round(statistics.median(failovers), 3),
        "failover_s_max": round(max(failovers), 3),
        "baseline_write_round_trip_ms": round(baseline_ms, 2),
        "heartbeat_interval_ms": defaults.heartbeat_interval_ms,
        "election_timeout_ms": defaults.election_timeout_ms,
        "election_timeout_jitter_pct": defaults.election_timeout_jitter_pct,
        "target_failover_s_median": 2.0,
        "target_failover_s_max": 4.0,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
