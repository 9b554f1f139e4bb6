"""Where one single-row write's time goes: a lone writer's ``Table.upsert``, hop by hop.

One client thread writes one row (8-byte key + 92-byte string) per ``Table.upsert`` call,
waiting for each acknowledgement (issue 28's one-client case of ``benches/vs_etcd_bench.py``),
against tables of one and of three replicas on the same cluster (1 master, 3 tservers,
loopback), and against three replicas on a second cluster started with ``--no-wal-sync``.
Each phase measures, per write:

* ``total``: the caller's time in ``Table.upsert``;
* ``client``: what the client spends outside its RPC (converting and routing the row,
  building the request, assembling the result): ``total`` minus the time in
  ``Writer._send``, measured by timing that method in this process;
* ``rpc``: the RPC's time outside the leader's handler (gRPC on both ends, the wire):
  ``Writer._send`` minus the handler's time;
* ``server``: the leader's handler, from the leader's ``nyala_rpc_duration_seconds`` of
  its write methods (sum over count across the phase).

The server's time splits further by difference between the phases:

* ``local`` (one replica): propose, the leader's WAL append with its fsync, commit, apply,
  answer;
* ``replication`` = server(three replicas) - server(one replica): the AppendEntries to the
  followers, their append and fsync, their answers, and the commit that waits for one of
  them;
* ``fsync`` = server(three replicas) - server(three replicas, no fsync).

Each phase also takes the CPU time per write (user + system, from ``/proc``) of this process
(``client_cpu_us``), of the leader's tablet server (``leader_cpu_us``) and of the three tablet
servers together (``servers_cpu_us``).

Baseline in the same run: ``Ping`` of the leader from one thread (a round trip with nothing
behind it). The last line is one JSON object with ``baseline_ping_ms``, ``p50_ms_rf1``,
``p50_ms_rf3``, and per phase the means ``total_ms``, ``client_ms``, ``rpc_ms``, ``server_ms``
and the CPU figures, plus ``local_ms``, ``replication_ms`` and ``fsync_ms``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
import urllib.request
from typing import Any

import nyala
from nyala.client.write import Writer
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster
from nyala.testing.mini_cluster import ServerProcess
from nyala.testing.procstat import cpu_seconds

SCHEMA = Schema([Column("id", "int64"), Column("payload", "string")], ["id"])
PAYLOAD = "x" * 92
WRITE_METHODS = ("Write", "WriteMulti")


class _SendTimer:
    """Time this process spends in ``Writer._send`` (the RPC of a write), per thread."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._original = Writer._send

    def __enter__(self) -> _SendTimer:
        original = self._original
        local = self._local

        def timed(writer: Writer, *args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return original(writer, *args, **kwargs)
            finally:
                local.seconds = getattr(local, "seconds", 0.0) + time.perf_counter() - began

        Writer._send = timed  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *_: object) -> None:
        Writer._send = self._original  # type: ignore[method-assign]

    def take(self) -> float:
        seconds = getattr(self._local, "seconds", 0.0)
        self._local.seconds = 0.0
        return float(seconds)


def _handler_seconds(ts: ServerProcess) -> tuple[float, int]:
    """Sum and count of ``ts``'s write handlers' durations (its /metrics)."""
    url = f"http://{ts.http_addr}/metrics?metrics=nyala_rpc_duration_seconds"
    with urllib.request.urlopen(url, timeout=10) as page:
        text = page.read().decode()
    total, count = 0.0, 0
    for line in text.splitlines():
        for method in WRITE_METHODS:
            label = f'method="{method}"'
            if label not in line:
                continue
            name, value = line.rsplit(" ", 1)
            if name.startswith("nyala_rpc_duration_seconds_sum"):
                total += float(value)
            elif name.startswith("nyala_rpc_duration_seconds_count"):
                count += int(float(value))
    return total, count


def _pid(server: ServerProcess) -> int:
    if server.pid is None:
        raise RuntimeError(f"{server.name} is not running")
    return server.pid


def _phase(
    cluster: MiniCluster, table: Any, seconds: float, timer: _SendTimer, base: int
) -> dict[str, float]:
    tablet_id = table.tablets()[0].tablet_id
    leader = cluster.leader_of(tablet_id)
    for i in range(20):  # warm-up: channels, the pipe, the leader's caches
        table.upsert({"id": [base - 1 - i], "payload": [PAYLOAD]}).raise_for_errors()
    timer.take()
    sum0, count0 = _handler_seconds(leader)
    pids = [os.getpid(), *(_pid(ts) for ts in (leader, *cluster.tservers))]
    cpu0 = [cpu_seconds([pid]) for pid in pids]
    totals: list[float] = []
    sends: list[float] = []
    stop = time.perf_counter() + seconds
    key = base
    while time.perf_counter() < stop:
        began = time.perf_counter()
        table.upsert({"id": [key], "payload": [PAYLOAD]}).raise_for_errors()
        totals.append(time.perf_counter() - began)
        sends.append(timer.take())
        key += 1
    cpu1 = [cpu_seconds([pid]) for pid in pids]
    sum1, count1 = _handler_seconds(leader)
    if cluster.leader_of(tablet_id) is not leader:
        raise RuntimeError("the leader changed during the phase: run again")
    writes = len(totals)
    server_s = (sum1 - sum0) / max(1, count1 - count0)
    total_s, send_s = statistics.fmean(totals), statistics.fmean(sends)
    return {
        "writes": writes,
        "p50_ms": round(statistics.median(totals) * 1000, 3),
        "total_ms": round(total_s * 1000, 3),
        "client_ms": round((total_s - send_s) * 1000, 3),
        "rpc_ms": round((send_s - server_s) * 1000, 3),
        "server_ms": round(server_s * 1000, 3),
        "handler_calls_per_write": round((count1 - count0) / max(1, writes), 3),
        "client_cpu_us": round((cpu1[0] - cpu0[0]) / writes * 1e6),
        "leader_cpu_us": round((cpu1[1] - cpu0[1]) / writes * 1e6),
        "servers_cpu_us": round(
            sum(b - a for a, b in zip(cpu0[2:], cpu1[2:], strict=True)) / writes * 1e6
        ),
    }


def _pings(cluster: MiniCluster, table: Any, seconds: float) -> float:
    leader = cluster.leader_of(table.tablets()[0].tablet_id)
    times: list[float] = []
    with leader.proxy() as proxy:
        stop = time.perf_counter() + seconds
        while time.perf_counter() < stop:
            began = time.perf_counter()
            proxy.ping(leader.uuid or "")
            times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 s phases (default 10 s)")
    parser.add_argument("--seconds", type=float, default=None, help="length of each phase")
    args = parser.parse_args()
    seconds = args.seconds or (3.0 if args.quick else 10.0)
    result: dict[str, Any] = {"bench": "write_hops", "phase_s": seconds}
    with _SendTimer() as timer:
        with (
            MiniCluster(3, num_masters=1) as cluster,
            nyala.connect(cluster.master_addrs, timeout_ms=60_000) as client,
        ):
            rf1 = client.create_table("rf1", SCHEMA, replicas=1)
            rf3 = client.create_table("rf3", SCHEMA, replicas=3)
            result["baseline_ping_ms"] = round(_pings(cluster, rf3, seconds / 2), 3)
            result["rf1"] = _phase(cluster, rf1, seconds, timer, 1_000_000)
            result["rf3"] = _phase(cluster, rf3, seconds, timer, 2_000_000)
        with (
            MiniCluster(3, num_masters=1, tserver_flags=["--no-wal-sync"]) as cluster,
            nyala.connect(cluster.master_addrs, timeout_ms=60_000) as client,
        ):
            table = client.create_table("rf3_nosync", SCHEMA, replicas=3)
            result["rf3_no_fsync"] = _phase(cluster, table, seconds, timer, 3_000_000)
    rf1, rf3, nosync = result["rf1"], result["rf3"], result["rf3_no_fsync"]
    result.update(
        {
            "p50_ms_rf1": rf1["p50_ms"],
            "p50_ms_rf3": rf3["p50_ms"],
            "local_ms": rf1["server_ms"],
            "replication_ms": round(rf3["server_ms"] - rf1["server_ms"], 3),
            "fsync_ms": round(rf3["server_ms"] - nosync["server_ms"], 3),
        }
    )
    print(f"ping (baseline) {result['baseline_ping_ms']} ms")
    for name in ("rf1", "rf3", "rf3_no_fsync"):
        p = result[name]
        print(
            f"{name:>13}: total {p['total_ms']} ms (p50 {p['p50_ms']}) = client {p['client_ms']}"
            f" + rpc {p['rpc_ms']} + server {p['server_ms']} ms; {p['writes']} writes; CPU per"
            f" write: client {p['client_cpu_us']} us, servers {p['servers_cpu_us']} us (leader"
            f" {p['leader_cpu_us']})"
        )
    print(
        f"server: local {result['local_ms']} ms, replication +{result['replication_ms']} ms,"
        f" of rf3's server time fsync {result['fsync_ms']} ms"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
