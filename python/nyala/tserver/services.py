"""The tablet server's client-facing and admin RPC services: Ping, Write, WriteMulti, Scan,
ScannerKeepAlive, CreateTablet, DeleteTablet, AlterSchema and ListTablets.

Handlers are thin: they check nothing themselves (``nyala.rpc.service`` checks ``dest_uuid``
and turns exceptions into ``ErrorPB``) and delegate to the hosted replicas: a write is proposed
to the tablet's Raft leader and answered with its per-row results once committed and applied;
the tablet manager's blocking disk work runs in a worker thread so the event loop keeps serving.
Consensus RPCs are ``nyala.server.consensus_service``'s, tablet copy's
``nyala.server.tablet_copy``'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, cast

import pyarrow as pa
from google.protobuf.message import DecodeError

from nyala._proto import (
    common_pb2,
    tserver_admin_pb2,
    tserver_admin_pb2_grpc,
    tserver_pb2,
    tserver_pb2_grpc,
)
from nyala._proto.metadata_pb2 import TabletDataState
from nyala.common.clock import HybridClock
from nyala.errors import InvalidArgumentError, NyalaError, kept_as_answer
from nyala.rpc import Context, RpcMetrics, ServiceBase, server_stream, unary
from nyala.rpc.auth import Revocations, channel_caller, set_current_caller
from nyala.rpc.errors import error_to_pb
from nyala.rpc.schema_pb import schema_from_pb
from nyala.rpc.service import check_dest_uuid
from nyala.server.convert import config_from_pb, partition_from_pb
from nyala.storage import CELL_BYTES_MAX, ROW_BYTES_MAX, Predicate, RowStatus
from nyala.tablet import DataState, TabletManager
from nyala.tablet.applier import WriteOutcome
from nyala.tablet.replica import TabletReplica
from nyala.tablet.write_entry import RequestId
from nyala.tserver.authz import TabletAuthorizer
from nyala.tserver.scanners import Scanner, ScannerRegistry
from nyala.tserver.tablet_meta import TabletReport

log = logging.getLogger(__name__)

_ROW_STATUS_CODES = {
    RowStatus.ALREADY_PRESENT: common_pb2.ALREADY_PRESENT,
    RowStatus.NOT_FOUND: common_pb2.NOT_FOUND,
    RowStatus.NULL_IN_NOT_NULL: common_pb2.INVALID_ARGUMENT,
    RowStatus.TOO_LARGE: common_pb2.INVALID_ARGUMENT,
    RowStatus.OUT_OF_RANGE: common_pb2.INVALID_ARGUMENT,
}
_ROW_STATUS_MESSAGES = {
    RowStatus.ALREADY_PRESENT: "key already present",
    RowStatus.NOT_FOUND: "key not found",
    RowStatus.NULL_IN_NOT_NULL: "a NOT NULL column holds null",
    RowStatus.TOO_LARGE: (
        f"a cell is over {CELL_BYTES_MAX} bytes or the row over {ROW_BYTES_MAX} bytes"
    ),
    RowStatus.OUT_OF_RANGE: "a value does not fit its column's type",
}
_PREDICATE_OPS = {
    tserver_pb2.ColumnPredicatePB.EQ: "=",
    tserver_pb2.ColumnPredicatePB.NE: "!=",
    tserver_pb2.ColumnPredicatePB.LT: "<",
    tserver_pb2.ColumnPredicatePB.LE: "<=",
    tserver_pb2.ColumnPredicatePB.GT: ">",
    tserver_pb2.ColumnPredicatePB.GE: ">=",
    tserver_pb2.ColumnPredicatePB.IN: "in",
    tserver_pb2.ColumnPredicatePB.IS_NULL: "is null",
    tserver_pb2.ColumnPredicatePB.IS_NOT_NULL: "is not null",
}
#: Per-tablet admin locks kept before idle ones are dropped.
_TABLET_LOCKS_MAX = 4096
#: Bytes of one streamed scan batch when the request names no batch size.
SCAN_BATCH_BYTES_DEFAULT = 1024 * 1024
#: Largest scan batch a request may ask for, in bytes (Kudu's scanner_max_batch_size_bytes).
SCAN_BATCH_BYTES_MAX_DEFAULT = 8 * 1024 * 1024


def _scalar(pb: tserver_pb2.ScalarPB) -> int | float | bool | str | bytes:
    kind = pb.WhichOneof("value")
    if kind is None:
        raise InvalidArgumentError("a predicate value is empty")
    value: int | float | bool | str | bytes = getattr(pb, kind)
    return value


def _predicates(pbs: Iterable[tserver_pb2.ColumnPredicatePB]) -> list[Predicate]:
    out: list[Predicate] = []
    for pb in pbs:
        op = _PREDICATE_OPS.get(pb.op)
        if op is None:
            raise InvalidArgumentError(f"predicate on {pb.column!r} has no operator")
        values = [_scalar(v) for v in pb.values]
        if op in ("is null", "is not null"):
            out.append((pb.column, op, None))
        elif op == "in":
            out.append((pb.column, op, values))
        elif len(values) != 1:
            raise InvalidArgumentError(f"predicate {pb.column!r} {op} takes one value")
        else:
            out.append((pb.column, op, values[0]))
    return out


def _key_bound(data: bytes, which: str) -> dict[str, Any] | None:
    """A scan's key bound (an Arrow IPC stream of one row of key columns) as a mapping of
    column to value; None if empty (unbounded)."""
    if not data:
        return None
    try:
        batch = pa.ipc.open_stream(data).read_next_batch()
    except (pa.ArrowInvalid, StopIteration) as exc:
        raise InvalidArgumentError(f"the {which} key bound is not an Arrow IPC stream") from exc
    if batch.num_rows != 1:
        raise InvalidArgumentError(f"the {which} key bound has {batch.num_rows} rows, not 1")
    row: dict[str, Any] = batch.to_pylist()[0]
    return row


def _request_id(request: tserver_pb2.WriteRequestPB) -> RequestId | None:
    """The exactly-once id of a ``WriteRequestPB`` (None if it has none)."""
    if request.HasField("request_id") and request.request_id.client_id:
        rid = request.request_id
        return RequestId(rid.client_id, rid.seq_no, rid.first_incomplete_seq_no)
    return None


def _write_response(outcome: WriteOutcome, clock: HybridClock) -> tserver_pb2.WriteResponsePB:
    """The ``WriteResponsePB`` of an applied write; a batch refused whole is an error. The
    timestamp is the one in the write's log entry (also for a retry answered from the
    outcome cache); an entry from before format 3 has none, and the clock's now, which is
    later, is what a snapshot read then needs."""
    if outcome.result is None:
        raise InvalidArgumentError(f"op batch refused: {outcome.error}")
    response = tserver_pb2.WriteResponsePB(timestamp=outcome.timestamp or clock.now())
    response.op_id.index = outcome.op_index
    if not outcome.result.ok:
        for row, status in outcome.result.errors():
            response.per_row_errors.add(
                row_index=row, code=_ROW_STATUS_CODES[status], message=_ROW_STATUS_MESSAGES[status]
            )
    return response


def _observe(clock: HybridClock, timestamp: int) -> None:
    """Moves the server's clock past a timestamp a client has seen (Kudu's timestamp
    propagation); one too far ahead is the client's error, not a reason to jump."""
    try:
        clock.update(timestamp)
    except ValueError as exc:
        raise InvalidArgumentError(f"propagated timestamp refused: {exc}") from None


_SNAPSHOT_MODES = {
    tserver_pb2.READ_AT_SNAPSHOT: "snapshot",
    tserver_pb2.READ_YOUR_WRITES: "read_your_writes",
}


#: ``WriteMulti``'s path, whose role a write on the peer channel needs.
WRITE_MULTI_PATH = "/nyala.TabletService/WriteMulti"


class TabletService(ServiceBase, tserver_pb2_grpc.TabletServiceServicer):
    """Client-facing service: liveness, writes and scans through tablet leaders."""

    def __init__(
        self,
        server_uuid: str,
        metrics: RpcMetrics,
        started_s: float,
        tablets: TabletManager,
        scanners: ScannerRegistry,
        scan_batch_bytes_max: int = SCAN_BATCH_BYTES_MAX_DEFAULT,
        admit_write: Callable[[int], None] | None = None,
        authz: TabletAuthorizer | None = None,
        revocations: Revocations | None = None,
    ) -> None:
        super().__init__(server_uuid, metrics)
        self._revocations = revocations  # removed users (a secure server), for the channel
        # Counts a write's bytes against the memory limit or refuses it (retriable).
        self._admit_write = admit_write
        self._started_s = started_s  # time.monotonic() when the server started serving
        self._tablets = tablets
        self._scanners = scanners
        self._scan_batch_bytes_max = scan_batch_bytes_max
        self._authz = authz  # table privileges (None: an insecure server checks none)

    @unary(tserver_pb2.PingResponsePB, allow_empty_dest=True)
    async def Ping(
        self,
        request: tserver_pb2.PingRequestPB,
        context: Context[tserver_pb2.PingRequestPB, tserver_pb2.PingResponsePB],
    ) -> tserver_pb2.PingResponsePB:
        return tserver_pb2.PingResponsePB(
            server_uuid=self.server_uuid, uptime_s=time.monotonic() - self._started_s
        )

    @unary(tserver_pb2.WriteResponsePB)
    async def Write(
        self,
        request: tserver_pb2.WriteRequestPB,
        context: Context[tserver_pb2.WriteRequestPB, tserver_pb2.WriteResponsePB],
    ) -> tserver_pb2.WriteResponsePB:
        return await self._write(request)

    @unary(tserver_pb2.WriteMultiResponsePB)
    async def WriteMulti(
        self,
        request: tserver_pb2.WriteMultiRequestPB,
        context: Context[tserver_pb2.WriteMultiRequestPB, tserver_pb2.WriteMultiResponsePB],
    ) -> tserver_pb2.WriteMultiResponsePB:
        """Several writes in one call, each answered on its own. The writes to one tablet are
        proposed together (one WAL group commit, one replication batch); tablets in parallel."""
        subs = list(request.requests)
        results: list[WriteOutcome | Exception | None] = [None] * len(subs)
        by_tablet: dict[str, list[int]] = {}
        clock = self._tablets.clock
        for i, sub in enumerate(subs):
            try:  # the decorator checked the call's dest_uuid; each write names its own
                check_dest_uuid(sub.dest_uuid, self.server_uuid)
                if self._authz is not None:
                    self._authz.check_write(sub)
                _observe(clock, sub.propagated_timestamp)
            except NyalaError as exc:
                results[i] = kept_as_answer(exc)
                continue
            by_tablet.setdefault(sub.tablet_id, []).append(i)
        groups = list(by_tablet.items())
        answers: list[list[WriteOutcome | Exception] | BaseException]
        if len(groups) == 1:
            # One tablet (every single-row write): awaited in this task. A gather ran it as a
            # task of its own, two more event-loop turns on the write's path.
            tablet_id, slots = groups[0]
            try:
                answers = [await self._write_tablet(tablet_id, [subs[i] for i in slots])]
            except Exception as exc:
                answers = [kept_as_answer(exc)]
        else:
            answers = await asyncio.gather(
                *(
                    self._write_tablet(tablet_id, [subs[i] for i in slots])
                    for tablet_id, slots in groups
                ),
                return_exceptions=True,
            )
        for (_, slots), answer in zip(groups, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer  # cancellation of the call
                answer = [answer] * len(slots)  # refused for the whole tablet
            for i, result in zip(slots, answer, strict=True):
                results[i] = result
        response = tserver_pb2.WriteMultiResponsePB()
        for outcome in results:
            if isinstance(outcome, Exception):
                if not isinstance(outcome, NyalaError):
                    log.error("a write of WriteMulti failed unexpectedly", exc_info=outcome)
                response.responses.add().error.CopyFrom(error_to_pb(outcome))
                continue
            assert outcome is not None, "every write has an outcome or an error"
            try:
                response.responses.append(_write_response(outcome, clock))
            except NyalaError as exc:
                response.responses.add().error.CopyFrom(error_to_pb(exc))
        return response

    async def serve_write_frame(
        self, frame: bytes | memoryview, peercert: dict[str, Any] | None
    ) -> bytes:
        """A ``WriteMulti`` call that came on the peer channel (``peer_channel.WRITE_MAGIC``):
        the serialized request in, the serialized answer out, with the gRPC method's checks,
        answers and metrics. On a secure server the caller is who ``peercert`` (its verified
        certificate) names, checked as the guard checks the gRPC method's callers."""
        if self._authz is not None:  # a secure server
            try:
                caller = channel_caller(peercert, WRITE_MULTI_PATH, self._revocations)
            except NyalaError as exc:
                refusal = tserver_pb2.WriteMultiResponsePB(error=error_to_pb(exc))
                code = common_pb2.ErrorCode.Name(refusal.error.code)
                self.rpc_metrics.record("WriteMulti", code, 0.0)
                return refusal.SerializeToString()
            set_current_caller(caller)
        try:
            request = tserver_pb2.WriteMultiRequestPB.FromString(frame)  # type: ignore[arg-type]
        except DecodeError:
            self.rpc_metrics.record("WriteMulti", "INVALID_ARGUMENT", 0.0)
            garbled = InvalidArgumentError(f"a write frame of {len(frame)} bytes does not parse")
            return tserver_pb2.WriteMultiResponsePB(error=error_to_pb(garbled)).SerializeToString()
        response = await self.WriteMulti(request, cast(Any, None))  # it reads no context
        return response.SerializeToString()

    async def _write_tablet(
        self, tablet_id: str, subs: list[tserver_pb2.WriteRequestPB]
    ) -> list[WriteOutcome | Exception]:
        replica = self._tablets.replica(tablet_id)
        # Read once: each read of a bytes field of a parsed message is a copy of its rows.
        writes = [(_request_id(sub), sub.schema_version, sub.ops) for sub in subs]
        if self._admit_write is not None:
            self._admit_write(sum(len(ops) for _, _, ops in writes))
        return await replica.write_many(writes)

    async def _write(self, request: tserver_pb2.WriteRequestPB) -> tserver_pb2.WriteResponsePB:
        if self._authz is not None:
            self._authz.check_write(request)
        replica = self._tablets.replica(request.tablet_id)
        _observe(replica.clock, request.propagated_timestamp)
        ops = request.ops  # once: each read is a copy
        if self._admit_write is not None:
            self._admit_write(len(ops))
        outcome = await replica.write(_request_id(request), request.schema_version, ops)
        return _write_response(outcome, replica.clock)

    @server_stream(tserver_pb2.ScanResponsePB)
    async def Scan(
        self,
        request: tserver_pb2.ScanRequestPB,
        context: Context[tserver_pb2.ScanRequestPB, tserver_pb2.ScanResponsePB],
    ) -> AsyncIterator[tserver_pb2.ScanResponsePB]:
        if request.WhichOneof("scan") == "scanner_id":
            scanner = self._scanners.get(request.scanner_id)
        elif request.WhichOneof("scan") == "new_scan":
            scanner = await self._open_scanner(request.new_scan, request.batch_size_bytes)
        else:
            raise InvalidArgumentError("a scan request needs new_scan or scanner_id")
        if request.close_scanner:
            self._scanners.close(scanner.scanner_id)
            yield self._scan_response(scanner)
            return
        sent = 0
        while not request.batches_max or sent < request.batches_max:
            # Produced in Rust with the GIL released, on a worker thread: the event loop (and
            # every Raft heartbeat of this server) keeps running while the page is read.
            page = await asyncio.to_thread(scanner.cursor.next_ipc, scanner.batch_bytes_max)
            self._scanners.touch(scanner)
            if page is None:
                self._scanners.close(scanner.scanner_id)
                yield self._scan_response(scanner)
                return
            sent += 1
            replica = self._tablets.lookup(scanner.tablet_id)
            if replica is not None:
                replica.rows_scanned += page[1]
                replica.bytes_scanned += len(page[0])
            response = self._scan_response(scanner)
            response.batch, response.row_count, response.has_more_results = page[0], page[1], True
            yield response

    def _scan_response(self, scanner: Scanner) -> tserver_pb2.ScanResponsePB:
        """A scan message without rows: the scanner, its read point and this server's clock
        (the client keeps the latest timestamp it observes)."""
        return tserver_pb2.ScanResponsePB(
            scanner_id=scanner.scanner_id,
            snapshot_index=scanner.snapshot_index,
            snapshot_timestamp=scanner.snapshot_timestamp,
            propagated_timestamp=self._tablets.clock.now(),
        )

    async def _open_scanner(
        self, scan: tserver_pb2.NewScanRequestPB, batch_size_bytes: int
    ) -> Scanner:
        """Opens a storage cursor at the leader (ReadIndex), or with READ_FOLLOWER here at
        this replica's applied index within the staleness bound (``StaleReplicaError`` if
        not), and registers it with pages of ``batch_size_bytes`` (capped by
        ``scan_batch_bytes_max``; fixed for the scanner's life). Key bounds, predicates,
        projection and the limit are applied in storage."""
        if self._authz is not None:
            self._authz.check_scan(scan)
        replica = self._tablets.replica(scan.tablet_id)
        bounds = {
            "lower_bound": _key_bound(scan.lower_bound_key, "lower"),
            "upper_bound": _key_bound(scan.upper_bound_key, "upper"),
        }
        _observe(replica.clock, scan.propagated_timestamp)
        follower = scan.read_mode == tserver_pb2.READ_FOLLOWER
        mode = _SNAPSHOT_MODES.get(scan.read_mode, "follower" if follower else "latest")
        if scan.diff_start_timestamp and not (
            scan.read_mode == tserver_pb2.READ_AT_SNAPSHOT and scan.snapshot_timestamp
        ):
            raise InvalidArgumentError("a diff scan needs READ_AT_SNAPSHOT with a timestamp")
        index, cursor, snapshot_ts = await replica.open_scan(
            scan.max_staleness_ms if follower else None,
            list(scan.projection) or None,
            _predicates(scan.predicates),
            limit=scan.limit_rows or None,
            read_mode=mode,
            snapshot_ts=scan.snapshot_timestamp,
            diff_start_ts=scan.diff_start_timestamp,
            propagated_ts=scan.propagated_timestamp,
            **bounds,
        )
        batch_bytes = min(batch_size_bytes or SCAN_BATCH_BYTES_DEFAULT, self._scan_batch_bytes_max)
        return self._scanners.open(scan.tablet_id, index, cursor, batch_bytes, snapshot_ts)

    @unary(tserver_pb2.ScannerKeepAliveResponsePB)
    async def ScannerKeepAlive(
        self,
        request: tserver_pb2.ScannerKeepAliveRequestPB,
        context: Context[
            tserver_pb2.ScannerKeepAliveRequestPB, tserver_pb2.ScannerKeepAliveResponsePB
        ],
    ) -> tserver_pb2.ScannerKeepAliveResponsePB:
        self._scanners.get(request.scanner_id)  # refreshes its last access
        return tserver_pb2.ScannerKeepAliveResponsePB()


class AdminService(ServiceBase, tserver_admin_pb2_grpc.TabletServerAdminServiceServicer):
    """Master-facing service: create, tombstone, delete and list replicas."""

    def __init__(
        self,
        server_uuid: str,
        metrics: RpcMetrics,
        tablets: TabletManager,
        list_tablets: Callable[[], list[TabletReport]],
        start_replica: Callable[[TabletReplica], None],
        stop_replica: Callable[[str], Awaitable[None]],
    ) -> None:
        super().__init__(server_uuid, metrics)
        self._tablets = tablets
        self._list_tablets = list_tablets
        self._start_replica = start_replica  # puts a newly created replica on Raft
        self._stop_replica = stop_replica  # stops a replica's Raft before its files go
        # Create and delete of one tablet never interleave: a CreateTablet retry arriving while
        # a DeleteTablet stops the replica would otherwise restart its Raft under the delete.
        self._tablet_locks: dict[str, asyncio.Lock] = {}

    def _tablet_lock(self, tablet_id: str) -> asyncio.Lock:
        lock = self._tablet_locks.get(tablet_id)
        if lock is None:
            if len(self._tablet_locks) > _TABLET_LOCKS_MAX:
                for key in [k for k, v in self._tablet_locks.items() if not v.locked()]:
                    del self._tablet_locks[key]
            lock = self._tablet_locks[tablet_id] = asyncio.Lock()
        return lock

    @unary(tserver_admin_pb2.CreateTabletResponsePB)
    async def CreateTablet(
        self,
        request: tserver_admin_pb2.CreateTabletRequestPB,
        context: Context[
            tserver_admin_pb2.CreateTabletRequestPB, tserver_admin_pb2.CreateTabletResponsePB
        ],
    ) -> tserver_admin_pb2.CreateTabletResponsePB:
        if not request.HasField("config") or not request.HasField("schema"):
            raise InvalidArgumentError("CreateTablet needs a schema and the initial config")
        config = config_from_pb(request.config)
        if config.peer(self.server_uuid) is None:
            raise InvalidArgumentError("the initial config does not list this server")
        async with self._tablet_lock(request.tablet_id):
            replica = await asyncio.to_thread(
                self._tablets.create_tablet,
                request.tablet_id,
                table_id=request.table_id,
                table_name=request.table_name,
                schema=schema_from_pb(request.schema),
                partition=partition_from_pb(request.partition),
                config=config,
            )
            self._start_replica(replica)
        return tserver_admin_pb2.CreateTabletResponsePB()

    @unary(tserver_admin_pb2.DeleteTabletResponsePB)
    async def DeleteTablet(
        self,
        request: tserver_admin_pb2.DeleteTabletRequestPB,
        context: Context[
            tserver_admin_pb2.DeleteTabletRequestPB, tserver_admin_pb2.DeleteTabletResponsePB
        ],
    ) -> tserver_admin_pb2.DeleteTabletResponsePB:
        kinds = {
            TabletDataState.TABLET_DATA_TOMBSTONED: DataState.TOMBSTONED,
            TabletDataState.TABLET_DATA_DELETED: DataState.DELETED,
        }
        if request.delete_type not in kinds:
            raise InvalidArgumentError("delete_type must be TOMBSTONED or DELETED")
        cas = (
            request.cas_config_opid_index_less_or_equal
            if request.HasField("cas_config_opid_index_less_or_equal")
            else None
        )
        async with self._tablet_lock(request.tablet_id):
            await self._stop_replica(request.tablet_id)
            await asyncio.to_thread(
                self._tablets.delete_tablet,
                request.tablet_id,
                kinds[request.delete_type],
                reason=request.reason,
                cas_config_opid_index_le=cas,
            )
        return tserver_admin_pb2.DeleteTabletResponsePB()

    @unary(tserver_admin_pb2.AlterSchemaResponsePB)
    async def AlterSchema(
        self,
        request: tserver_admin_pb2.AlterSchemaRequestPB,
        context: Context[
            tserver_admin_pb2.AlterSchemaRequestPB, tserver_admin_pb2.AlterSchemaResponsePB
        ],
    ) -> tserver_admin_pb2.AlterSchemaResponsePB:
        if not request.HasField("schema"):
            raise InvalidArgumentError("AlterSchema needs the new schema")
        replica = self._tablets.replica(request.tablet_id)
        await replica.alter_schema(schema_from_pb(request.schema), request.new_table_name)
        return tserver_admin_pb2.AlterSchemaResponsePB()

    @unary(tserver_admin_pb2.ListTabletsResponsePB)
    async def ListTablets(
        self,
        request: tserver_admin_pb2.ListTabletsRequestPB,
        context: Context[
            tserver_admin_pb2.ListTabletsRequestPB, tserver_admin_pb2.ListTabletsResponsePB
        ],
    ) -> tserver_admin_pb2.ListTabletsResponsePB:
        response = tserver_admin_pb2.ListTabletsResponsePB()
        for report in await asyncio.to_thread(self._list_tablets):
            entry = response.status_and_schema.add()
            entry.tablet_status.CopyFrom(report.to_pb())
            schema = report.schema_pb() if request.need_schema_info else None
            if schema is not None:
                entry.schema.CopyFrom(schema)
        return response
