"""Small writes side by side with etcd: the same closed-loop load on both, in the same run.

Two clusters run on loopback at once, each three members with fsync on: etcd (Debian's
``etcd-server``; this bench installs it with apt-get when it runs as root and it is missing,
and prints "skipped: etcd not installed" otherwise) and nyala (1 master + 3 tservers, one
tablet, RF 3). Phases alternate, etcd then nyala, for 1 client and for 64 clients, two rounds:

* etcd: ``KV/Put`` of a 100-byte value under a fresh key per call, over gRPC from this
  process. The request is encoded by hand (two length-delimited fields, ``key`` = 1 and
  ``value`` = 2 of ``etcdserverpb.PutRequest``) so no etcd client library is needed; each
  client is a thread with a blocking stub on one shared channel to the etcd leader.
* nyala: ``Table.upsert`` of one row (8-byte key + 92-byte string) per call through the
  public API, each client a thread sharing one ``nyala.Client``, waiting for every
  acknowledgement: what a user writing rows one at a time gets.

Figures are the median over the rounds. The last line is one JSON object with ``etcd_ops_1``,
``nyala_ops_1``, ``etcd_p50_ms_1``, ``nyala_p50_ms_1``, ``etcd_ops_64``, ``nyala_ops_64``,
``ratio_64`` (nyala / etcd ops/s at 64 clients) and ``latency_ratio_1`` (nyala / etcd p50 at
one client), plus p99s. Targets (issue 28): ``ratio_64 >= 2.0``, ``latency_ratio_1 <= 1.0``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

import nyala
from nyala.rpc.ports import free_loopback_ports
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster

VALUE_BYTES = 100
SCHEMA = Schema([Column("id", "int64"), Column("payload", "string")], ["id"])
PAYLOAD = "x" * (VALUE_BYTES - 8)
PUT_METHOD = "/etcdserverpb.KV/Put"


def _etcd_binary() -> str | None:
    """The etcd server binary, installed from Debian's packages when missing and allowed."""
    found = shutil.which("etcd")
    if found or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return found
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "etcd-server"]):
        if subprocess.run(cmd, env=env, capture_output=True, check=False).returncode != 0:
            return None
    return shutil.which("etcd")


class EtcdCluster:
    """Three etcd members on loopback, each with its own data directory (fsync on)."""

    def __init__(self, binary: str, base: Path) -> None:
        self.binary = binary
        self.base = base
        ports = free_loopback_ports(6)
        self.client_urls = [f"http://127.0.0.1:{p}" for p in ports[:3]]
        self.peer_urls = [f"http://127.0.0.1:{p}" for p in ports[3:]]
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> EtcdCluster:
        initial = ",".join(f"m{i}={url}" for i, url in enumerate(self.peer_urls))
        for i, (client, peer) in enumerate(zip(self.client_urls, self.peer_urls, strict=True)):
            log = (self.base / f"etcd-m{i}.log").open("wb")
            self.procs.append(
                subprocess.Popen(
                    [
                        self.binary,
                        f"--name=m{i}",
                        f"--data-dir={self.base / f'etcd-m{i}'}",
                        f"--listen-client-urls={client}",
                        f"--advertise-client-urls={client}",
                        f"--listen-peer-urls={peer}",
                        f"--initial-advertise-peer-urls={peer}",
                        f"--initial-cluster={initial}",
                        "--initial-cluster-state=new",
                        "--initial-cluster-token=bench",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()

    def leader_addr(self, timeout_s: float = 30.0) -> str:
        """host:port of the member that leads, once one does (asked through the JSON gateway)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for url in self.client_urls:
                try:
                    status = _post_json(f"{url}/v3/maintenance/status", {})
                except OSError:
                    continue
                leader = status.get("leader")
                if leader and leader == status.get("header", {}).get("member_id"):
                    return url.removeprefix("http://")
            time.sleep(0.2)
        raise TimeoutError("etcd elected no leader")


def _post_json(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=2) as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _put_request(key: bytes, value: bytes) -> bytes:
    """``etcdserverpb.PutRequest`` with ``key`` (field 1) and ``value`` (field 2) set."""
    return b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(len(value)) + value


def _closed_loop(clients: int, seconds: float, op: Callable[[int, int], None]) -> dict[str, float]:
    """``clients`` threads each calling ``op(client, seq)`` back to back for ``seconds``."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[BaseException] = []
    start_line = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def run(k: int) -> None:
        own = latencies[k]
        seq = 0
        start_line.wait()
        try:
            while (now := time.perf_counter()) < stop_at[0]:
                op(k, seq)
                own.append(time.perf_counter() - now)
                seq += 1
        except BaseException as exc:  # reported after the phase
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
    for thread in threads:
        thread.start()
    stop_at[0] = time.perf_counter() + seconds
    started = time.perf_counter()
    start_line.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{len(errors)} clients failed; first: {errors[0]!r}")
    merged = sorted(x for own in latencies for x in own)
    return {
        "ops_per_s": len(merged) / elapsed,
        "p50_ms": 1000 * merged[len(merged) // 2],
        "p99_ms": 1000 * merged[min(len(merged) - 1, int(0.99 * len(merged)))],
    }


def _etcd_phase(addr: str, clients: int, seconds: float, round_no: int) -> dict[str, float]:
    value = b"v" * VALUE_BYTES
    with grpc.insecure_channel(addr) as channel:
        put: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(PUT_METHOD)
        put(_put_request(b"warmup", value), timeout=10)

        def op(k: int, seq: int) -> None:
            put(_put_request(f"r{round_no}/c{clients}/{k}/{seq}".encode(), value), timeout=10)

        return _closed_loop(clients, seconds, op)


def _nyala_phase(table: Any, clients: int, seconds: float, round_no: int) -> dict[str, float]:
    base = (round_no * 1_000 + clients) * 10**9

    def op(k: int, seq: int) -> None:
        key = base + seq * clients + k
        table.upsert({"id": [key], "payload": [PAYLOAD]}).raise_for_errors()

    return _closed_loop(clients, seconds, op)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short phases (< 2 minutes)")
    parser.add_argument("--seconds", type=float, default=None, help="length of each phase")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    seconds = args.seconds or (4.0 if args.quick else 10.0)
    binary = _etcd_binary()
    if binary is None:
        print("skipped: etcd not installed (apt-get install etcd-server)")
        print(json.dumps({"bench": "vs_etcd", "skipped": "etcd not installed"}))
        return
    runs: dict[str, list[dict[str, float]]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="vs-etcd-") as tmp,
        EtcdCluster(binary, Path(tmp)) as etcd,
        MiniCluster(3, num_masters=1) as cluster,
        nyala.connect(cluster.master_addrs, timeout_ms=60_000) as client,
    ):
        etcd_addr = etcd.leader_addr()
        table = client.create_table("vs_etcd", SCHEMA, replicas=3)
        table.upsert({"id": [-1], "payload": [PAYLOAD]}).raise_for_errors()
        for round_no in range(args.rounds):
            for clients in (1, 64):
                for system in ("etcd", "nyala"):
                    if system == "etcd":
                        figure = _etcd_phase(etcd_addr, clients, seconds, round_no)
                    else:
                        figure = _nyala_phase(table, clients, seconds, round_no)
                    runs.setdefault(f"{system}_{clients}", []).append(figure)
                    print(
                        f"round {round_no} {system:5} {clients:2} clients: "
                        f"{figure['ops_per_s']:8.0f} ops/s  p50 {figure['p50_ms']:6.2f} ms  "
                        f"p99 {figure['p99_ms']:6.2f} ms",
                        flush=True,
                    )

    def median(name: str, key: str) -> float:
        return round(statistics.median(run[key] for run in runs[name]), 3)

    result: dict[str, Any] = {"bench": "vs_etcd", "phase_s": seconds, "rounds": args.rounds}
    for system in ("etcd", "nyala"):
        for clients in (1, 64):
            name = f"{system}_{clients}"
            result[f"{system}_ops_{clients}"] = median(name, "ops_per_s")
            result[f"{system}_p50_ms_{clients}"] = median(name, "p50_ms")
            result[f"{system}_p99_ms_{clients}"] = median(name, "p99_ms")
    result["ratio_64"] = round(result["nyala_ops_64"] / result["etcd_ops_64"], 3)
    result["latency_ratio_1"] = round(result["nyala_p50_ms_1"] / result["etcd_p50_ms_1"], 3)
    result["p99_ratio_64"] = round(result["nyala_p99_ms_64"] / result["etcd_p99_ms_64"], 3)
    result["targets"] = {"ratio_64": ">= 2.0", "latency_ratio_1": "<= 1.0"}
    print(
        f"64 clients: nyala {result['nyala_ops_64']:.0f} vs etcd {result['etcd_ops_64']:.0f} "
        f"ops/s (ratio {result['ratio_64']}); 1 client p50: nyala {result['nyala_p50_ms_1']} "
        f"vs etcd {result['etcd_p50_ms_1']} ms (ratio {result['latency_ratio_1']})"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
