"""Client workloads of a chaos run, recording what they were told into histories.

One tablet (key ``id: int64``, value ``v: int64``) carries two workloads at once:

* **registers**: keys ``0 .. register_keys-1`` are registers; a write is an UPSERT of a unique
  value, a read is part of a linearizable leader scan (one scan reads every register);
* **set**: keys from ``SET_BASE`` up are unique INSERTs; every scan is also a set read.
  Some reads are **snapshot reads** (docs/consistency.md) at the timestamp of an acknowledged
  add: at the end of the run, each must hold exactly the acknowledged adds stamped at or
  before its timestamp (``check_snapshot_reads``).

Each write carries a request id (client id, sequence number) and is retried with the *same*
id on whichever server leads, so a retry after an unknown outcome cannot apply twice: an
INSERT that comes back ``ALREADY_PRESENT`` was applied twice and is counted as an anomaly.
An operation whose outcome stays unknown is recorded as ``info`` and its worker continues as a
new process (Jepsen's convention: the old one may still be in flight).
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

import grpc
import pyarrow as pa

from nyala import errors
from nyala._proto import common_pb2, tserver_pb2
from nyala.chaos.cluster import ChaosCluster
from nyala.chaos.history import History
from nyala.rowops import encode, make_op_batch
from nyala.rpc.errors import error_from_grpc, raise_for_response
from nyala.schema import Column, Schema
from nyala.testing.mini_cluster import ServerProcess

SET_BASE = 1_000_000
ATTEMPT_TIMEOUT_MS = 3_000
OP_DEADLINE_S = 8.0
SCAN_TIMEOUT_S = 5.0
# Refusals that prove the server did not take the write in: retrying elsewhere is safe and,
# if every attempt ends so, it failed. Not ``NotLeaderError``: a leader that loses its office
# with the entry in its log answers that too, and the entry may still commit (the first long
# run recorded such writes as failed and then read their values).
_DEFINITE_REFUSALS = (
    errors.TabletNotFoundError,
    errors.WrongServerUuidError,
)


def schema() -> Schema:
    """The chaos tablet's schema."""
    return Schema([Column("id", "int64"), Column("v", "int64")], key=["id"])


class Outcome(Exception):
    """How an operation ended when it did not end ok."""

    def __init__(self, definite: bool, cause: BaseException | None) -> None:
        super().__init__(str(cause))
        self.definite = definite


#: Snapshot reads whose results are kept for the end-of-run check.
SNAPSHOT_READS_KEPT = 200


@dataclass
class WorkloadStats:
    """Counters shared by the workers."""

    double_applied: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Acknowledged set adds: element -> the write's timestamp.
    add_stamps: dict[int, int] = field(default_factory=dict)
    #: Snapshot reads: (timestamp, elements returned).
    snapshot_reads: list[tuple[int, frozenset[int]]] = field(default_factory=list)


def check_snapshot_reads(stats: WorkloadStats) -> list[str]:
    """Anomalies of the snapshot reads: an acknowledged add stamped at or before a read's
    timestamp that the read lacks, or one stamped after it that the read holds. (Adds whose
    outcome is unknown have no known stamp and may be in or out.)"""
    anomalies = []
    stamps = stats.add_stamps
    for ts, seen in stats.snapshot_reads:
        missing = [e for e, t in stamps.items() if t <= ts and e not in seen]
        early = [e for e in seen if stamps.get(e, 0) > ts]
        if missing:
            anomalies.append(f"snapshot {ts}: lacks {len(missing)} adds at or before it")
        if early:
            anomalies.append(f"snapshot {ts}: holds {len(early)} adds stamped after it")
    return anomalies


class TabletClient:
    """Writes and scans against the chaos tablet's leader, retrying with one request id."""

    def __init__(self, cluster: ChaosCluster, client_id: str) -> None:
        self.cluster = cluster
        self.client_id = client_id
        self.seq_no = 0
        self._leader: ServerProcess | None = None

    def write(self, rows: dict[str, list[int]], op: str) -> tserver_pb2.WriteResponsePB:
        """One write, retried with the same request id until ``OP_DEADLINE_S``; raises
        ``Outcome`` (definite or not) when it gives up."""
        assert self.cluster.schema is not None
        seq_no = self.seq_no
        self.seq_no += 1
        ops = encode(make_op_batch(rows, op, self.cluster.schema)).to_pybytes()
        deadline = time.monotonic() + OP_DEADLINE_S
        uncertain = False
        last: BaseException | None = None
        while time.monotonic() < deadline:
            try:
                leader = self._find_leader(deadline)
            except errors.TimedOutError as exc:
                last = exc
                break
            request = tserver_pb2.WriteRequestPB(
                dest_uuid=leader.uuid or "",
                tablet_id=self.cluster.tablet_id,
                request_id=common_pb2.RequestIdPB(
                    client_id=self.client_id, seq_no=seq_no, first_incomplete_seq_no=seq_no
                ),
                schema_version=self.cluster.schema.version,
                ops=ops,
            )
            try:
                with leader.proxy() as proxy:
                    return proxy.call(proxy.tablet.Write, request, timeout_ms=ATTEMPT_TIMEOUT_MS)
            except _DEFINITE_REFUSALS as exc:
                last = exc
            except errors.NyalaError as exc:
                last, uncertain = exc, True
            self._leader = None
            time.sleep(0.05)
        raise Outcome(not uncertain, last)

    def scan(self, snapshot_ts: int = 0) -> list[tuple[int, int]]:
        """A linearizable scan at the leader, or a snapshot scan at ``snapshot_ts``: every
        (id, v) row."""
        leader = self._find_leader(time.monotonic() + OP_DEADLINE_S)
        mode = tserver_pb2.READ_AT_SNAPSHOT if snapshot_ts else tserver_pb2.READ_LATEST
        request = tserver_pb2.ScanRequestPB(
            dest_uuid=leader.uuid or "",
            new_scan=tserver_pb2.NewScanRequestPB(
                tablet_id=self.cluster.tablet_id, read_mode=mode, snapshot_timestamp=snapshot_ts
            ),
            batch_size_bytes=4 << 20,
        )
        rows: list[tuple[int, int]] = []
        try:
            with leader.proxy() as proxy:
                for response in proxy.tablet.Scan(request, timeout=SCAN_TIMEOUT_S):
                    raise_for_response(response)
                    if not response.batch:
                        continue  # the answer that ends the scan carries no rows
                    table = pa.ipc.open_stream(response.batch).read_all()
                    ids = table.column("id").to_pylist()
                    values = table.column("v").to_pylist()
                    rows.extend(zip(ids, values, strict=True))
        except grpc.RpcError as exc:
            self._leader = None
            raise error_from_grpc(exc, target=leader.rpc_addr) from None
        except BaseException:
            self._leader = None
            raise
        return rows

    def _find_leader(self, deadline: float) -> ServerProcess:
        if self._leader is None or not self._leader.is_running():
            self._leader = self.cluster.leader(timeout_s=max(0.1, deadline - time.monotonic()))
        return self._leader


class Workload:
    """The register and set workloads, run by ``threads`` workers until ``stop``."""

    def __init__(
        self, cluster: ChaosCluster, seed: int, *, threads: int = 4, register_keys: int = 5
    ) -> None:
        self.cluster = cluster
        self.registers = History()
        self.set = History()
        self.stats = WorkloadStats()
        self.register_keys = register_keys
        self._seed = seed
        self._threads = threads
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []
        self._next_process = threads
        self._next_value = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        for i in range(self._threads):
            worker = threading.Thread(target=self._run, args=(i,), name=f"chaos-worker-{i}")
            worker.start()
            self._workers.append(worker)

    def stop(self) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join()

    def _fresh(self) -> int:
        with self._lock:
            self._next_value += 1
            return self._next_value

    def _new_process(self) -> int:
        with self._lock:
            self._next_process += 1
            return self._next_process

    def _run(self, worker: int) -> None:
        rng = random.Random(self._seed * 1000 + worker)
        client = TabletClient(self.cluster, f"chaos-{self._seed}-{worker}-{time.time_ns()}")
        process = worker
        while not self._stop.is_set():
            roll = rng.random()
            if roll < 0.4:
                ok = self._register_write(client, process, rng.randrange(self.register_keys))
            elif roll < 0.75:
                ok = self._set_add(client, process)
            elif roll < 0.85:
                ok = self._snapshot_read(client, rng)
            else:
                ok = self._read(client, process)
            if not ok:
                process = self._new_process()

    def _register_write(self, client: TabletClient, process: int, key: int) -> bool:
        value = self._fresh()
        self.registers.invoke(process, "write", key, value)
        try:
            client.write({"id": [key], "v": [value]}, "upsert")
        except Outcome as outcome:
            return self._failed(self.registers, process, outcome)
        self.registers.ok(process)
        return True

    def _set_add(self, client: TabletClient, process: int) -> bool:
        element = SET_BASE + self._fresh()
        self.set.invoke(process, "add", None, element)
        try:
            response = client.write({"id": [element], "v": [0]}, "insert")
        except Outcome as outcome:
            return self._failed(self.set, process, outcome)
        if response.per_row_errors:
            # The only insert of a fresh key: ALREADY_PRESENT means it was applied twice.
            with self.stats.lock:
                self.stats.double_applied.append(element)
        else:
            with self.stats.lock:
                self.stats.add_stamps[element] = response.timestamp
        self.set.ok(process)
        return True

    def _snapshot_read(self, client: TabletClient, rng: random.Random) -> bool:
        """A snapshot read at the timestamp of a random acknowledged add (not recorded in
        the histories: it is checked against the stamps at the end of the run)."""
        with self.stats.lock:
            if not self.stats.add_stamps or len(self.stats.snapshot_reads) >= SNAPSHOT_READS_KEPT:
                return True
            ts = rng.choice(list(self.stats.add_stamps.values()))
        try:
            rows = client.scan(snapshot_ts=ts)
        except errors.NyalaError:
            return True  # a read changes nothing
        seen = frozenset(i for i, _ in rows if i >= SET_BASE)
        with self.stats.lock:
            self.stats.snapshot_reads.append((ts, seen))
        return True

    def _read(self, client: TabletClient, process: int) -> bool:
        self.registers.invoke(process, "read-all", None)
        self.set.invoke(process, "read", None)
        try:
            rows = client.scan()
        except errors.NyalaError:
            # A read changes nothing: whatever happened, it is as if it never ran.
            self.registers.fail(process)
            self.set.fail(process)
            return True
        values = dict(rows)
        self.registers.ok(process, {k: values.get(k) for k in range(self.register_keys)})
        self.set.ok(process, [i for i, _ in rows if i >= SET_BASE])
        return True

    @staticmethod
    def _failed(history: History, process: int, outcome: Outcome) -> bool:
        if outcome.definite:
            history.fail(process)
            return True
        history.info(process)
        return False
