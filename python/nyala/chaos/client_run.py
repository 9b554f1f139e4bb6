"""A chaos run through the public client: ``nyala.connect``, ``table.insert``/``scan`` and DDL,
on a cluster with three masters, under kills and pauses of masters and tservers.

Two workloads, both judged by the set checker:

* **rows**: unique INSERTs into a hash-partitioned table through ``Table.insert`` (the
  client's own exactly-once retries), read back by ``Table.scan``;
* **DDL under master elections**: ``create_table`` of fresh names while masters are killed and
  paused; every acknowledged table must be listed at the end (an element of the set is a
  table name), and no table that was never requested may appear.

The proxy and disk nemeses of ``ChaosCluster`` need a tablet created with proxy addresses, so
they do not apply here; this run covers the master and the client paths instead.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nyala import errors
from nyala.chaos.cluster import RESTART_TIMEOUT_S
from nyala.chaos.history import History, counts
from nyala.chaos.set_checker import check_set
from nyala.schema import Column, Schema
from nyala.testing.mini_cluster import MiniCluster, ServerProcess

log = logging.getLogger(__name__)

CLIENT_KINDS = ("kill-tserver", "kill-master", "pause-tserver", "pause-master")
TABLE = "chaos_rows"
DDL_PREFIX = "chaos_ddl_"
FINAL_DEADLINE_S = 120.0
DDL_PAUSE_S = 3.0


@dataclass
class ClientRunSummary:
    """The outcome of a client run."""

    seed: int
    duration_s: float
    ops: dict[str, int]
    faults: Counter[str]
    anomalies: list[str]

    def line(self) -> str:
        faults = ",".join(f"{k}={n}" for k, n in sorted(self.faults.items())) or "none"
        return (
            f"chaos-client seed={self.seed} duration_s={self.duration_s:.0f}"
            f" ops ok={self.ops['ok']} failed={self.ops['fail']}"
            f" indeterminate={self.ops['info']} faults {faults}"
            f" anomalies={len(self.anomalies)}"
        )


def _schema() -> Schema:
    return Schema([Column("id", "int64"), Column("v", "int64")], key=["id"])


class _ClientChaos:
    def __init__(self, cluster: MiniCluster, seed: int, kinds: tuple[str, ...]) -> None:
        from nyala.client import connect

        self.cluster = cluster
        self.rng = random.Random(seed)
        self.kinds = kinds
        self.masters = ",".join(cluster.master_addrs)
        self.client = connect(self.masters)
        self.rows = History()
        self.ddl = History()
        self.double_applied: list[int] = []
        self.faults: Counter[str] = Counter()
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self._counter = 0
        self._lock = threading.Lock()
        # See ChaosCluster: children must be forked by a thread that outlives them.
        self.spawner = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spawner")

    def fresh(self) -> int:
        with self._lock:
            self._counter += 1
            return self._counter

    def guarded(self, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:
                log.exception("chaos client thread failed")
                self.errors.append(exc)

        return run

    def row_worker(self, process: int) -> None:
        table = self.client.table(TABLE)
        while not self.stop.is_set():
            element = self.fresh()
            self.rows.invoke(process, "add", None, element)
            try:
                result = table.insert({"id": [element], "v": [0]}, timeout_ms=8_000)
            except errors.NyalaError:
                # The client retried inside its deadline; whether the row landed is unknown.
                self.rows.info(process)
                process += 1000
                continue
            if not result.ok:
                self.double_applied.append(element)
            self.rows.ok(process)

    def ddl_worker(self, process: int) -> None:
        while not self.stop.is_set():
            name = f"{DDL_PREFIX}{self.fresh()}"
            self.ddl.invoke(process, "add", None, name)
            try:
                self.client.create_table(name, _schema(), replicas=3)
            except errors.NyalaError:
                self.ddl.info(process)
                process += 1000
                continue
            self.ddl.ok(process)
            # Every table adds replicas that each restart must open: keep their number modest.
            self.stop.wait(DDL_PAUSE_S)

    def nemesis(self) -> None:
        while not self.stop.wait(self.rng.uniform(0.5, 2.0)):
            kind = self.rng.choice(self.kinds)
            role, action = kind.split("-")[1], kind.split("-")[0]
            pool = self.cluster.masters if role == "master" else self.cluster.tservers
            victim = self.rng.choice(pool)
            log.info("client nemesis: %s %s", kind, victim.name)
            if action == "kill":
                victim.kill()
            else:
                victim.pause()
            self.faults[kind] += 1
            self.stop.wait(self.rng.uniform(1.0, 4.0))
            self.heal(victim)

    def heal(self, victim: ServerProcess) -> None:
        if victim.is_running():
            victim.resume()
        else:
            self.spawner.submit(victim.restart, RESTART_TIMEOUT_S).result()

    def heal_all(self) -> None:
        for ts in [*self.cluster.masters, *self.cluster.tservers]:
            self.heal(ts)

    def final_reads(self) -> tuple[list[int], list[str]]:
        deadline = time.monotonic() + FINAL_DEADLINE_S
        while True:
            try:
                # Batch by batch: only the ids are needed.
                rows = [
                    i
                    for batch in self.client.table(TABLE).scan()
                    for i in batch.column("id").to_pylist()
                ]
                tables = [t["name"] for t in self.client.list_tables(DDL_PREFIX)]
                return rows, [t for t in tables if t.startswith(DDL_PREFIX)]
            except errors.NyalaError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


def run_client(
    duration_s: float, seed: int, kinds: tuple[str, ...] = CLIENT_KINDS, *, threads: int = 3
) -> ClientRunSummary:
    """Runs the client workloads under master and tserver faults and checks them."""
    with MiniCluster(3, num_masters=3) as cluster:
        chaos = _ClientChaos(cluster, seed, kinds)
        try:
            chaos.client.create_table(TABLE, _schema(), partitioning=_partitioning(), replicas=3)
            workers = [
                threading.Thread(target=chaos.guarded(functools.partial(chaos.row_worker, p)))
                for p in range(threads)
            ]
            workers.append(
                threading.Thread(target=chaos.guarded(functools.partial(chaos.ddl_worker, 99)))
            )
            workers.append(threading.Thread(target=chaos.guarded(chaos.nemesis)))
            started = time.monotonic()
            for worker in workers:
                worker.start()
            time.sleep(duration_s)
            chaos.stop.set()
            for worker in workers:
                worker.join()
            chaos.heal_all()
            elapsed = time.monotonic() - started
            rows, tables = chaos.final_reads()
        finally:
            chaos.client.close()
            cluster.shutdown()
            chaos.spawner.shutdown()
    return _judge(chaos, seed, elapsed, rows, tables)


def _partitioning() -> Any:
    from nyala.partition import HashPartitioning

    return HashPartitioning(["id"], buckets=2)


def _judge(
    chaos: _ClientChaos, seed: int, elapsed: float, rows: list[int], tables: list[str]
) -> ClientRunSummary:
    row_ops, ddl_ops = chaos.rows.operations(), chaos.ddl.operations()
    summary = ClientRunSummary(seed, elapsed, counts(row_ops + ddl_ops), chaos.faults, [])
    for what, result in (("rows", check_set(row_ops, rows)), ("ddl", check_set(ddl_ops, tables))):
        for name in ("lost", "duplicated", "phantom"):
            for element in getattr(result, name):
                summary.anomalies.append(f"{what}: {name} {element}")
    summary.anomalies += [f"rows: insert of {e} applied twice" for e in chaos.double_applied]
    summary.anomalies += [f"thread crashed: {e!r}" for e in chaos.errors]
    return summary
