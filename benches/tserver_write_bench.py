"""Tablet server write benchmark: three real tserver processes on loopback, one tablet, fsync on.

Measured in one run against the same cluster (a master too: the client finds the tablet
through it):

* baseline: 64 concurrent ``Ping`` calls to the leader (ops/s): the RPC round trip with no
  consensus, WAL or storage behind it;
* (a) 64 writer threads sharing one ``nyala.Client``, each writing single ~100-byte rows and
  waiting for every acknowledgement, through the client's send path (``Writer``: request ids,
  retries, and the per-server write pipe that coalesces concurrent writes into one
  ``WriteMulti`` call): ``single_row_ops_per_s``, p50/p99 latency, writes per call. The rows
  are encoded before the clock starts (as in every phase: client-side encoding is measured by
  ``benches/client_write_bench.py``); ``single_row_ops_per_s_api`` is the same load through
  ``Table.upsert``, encoding included;
* (a') the old figure, one ``Write`` RPC per row from 64 asyncio tasks with no coalescing:
  ``single_row_ops_per_s_uncoalesced``;
* (b) batches of 1,000 rows: ``batched_rows_per_s`` from ``BATCH_WRITERS`` concurrent writer
  threads through the client (a single sequential writer is latency-bound: every batch waits
  for an fsync on a majority), and ``batched_rows_per_s_one_writer`` from one writer; the
  servers' CPU per batched row, ``server_cpu_us_per_batched_row``, and each server's,
  ``server_cpu_us_per_batched_row_by_server`` (busiest first: the leader).

Then (c) the single-row, batched and Ping phases against a secure cluster (mutual TLS on every
RPC, the caller's role checked on every call, and the table privileges of a user's authz token
on every write: docs/security.md) and a fresh insecure cluster, both started side by side and
alternated round by round for ``SECURE_ROUNDS`` rounds (half-length phases with ``--quick``):
``secure_single_row_ops_per_s``, ``secure_batched_rows_per_s``, and the medians
of the rounds' secure/insecure ratios, ``secure_single_ratio`` and ``secure_batched_ratio``
(target, issue 36: >= 0.85 each; each round's in ``secure_single_ratios`` and
``secure_batched_ratios``), and of Ping over TLS, ``secure_ping_ratio`` (the RPC layer's own
cost of TLS and the role check); the servers' CPU per batched row of both sides,
``secure_server_cpu_us_per_batched_row`` and ``insecure_server_cpu_us_per_batched_row_same_rounds``.
``--no-secure`` skips (c).

``--no-peer-channel`` runs every cluster of the bench with the consensus batches between
tservers on the gRPC stream instead of the peer channel (docs/consensus.md, "The peer
channel"); the JSON's ``peer_channel`` says which.

The last line printed is one JSON object (DESIGN.md §9) with ``single_row_ops_per_s``,
``batched_rows_per_s``, ``p99_ms_single`` and the baseline. Targets (issue 7):
``single_row_ops_per_s >= 3000`` and ``batched_rows_per_s >= 300000``.

The machine is shared and noisy, so the JSON also holds CPU time per op (server processes and
this client, from /proc and ``time.process_time``): a cost that other load does not change, and
with the core count an upper bound on ops/s (docs/performance.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import nyala
from nyala._proto import common_pb2, tserver_pb2
from nyala.client.write import _Request, _Shape
from nyala.errors import AbortedError, RetriableError, TimedOutError, WrongServerUuidError
from nyala.rowops import encode, make_op_batch
from nyala.rpc import ServerProxy
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster
from nyala.testing.procstat import cpu_seconds

SCHEMA = Schema([Column("id", "int64"), Column("payload", "string")], ["id"])
WRITERS = 64
BATCH_ROWS = 1000
BATCH_WRITERS = 16
PAYLOAD = "x" * 92  # with the 8-byte key, a 100-byte row
_PHASES = itertools.count()
PREENCODED_BATCHES = 2_000  # distinct batches cycled through (upserts, so repeats are fine)


def _ops(ids: range) -> bytes:
    batch = make_op_batch({"id": list(ids), "payload": [PAYLOAD] * len(ids)}, "upsert", SCHEMA)
    return bytes(encode(batch).to_pybytes())


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def _pings(proxy: ServerProxy, uuid: str, clients: int, seconds: float) -> float:
    count = 0
    stop = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal count
        while time.perf_counter() < stop:
            await proxy.ping(uuid)
            count += 1

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(clients):
            group.create_task(client())
    return count / (time.perf_counter() - started)


class CpuMeter:
    """CPU time of the server processes and of this client over one phase: what an op costs,
    which a busy machine's scheduling does not change (unlike ops/s)."""

    def __init__(self, cluster: MiniCluster) -> None:
        self.pids = [ts.pid for ts in cluster.tservers if ts.pid is not None]

    def start(self) -> None:
        self._servers = cpu_seconds(self.pids)
        self._each = [cpu_seconds([pid]) for pid in self.pids]
        self._client = time.process_time()

    def per_server_us(self, ops: int) -> list[float]:
        """Each server's CPU µs per op since ``start``, busiest first (the leader, for a
        phase that writes to one tablet)."""
        spent = [
            cpu_seconds([pid]) - before for pid, before in zip(self.pids, self._each, strict=True)
        ]
        return sorted((round(s * 1e6 / max(1, ops), 3) for s in spent), reverse=True)

    def per_op_ms(self, ops: int) -> tuple[float, float]:
        """(server CPU ms per op, client CPU ms per op) since ``start``."""
        servers = cpu_seconds(self.pids) - self._servers
        client = time.process_time() - self._client
        return servers * 1000 / max(1, ops), client * 1000 / max(1, ops)


class Leader:
    """Where writes go; follows NOT_THE_LEADER hints (leadership can move under load)."""

    def __init__(self, cluster: MiniCluster, tablet_id: str) -> None:
        self.cluster = cluster
        self.tablet_id = tablet_id
        self.uuid = ""
        self.proxy: ServerProxy | None = None
        self.changes = 0

    async def find(self) -> ServerProxy:
        """Looks the leader up (blocking calls in a thread; the channel on the loop)."""
        ts = await asyncio.to_thread(self.cluster.leader_of, self.tablet_id)
        assert ts.uuid is not None
        if ts.uuid != self.uuid:
            self.changes += 1
        if ts.uuid != self.uuid or self.proxy is None:
            self.uuid, self.proxy = ts.uuid, ServerProxy(ts.rpc_addr, self.cluster.rpc_settings)
        assert self.proxy is not None
        return self.proxy


async def _writes(
    leader: Leader, clients: int, rows: int, seconds: float
) -> tuple[float, list[float], int]:
    """(acknowledged write calls/s, latencies in ms, retried calls) of ``clients`` writers."""
    latencies: list[float] = []
    retries = 0
    # Encoded before the clock starts: client-side Arrow encoding is not the server's cost.
    count = max(50, PREENCODED_BATCHES // rows)
    payloads = [_ops(range(k * rows, (k + 1) * rows)) for k in range(count)]
    keys = itertools.count()
    stop = time.perf_counter() + seconds

    async def client(client_id: str) -> None:
        nonlocal retries
        for seq in itertools.count():
            if time.perf_counter() >= stop:
                return
            ops = payloads[next(keys) % len(payloads)]
            began = time.perf_counter()
            while True:
                proxy = leader.proxy or await leader.find()
                request = tserver_pb2.WriteRequestPB(
                    dest_uuid=leader.uuid,
                    tablet_id=leader.tablet_id,
                    request_id=common_pb2.RequestIdPB(
                        client_id=client_id, seq_no=seq, first_incomplete_seq_no=seq
                    ),
                    ops=ops,
                )
                try:
                    await proxy.call(proxy.tablet.Write, request)
                    break
                except (RetriableError, AbortedError, TimedOutError, WrongServerUuidError):
                    retries += 1
                    if leader.proxy is proxy:
                        leader.proxy = None
                        await leader.find()
                    await asyncio.sleep(0.01)
            latencies.append((time.perf_counter() - began) * 1000)

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for i in range(clients):
            # Client ids are fresh per phase: a reused id restarting at seq 0 is a stale retry.
            group.create_task(client(f"bench-{next(_PHASES)}-{rows}-{i}"))
    return len(latencies) / (time.perf_counter() - started), latencies, retries


def _client_writes(
    client: nyala.Client, table: Any, threads: int, rows: int, seconds: float
) -> dict[str, Any]:
    """``threads`` writer threads sharing ``client``, each sending pre-encoded ``rows``-row
    batches through the client's send path (exactly-once requests, retries, the coalescing
    write pipe) and waiting for each acknowledgement."""
    writer = client._writer  # the send path of Table.write, minus the encoding
    info = table._info
    tablet_id = table.tablets()[0].tablet_id
    count = max(50, PREENCODED_BATCHES // rows)
    payloads = [_ops(range(k * rows, (k + 1) * rows)) for k in range(count)]
    positions = np.arange(rows)
    # Upserts of every column (what ``Table.upsert`` would send for these rows).
    shape = _Shape(
        columns=tuple((c.name, c.arrow_type) for c in SCHEMA.columns),
        has_updates=True,
        only_deletes=False,
    )
    version = info.schema.version
    token = writer.cache.locations(info).authz_token  # a secure cluster's (5 min: a whole run)
    calls_before = sum(p.calls_sent for p in writer._pipes.values())
    writes_before = sum(p.writes_sent for p in writer._pipes.values())
    latencies: list[list[float]] = [[] for _ in range(threads)]
    stop = time.perf_counter() + seconds

    def run(k: int) -> None:
        mine = latencies[k]
        i = k
        while time.perf_counter() < stop:
            request = _Request(
                tablet_id,
                writer.requests.new(),
                payloads[i % count],
                positions,
                shape,
                version,
                authz_token=token,
            )
            i += threads
            began = time.perf_counter()
            (settled,) = writer._send_all(info, [request], time.monotonic() + 60)
            # Answered: no longer outstanding (``Table.write`` does this when its result goes).
            # Left outstanding, every request kept the client's first incomplete sequence
            # number at the bench's first, which the servers' outcome caches cannot trim past,
            # and made each send take the minimum of an ever larger set.
            writer.requests.done(request.seq_no)
            assert settled.error is None, settled.error
            assert settled.response is not None
            assert not settled.response.per_row_errors, settled.response.per_row_errors[:3]
            mine.append((time.perf_counter() - began) * 1000)

    started = time.perf_counter()
    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - started
    merged = [x for per in latencies for x in per]
    calls = sum(p.calls_sent for p in writer._pipes.values()) - calls_before
    writes = sum(p.writes_sent for p in writer._pipes.values()) - writes_before
    return {
        "ops_per_s": len(merged) / elapsed,
        "latencies": merged,
        "writes_per_call": writes / max(1, calls),
    }


def _api_writes(table: Any, threads: int, seconds: float) -> int:
    """Single-row ``Table.upsert`` calls from ``threads`` threads (encoding included); ops."""
    done = [0] * threads
    stop = time.perf_counter() + seconds

    def run(k: int) -> None:
        key = 10**9 + k
        while time.perf_counter() < stop:
            table.upsert({"id": [key], "payload": [PAYLOAD]}).raise_for_errors()
            key += threads
            done[k] += 1

    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(done)


async def _measure_raw(cluster: MiniCluster, tablet_id: str, seconds: float) -> dict[str, Any]:
    """The baseline and the uncoalesced phases: raw RPCs from asyncio tasks."""
    leader = Leader(cluster, tablet_id)
    proxy = await leader.find()
    cpu = CpuMeter(cluster)
    cpu.start()
    ping_started = time.perf_counter()
    ping_ops = await _pings(proxy, leader.uuid, WRITERS, seconds)
    ping_cpu, ping_client_cpu = cpu.per_op_ms(
        round(ping_ops * (time.perf_counter() - ping_started))
    )
    await _writes(leader, 8, 1, 1.0)  # warm-up: channels, caches, first segment
    cpu.start()
    single_ops, single_lat, single_retries = await _writes(leader, WRITERS, 1, seconds)
    single_cpu, single_client_cpu = cpu.per_op_ms(len(single_lat))
    cpu.start()
    batch_calls, batch_lat, batch_retries = await _writes(leader, 1, BATCH_ROWS, seconds)
    batch_cpu, _ = cpu.per_op_ms(len(batch_lat) * BATCH_ROWS)
    return {
        "leader_changes": leader.changes - 1,
        "retried_calls": single_retries + batch_retries,
        "baseline_ping_ops_per_s": round(ping_ops),
        "server_cpu_ms_per_ping": round(ping_cpu, 3),
        "client_cpu_ms_per_ping": round(ping_client_cpu, 3),
        "single_row_ops_per_s_uncoalesced": round(single_ops),
        "p99_ms_single_uncoalesced": round(_percentile(single_lat, 0.99), 2),
        "server_cpu_ms_per_single_op_uncoalesced": round(single_cpu, 3),
        "client_cpu_ms_per_single_op_uncoalesced": round(single_client_cpu, 3),
        "batched_rows_per_s_one_writer": round(batch_calls * BATCH_ROWS),
        "p50_ms_batch_one_writer": round(statistics.median(batch_lat), 2),
        "server_cpu_us_per_batched_row_one_writer": round(batch_cpu * 1000, 2),
    }


def _measure_client(
    cluster: MiniCluster, client: nyala.Client, table: Any, seconds: float
) -> dict[str, Any]:
    """The coalesced phases: writer threads sharing one client."""
    cpu = CpuMeter(cluster)
    _client_writes(client, table, 8, 1, 1.0)  # warm-up: channels, the pipe, the leader
    cpu.start()
    single = _client_writes(client, table, WRITERS, 1, seconds)
    single_lat = single["latencies"]
    single_cpu, single_client_cpu = cpu.per_op_ms(len(single_lat))
    cpu.start()
    api_started = time.perf_counter()
    api_ops = _api_writes(table, WRITERS, seconds)
    api_s = time.perf_counter() - api_started
    _, api_client_cpu = cpu.per_op_ms(api_ops)
    cpu.start()
    batch = _client_writes(client, table, BATCH_WRITERS, BATCH_ROWS, seconds)
    batch_lat = batch["latencies"]
    batch_cpu, batch_client_cpu = cpu.per_op_ms(len(batch_lat) * BATCH_ROWS)
    batch_by_server = cpu.per_server_us(len(batch_lat) * BATCH_ROWS)
    return {
        "single_row_ops_per_s": round(single["ops_per_s"]),
        "p50_ms_single": round(statistics.median(single_lat), 2),
        "p99_ms_single": round(_percentile(single_lat, 0.99), 2),
        "writes_per_call_single": round(single["writes_per_call"], 1),
        "server_cpu_ms_per_single_op": round(single_cpu, 3),
        "client_cpu_ms_per_single_op": round(single_client_cpu, 3),
        "single_row_ops_per_s_api": round(api_ops / api_s),
        "client_cpu_ms_per_single_op_api": round(api_client_cpu, 3),
        "batched_rows_per_s": round(batch["ops_per_s"] * BATCH_ROWS),
        "batch_writers": BATCH_WRITERS,
        "p50_ms_batch": round(statistics.median(batch_lat), 2),
        "p99_ms_batch": round(_percentile(batch_lat, 0.99), 2),
        "server_cpu_us_per_batched_row": round(batch_cpu * 1000, 2),
        "server_cpu_us_per_batched_row_by_server": batch_by_server,
        "client_cpu_us_per_batched_row": round(batch_client_cpu * 1000, 2),
    }


async def _cluster_pings(cluster: MiniCluster, tablet_id: str, seconds: float) -> float:
    """The RPC round trip alone (Ping) to the tablet's leader; over mutual TLS with the role
    check on a secure cluster."""
    leader = Leader(cluster, tablet_id)
    proxy = await leader.find()
    try:
        return await _pings(proxy, leader.uuid, WRITERS, seconds)
    finally:
        await proxy.close()


#: Secure against insecure: rounds of phases alternated between the two clusters.
SECURE_ROUNDS = 4


@dataclass
class _Side:
    """One of the two clusters the secure comparison alternates between."""

    cluster: MiniCluster
    client: nyala.Client
    table: Any
    tablet_id: str
    single: list[dict[str, Any]] = field(default_factory=list)
    batched: list[dict[str, Any]] = field(default_factory=list)
    pings: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    batched_cpu_us: list[float] = field(default_factory=list)  # server CPU per batched row

    def run_round(self, seconds: float) -> None:
        cpu = CpuMeter(self.cluster)
        cpu.start()
        single = _client_writes(self.client, self.table, WRITERS, 1, seconds)
        self.cpu_ms.append(cpu.per_op_ms(len(single["latencies"]))[0])
        self.single.append(single)
        cpu.start()
        batched = _client_writes(self.client, self.table, BATCH_WRITERS, BATCH_ROWS, seconds)
        rows = len(batched["latencies"]) * BATCH_ROWS
        self.batched_cpu_us.append(cpu.per_op_ms(rows)[0] * 1000)
        self.batched.append(batched)
        self.pings.append(asyncio.run(_cluster_pings(self.cluster, self.tablet_id, seconds / 2)))


def _side(stack: contextlib.ExitStack, secure: bool, flags: tuple[str, ...]) -> _Side:
    cluster = stack.enter_context(MiniCluster(3, num_masters=1, secure=secure, tserver_flags=flags))
    # On the secure cluster a user, not an admin: its writes carry an authz token that the
    # servers check.
    credentials = None if cluster.security is None else cluster.security.credentials("bench")
    client = stack.enter_context(
        nyala.connect(cluster.master_addrs, timeout_ms=60_000, credentials=credentials)
    )
    table = client.create_table("bench", SCHEMA, replicas=3)
    _client_writes(client, table, 8, 1, 1.0)  # warm-up: channels, the pipe, the leader
    return _Side(cluster, client, table, table.tablets()[0].tablet_id)


def _measure_secure(seconds: float, flags: tuple[str, ...]) -> dict[str, Any]:
    """The client phases against two fresh clusters started side by side, one secure and one
    not, alternated round by round (the order swapped each round), so that both see the same
    machine and the same amount of data: the medians of the rounds' secure/insecure ratios.
    (Measured one cluster after the other, a minute apart, the ratio swung between 0.5 and 1.4
    on the shared machine; against the main phases' cluster, which holds more data, the secure
    side came out up to 1.9x faster.)"""
    with contextlib.ExitStack() as stack:
        plain, tls = _side(stack, False, flags), _side(stack, True, flags)
        for round_ in range(SECURE_ROUNDS):
            for side in (plain, tls) if round_ % 2 == 0 else (tls, plain):
                side.run_round(seconds)

    def ratios(kind: str) -> list[float]:
        return [
            a["ops_per_s"] / max(1e-9, b["ops_per_s"])
            for a, b in zip(getattr(tls, kind), getattr(plain, kind), strict=True)
        ]

    single, batched = ratios("single"), ratios("batched")
    pings = [a / max(1e-9, b) for a, b in zip(tls.pings, plain.pings, strict=True)]
    return {
        "secure_baseline_ping_ops_per_s": round(statistics.median(tls.pings)),
        "secure_ping_ratio": round(statistics.median(pings), 3),
        "secure_single_row_ops_per_s": round(statistics.median(r["ops_per_s"] for r in tls.single)),
        "secure_p99_ms_single": round(
            statistics.median(_percentile(r["latencies"], 0.99) for r in tls.single), 2
        ),
        "secure_server_cpu_ms_per_single_op": round(statistics.median(tls.cpu_ms), 3),
        "insecure_server_cpu_ms_per_single_op_same_rounds": round(
            statistics.median(plain.cpu_ms), 3
        ),
        "secure_batched_rows_per_s": round(
            statistics.median(r["ops_per_s"] for r in tls.batched) * BATCH_ROWS
        ),
        "secure_server_cpu_us_per_batched_row": round(statistics.median(tls.batched_cpu_us), 2),
        "insecure_server_cpu_us_per_batched_row_same_rounds": round(
            statistics.median(plain.batched_cpu_us), 2
        ),
        "secure_single_ratio": round(statistics.median(single), 3),
        "secure_batched_ratio": round(statistics.median(batched), 3),
        "secure_single_ratios": [round(r, 3) for r in single],
        "secure_batched_ratios": [round(r, 3) for r in batched],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short phases (< 2 minutes)")
    parser.add_argument("--seconds", type=float, default=None, help="length of each phase")
    parser.add_argument(
        "--no-peer-channel",
        action="store_true",
        help="consensus between the tservers over the gRPC stream, not the peer channel",
    )
    parser.add_argument(
        "--no-secure", action="store_true", help="skip (c), the secure cluster's phases"
    )
    args = parser.parse_args()
    seconds = args.seconds or (5.0 if args.quick else 20.0)
    flags = ("--no-consensus-peer-channel",) if args.no_peer_channel else ()
    with (
        MiniCluster(3, num_masters=1, tserver_flags=flags) as cluster,
        nyala.connect(cluster.master_addrs, timeout_ms=60_000) as client,
    ):
        table = client.create_table("bench", SCHEMA, replicas=3)
        tablet_id = table.tablets()[0].tablet_id
        result = _measure_client(cluster, client, table, seconds)
        result.update(asyncio.run(_measure_raw(cluster, tablet_id, seconds)))

    if not args.no_secure:
        result.update(_measure_secure(seconds / 2 if args.quick else seconds, flags))
    result.update(
        {
            "bench": "tserver_write",
            "peer_channel": not args.no_peer_channel,
            "servers": 3,
            "fsync": True,
            "phase_s": seconds,
            "target_single_row_ops_per_s": 3000,
            "target_batched_rows_per_s": 300000,
            "target_secure_ratio": 0.85,
        }
    )
    secure = (
        ""
        if args.no_secure
        else f" | secure: single-row {result['secure_single_row_ops_per_s']} ops/s "
        f"({result['secure_single_ratio']}x), batches {result['secure_batched_rows_per_s']} "
        f"rows/s ({result['secure_batched_ratio']}x)"
    )
    print(
        f"ping (baseline) {result['baseline_ping_ops_per_s']} ops/s | single-row writes "
        f"{result['single_row_ops_per_s']} ops/s p50 {result['p50_ms_single']} ms p99 "
        f"{result['p99_ms_single']} ms ({result['single_row_ops_per_s_uncoalesced']} "
        f"uncoalesced) | 1000-row batches {result['batched_rows_per_s']} rows/s "
        f"({result['batched_rows_per_s_one_writer']} with one writer){secure}"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
