"""Sending row operations to tablet leaders, exactly once (DESIGN.md §4).

An op batch is split per tablet in Rust (``PartitionRouter.split_requests``: routing over whole
columns, one gather per request, IPC encoding, no per-row Python, the GIL released) into requests
of bounded size, and every tablet's requests go to its leader in order, tablets in parallel.
Each request gets a sequence number once, when it is built; every retry (after
``NOT_THE_LEADER``, an unreachable server, a timeout) resends the very same bytes with the same
request id, so a request that was applied before the answer was lost is answered from the
replicas' result cache and never applied twice. Per-row failures come back as ``RowError``s
that name the caller's row.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from nyala import errors
from nyala._proto import common_pb2, tserver_pb2
from nyala.client.meta_cache import MetaCache, Replica, TableInfo, TabletLocation
from nyala.client.rpc import Backoff, ChannelPool
from nyala.client.write_pipe import WritePipe
from nyala.rowops import OP_COLUMN

#: Most rows and about the most Arrow bytes of one Write request: each tablet's rows are cut
#: into requests of at most this much (fewer, larger requests: each is one Raft round and one
#: fsync).
WRITE_REQUEST_ROWS_MAX = 256 * 1024
WRITE_REQUEST_BYTES_MAX = 16 * 1024 * 1024


@dataclass(frozen=True)
class RowError:
    """One row that was not applied: its position in the caller's data and why."""

    row: int
    code: str
    message: str


@dataclass
class WriteResult:
    """The outcome of a write: rows sent, and the rows that failed (the others were applied)."""

    rows: int = 0
    row_errors: list[RowError] = field(default_factory=list)
    failed_rows: pa.Table | None = None

    @property
    def ok(self) -> bool:
        """True if every row was applied."""
        return not self.row_errors

    @property
    def applied(self) -> int:
        """How many rows were applied."""
        return self.rows - len(self.row_errors)

    def raise_for_errors(self) -> WriteResult:
        """Raises the first row's error as its ``nyala.errors`` class; returns self if none."""
        if self.row_errors:
            from nyala.rpc.errors import error_from_pb

            first = self.row_errors[0]
            pb = common_pb2.ErrorPB(code=common_pb2.ErrorCode.Value(first.code))
            exc = error_from_pb(pb)
            raise type(exc)(
                f"{len(self.row_errors)} of {self.rows} rows failed; row {first.row}: "
                f"{first.code}: {first.message}"
            )
        return self

    def merge(self, other: WriteResult) -> None:
        """Adds ``other`` (a later write's result) to this one."""
        offset = self.rows
        self.rows += other.rows
        self.row_errors.extend(
            RowError(e.row + offset, e.code, e.message) for e in other.row_errors
        )
        if other.failed_rows is not None:
            parts = [t for t in (self.failed_rows, other.failed_rows) if t is not None]
            self.failed_rows = pa.concat_tables(parts)


class RequestTracker:
    """Sequence numbers for one client id, and the lowest one still awaiting an answer."""

    def __init__(self) -> None:
        self.client_id = uuid.uuid4().hex
        self._next = itertools.count(1)
        self._outstanding: set[int] = set()
        self._lock = threading.Lock()

    def new(self) -> int:
        """A fresh sequence number, outstanding until ``done``."""
        with self._lock:
            seq_no = next(self._next)
            self._outstanding.add(seq_no)
            return seq_no

    def done(self, seq_no: int) -> None:
        """The request will never be sent again (answered, or given up)."""
        with self._lock:
            self._outstanding.discard(seq_no)

    def first_incomplete(self, default: int) -> int:
        """The lowest outstanding sequence number."""
        with self._lock:
            return min(self._outstanding, default=default)


@dataclass
class _Request:
    tablet_id: str
    seq_no: int
    ops: bytes
    positions: np.ndarray[Any, Any]  # caller's row index of each row of ``ops``


class Writer:
    """Writes op batches of any table through one client's channels and caches."""

    def __init__(
        self,
        cache: MetaCache,
        pool: ChannelPool,
        executor: ThreadPoolExecutor,
        *,
        timeout_ms: int,
    ) -> None:
        self.cache = cache
        self.pool = pool
        self.executor = executor
        self.timeout_ms = timeout_ms
        self.requests = RequestTracker()
        self._pipes: dict[str, WritePipe] = {}
        self._pipes_lock = threading.Lock()

    def write(
        self, info: TableInfo, batch: pa.RecordBatch, *, timeout_ms: int | None = None
    ) -> WriteResult:
        """Applies ``batch`` (an op batch of ``info``'s table) and waits for every tablet."""
        deadline = time.monotonic() + (timeout_ms or self.timeout_ms) / 1000
        per_tablet = self._requests(info, batch)
        futures: list[Future[list[RowError]]] = []
        if len(per_tablet) == 1:
            # Sent from the caller's thread: concurrent callers then meet in the write pipe
            # (their writes coalesce) instead of queueing for the executor's few threads.
            sent: Future[list[RowError]] = Future()
            try:
                sent.set_result(self._send_all(info, next(iter(per_tablet.values())), deadline))
            except Exception as exc:
                sent.set_exception(exc)
            futures.append(sent)
        else:
            futures = [
                self.executor.submit(self._send_all, info, requests, deadline)
                for requests in per_tablet.values()
            ]
        row_errors: list[RowError] = []
        first_failure: BaseException | None = None
        for future in futures:
            try:
                row_errors.extend(future.result())
            except BaseException as exc:  # every tablet finishes before we report
                first_failure = first_failure or exc
        if first_failure is not None:
            raise first_failure
        row_errors.sort(key=lambda e: e.row)
        failed = None
        if row_errors:
            rows = batch.drop_columns([OP_COLUMN]) if OP_COLUMN in batch.schema.names else batch
            failed = pa.Table.from_batches([rows.take([e.row for e in row_errors])])
        return WriteResult(batch.num_rows, row_errors, failed)

    def _requests(self, info: TableInfo, batch: pa.RecordBatch) -> dict[str, list[_Request]]:
        locations = self.cache.locations(info)
        per_tablet: dict[str, list[_Request]] = {}
        if batch.num_rows == 0:
            return per_tablet
        pieces = locations.router.split_requests(
            batch, WRITE_REQUEST_ROWS_MAX, WRITE_REQUEST_BYTES_MAX
        )
        for partition, positions, ops in pieces:
            tablet = locations.tablets[partition]
            rows = np.asarray(positions)
            request = _Request(tablet.tablet_id, self.requests.new(), ops, rows)
            per_tablet.setdefault(tablet.tablet_id, []).append(request)
        return per_tablet

    def _send_all(
        self, info: TableInfo, requests: list[_Request], deadline: float
    ) -> list[RowError]:
        row_errors: list[RowError] = []
        try:
            for request in requests:
                response = self._send(info, request, deadline)
                self.requests.done(request.seq_no)
                for e in response.per_row_errors:
                    code = common_pb2.ErrorCode.Name(e.code)
                    row = int(request.positions[e.row_index])
                    row_errors.append(RowError(row, code, e.message))
        finally:
            for request in requests:  # given up (or answered): never sent again
                self.requests.done(request.seq_no)
        return row_errors

    def _send(
        self, info: TableInfo, request: _Request, deadline: float
    ) -> tserver_pb2.WriteResponsePB:
        backoff = Backoff(deadline)
        attempt = 0
        unreachable: set[str] = set()
        while True:
            tablet = self._tablet(info, request.tablet_id)
            replica = pick_replica(tablet, attempt, unreachable)
            if replica is None:
                if backoff.expired():
                    raise errors.TimedOutError(f"tablet {tablet.tablet_id} has no replicas yet")
                self.cache.invalidate(info.table_id)
                backoff.sleep()
                continue
            pb = tserver_pb2.WriteRequestPB(
                dest_uuid=replica.uuid,
                tablet_id=request.tablet_id,
                request_id=common_pb2.RequestIdPB(
                    client_id=self.requests.client_id,
                    seq_no=request.seq_no,
                    first_incomplete_seq_no=self.requests.first_incomplete(request.seq_no),
                    attempt_no=attempt,
                ),
                schema_version=info.schema.version,
            )
            attempt += 1
            try:
                return self.pipe(replica.addr).write(pb, request.ops, backoff.remaining_ms())
            except errors.SchemaMismatchError:
                self.cache.forget_table(info.name)
                raise
            except errors.RETRIABLE as exc:
                if isinstance(exc, (errors.NetworkError, errors.TimedOutError)):
                    unreachable.add(replica.uuid)
                self._on_retriable(info, tablet, exc)
                if backoff.expired():
                    raise errors.TimedOutError(
                        f"write to tablet {request.tablet_id} not acknowledged before the "
                        f"deadline (its outcome is unknown): {exc}"
                    ) from exc
                if not isinstance(exc, errors.NotLeaderError) or not exc.leader_uuid:
                    backoff.sleep()

    def pipe(self, addr: str) -> WritePipe:
        """The write pipe to the server at ``addr``: concurrent writes to it share calls."""
        pipe = self._pipes.get(addr)
        if pipe is None:
            with self._pipes_lock:
                pipe = self._pipes.get(addr)
                if pipe is None:
                    pipe = self._pipes[addr] = WritePipe(self.pool.get(addr))
        return pipe

    def _tablet(self, info: TableInfo, tablet_id: str) -> TabletLocation:
        for tablet in self.cache.locations(info).tablets:
            if tablet.tablet_id == tablet_id:
                return tablet
        raise errors.TabletNotFoundError(f"tablet {tablet_id} of {info.name} no longer exists")

    def _on_retriable(self, info: TableInfo, tablet: TabletLocation, exc: Exception) -> None:
        hint = exc.leader_uuid if isinstance(exc, errors.NotLeaderError) else None
        if hint and self.cache.set_leader(info.table_id, tablet.tablet_id, hint):
            return
        self.cache.invalidate(info.table_id)


def pick_replica(tablet: TabletLocation, attempt: int, unreachable: set[str]) -> Replica | None:
    """The leader unless it just failed to answer; otherwise the replicas in turn (one of them
    will know the new leader and say so)."""
    leader = tablet.leader
    if leader is not None and leader.uuid not in unreachable:
        return leader
    candidates = [r for r in tablet.replicas if r.uuid not in unreachable] or list(tablet.replicas)
    if not candidates:
        return None
    return candidates[attempt % len(candidates)]


__all__ = ["RequestTracker", "RowError", "WriteResult", "Writer", "pick_replica"]
