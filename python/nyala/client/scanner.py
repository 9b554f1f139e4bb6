"""Scans: projection, predicates and a row limit pushed to the tablets, results streamed back as
``pyarrow.RecordBatch``es, tablet after tablet in partition order (DESIGN.md §5).

Each tablet returns its rows in primary-key order. If the stream breaks (the leader died or
stepped down, a server became unreachable), the scan resumes on the new leader *after the last
key it returned*: the first key column gets a ``>=`` predicate from the last row, and rows whose
full key is not above the last one are dropped, so no row is returned twice or skipped. The key
columns are fetched for this even when not projected, and removed before the caller sees them.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from nyala import errors
from nyala._proto import tserver_pb2
from nyala.client.meta_cache import MetaCache, TableInfo, TabletLocation
from nyala.client.rpc import RETRIABLE, Backoff, ChannelPool
from nyala.client.write import pick_replica
from nyala.rpc.errors import error_from_pb
from nyala.schema import Schema

#: Target Arrow bytes of one streamed batch.
SCAN_BATCH_BYTES = 4 * 1024 * 1024
#: Batches per Scan call; the scanner stays open on the server between pages, so a long scan
#: is a series of short calls and a server lost between two pages costs one page, not a stream.
SCAN_PAGE_BATCHES = 16

_OPS = {
    "=": tserver_pb2.ColumnPredicatePB.EQ,
    "==": tserver_pb2.ColumnPredicatePB.EQ,
    "<": tserver_pb2.ColumnPredicatePB.LT,
    "<=": tserver_pb2.ColumnPredicatePB.LE,
    ">": tserver_pb2.ColumnPredicatePB.GT,
    ">=": tserver_pb2.ColumnPredicatePB.GE,
    "in": tserver_pb2.ColumnPredicatePB.IN,
    "is null": tserver_pb2.ColumnPredicatePB.IS_NULL,
    "is not null": tserver_pb2.ColumnPredicatePB.IS_NOT_NULL,
}

#: A predicate as users write it: ``("id", ">=", 10)``, ``("name", "is null")``,
#: ``("id", "in", [1, 2])``.
Predicate = tuple[Any, ...]


def predicate_to_pb(schema: Schema, predicate: Predicate) -> Any:
    """The ``ColumnPredicatePB`` of one predicate; ``InvalidArgumentError`` if malformed."""
    if len(predicate) not in (2, 3):
        raise errors.InvalidArgumentError(f"predicate {predicate!r} must be (column, op[, value])")
    column, op_text = predicate[0], str(predicate[1]).strip().lower()
    col = schema.column(column)
    op = _OPS.get(op_text)
    if op is None:
        raise errors.InvalidArgumentError(f"unknown predicate operator {predicate[1]!r}")
    pb = tserver_pb2.ColumnPredicatePB(column=column, op=op)
    if op_text in ("is null", "is not null"):
        if len(predicate) == 3:
            raise errors.InvalidArgumentError(f"{op_text} takes no value")
        return pb
    if len(predicate) != 3:
        raise errors.InvalidArgumentError(f"predicate {predicate!r} needs a value")
    values = list(predicate[2]) if op_text == "in" else [predicate[2]]
    for value in values:
        _scalar(pb.values.add(), col.type, value)
    return pb


def _scalar(pb: Any, type_: str, value: Any) -> None:
    try:
        if type_ == "timestamp":
            if isinstance(value, (dt.datetime, str)):
                value = pa.scalar(value, type=pa.timestamp("us")).value
            pb.int_value = int(value)
        elif type_.startswith("int"):
            if isinstance(value, bool) or int(value) != value:
                raise TypeError(value)
            pb.int_value = int(value)
        elif type_ in ("float", "double"):
            pb.double_value = float(value)
        elif type_ == "bool":
            if not isinstance(value, bool):
                raise TypeError(value)
            pb.bool_value = value
        elif type_ == "string":
            if not isinstance(value, str):
                raise TypeError(value)
            pb.string_value = value
        else:
            pb.binary_value = bytes(value)
    except (TypeError, ValueError, pa.ArrowInvalid) as err:
        raise errors.InvalidArgumentError(f"{value!r} is not a {type_} value") from err


class Scanner:
    """A scan of one table. Iterate for ``pyarrow.RecordBatch``es, or call ``to_arrow`` /
    ``to_pandas``. Each iteration runs the scan again."""

    def __init__(
        self,
        cache: MetaCache,
        pool: ChannelPool,
        info: TableInfo,
        *,
        columns: Sequence[str] | None = None,
        where: Sequence[Predicate] = (),
        limit: int | None = None,
        replica: str = "leader",
        max_staleness_ms: int = 0,
        timeout_ms: int,
        batch_size_bytes: int = SCAN_BATCH_BYTES,
        page_batches: int = SCAN_PAGE_BATCHES,
    ) -> None:
        if replica not in ("leader", "follower"):
            raise errors.InvalidArgumentError("replica must be 'leader' or 'follower'")
        if limit is not None and limit < 0:
            raise errors.InvalidArgumentError("limit must be >= 0")
        self.cache = cache
        self.pool = pool
        self.info = info
        schema = info.schema
        self.columns = list(columns) if columns else schema.names
        for name in self.columns:
            schema.column(name)
        self.predicates = [predicate_to_pb(schema, p) for p in where]
        self.limit = limit
        self.replica = replica
        self.max_staleness_ms = max_staleness_ms
        self.timeout_ms = timeout_ms
        self.batch_size_bytes = batch_size_bytes
        self.page_batches = page_batches
        # Fetched columns: the projection plus any key column it lacks (for resuming).
        self._fetch = self.columns + [k for k in schema.key if k not in self.columns]
        self.output_schema = pa.schema([schema.to_arrow().field(c) for c in self.columns])

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        remaining = self.limit
        for tablet in self.cache.locations(self.info).tablets:
            if remaining == 0:
                return
            for batch in self._scan_tablet(tablet, remaining):
                if remaining is not None:
                    batch = batch.slice(0, remaining)
                    remaining -= batch.num_rows
                if batch.num_rows:
                    # One schema for every batch, whichever replica or schema version sent it.
                    columns = batch.select(self.columns).columns
                    yield pa.RecordBatch.from_arrays(columns, schema=self.output_schema)
                if remaining == 0:
                    return

    def to_arrow(self) -> pa.Table:
        """Every row as one ``pyarrow.Table``."""
        batches = list(self)
        return pa.Table.from_batches(batches, schema=self.output_schema)

    def to_pandas(self) -> Any:
        """Every row as a pandas DataFrame."""
        return self.to_arrow().to_pandas()

    def count(self) -> int:
        """The number of matching rows."""
        return sum(batch.num_rows for batch in self)

    def _scan_tablet(self, tablet: TabletLocation, limit: int | None) -> Iterator[pa.RecordBatch]:
        deadline = time.monotonic() + self.timeout_ms / 1000
        backoff = Backoff(deadline)
        last_key: tuple[Any, ...] | None = None
        attempt = 0
        unreachable: set[str] = set()
        # A follower that cannot serve the read (NOT_SUPPORTED: follower reads are not built
        # into the tserver yet) sends this tablet's scan to the leader, like Kudu's
        # CLOSEST_REPLICA falling back to another replica.
        follower = self.replica == "follower"
        while True:
            tablet = self._fresh(tablet)
            target = self._pick(tablet, attempt, unreachable, follower)
            attempt += 1
            request = self._request(tablet.tablet_id, target.uuid, last_key, limit, follower)
            stubs = self.pool.get(target.addr)
            try:
                while request is not None:
                    scanner_id, more = "", False
                    timeout_s = backoff.remaining_ms() / 1000
                    for response in stubs.tablet.Scan(request, timeout=timeout_s):
                        if response.HasField("error"):
                            raise error_from_pb(response.error)
                        scanner_id, more = response.scanner_id, response.has_more_results
                        if not response.batch:
                            continue
                        batch = pa.ipc.open_stream(response.batch).read_next_batch()
                        batch = self._after(batch, last_key)
                        if batch.num_rows == 0:
                            continue
                        last_key = self._last_key(batch)
                        if limit is not None:
                            limit -= batch.num_rows
                        yield batch
                    # A page ended with the scanner still open: ask for the next page.
                    request = self._continue(target.uuid, scanner_id) if more else None
                return
            except Exception as exc:
                mapped = _map_error(exc, target.addr)
                if follower and isinstance(mapped, errors.NotSupportedError):
                    follower = False
                    continue
                resumable = isinstance(mapped, (*RETRIABLE, errors.ScannerExpiredError))
                if not resumable or backoff.expired():
                    raise mapped from None
                if isinstance(mapped, (errors.NetworkError, errors.TimedOutError)):
                    unreachable.add(target.uuid)
                self.cache.invalidate(self.info.table_id)
                backoff.sleep()

    def _continue(self, dest_uuid: str, scanner_id: str) -> Any:
        return tserver_pb2.ScanRequestPB(
            dest_uuid=dest_uuid,
            scanner_id=scanner_id,
            batch_size_bytes=self.batch_size_bytes,
            batches_max=self.page_batches,
        )

    def _fresh(self, tablet: TabletLocation) -> TabletLocation:
        for candidate in self.cache.locations(self.info).tablets:
            if candidate.tablet_id == tablet.tablet_id:
                return candidate
        raise errors.TabletNotFoundError(f"tablet {tablet.tablet_id} no longer exists")

    def _pick(
        self, tablet: TabletLocation, attempt: int, unreachable: set[str], follower: bool
    ) -> Any:
        if follower:
            followers = [r for r in tablet.replicas if r.uuid != tablet.leader_uuid]
            live = [r for r in followers if r.uuid not in unreachable] or followers
            if live:
                return live[attempt % len(live)]
        replica = pick_replica(tablet, attempt, unreachable)
        if replica is None:
            raise errors.ServiceUnavailableError(f"tablet {tablet.tablet_id} has no replicas")
        return replica

    def _request(
        self,
        tablet_id: str,
        dest_uuid: str,
        last_key: tuple[Any, ...] | None,
        limit: int | None,
        follower: bool,
    ) -> Any:
        scan = tserver_pb2.NewScanRequestPB(
            tablet_id=tablet_id,
            projection=self._fetch,
            predicates=self.predicates,
            limit_rows=0 if limit is None else limit,
            read_mode=tserver_pb2.READ_FOLLOWER if follower else tserver_pb2.READ_LATEST,
            max_staleness_ms=self.max_staleness_ms,
            schema_version=self.info.schema.version,
        )
        if last_key is not None:
            first = self.info.schema.key[0]
            op = ">" if len(self.info.schema.key) == 1 else ">="
            scan.predicates.append(predicate_to_pb(self.info.schema, (first, op, last_key[0])))
        return tserver_pb2.ScanRequestPB(
            dest_uuid=dest_uuid,
            new_scan=scan,
            batch_size_bytes=self.batch_size_bytes,
            batches_max=self.page_batches,
        )

    def _last_key(self, batch: pa.RecordBatch) -> tuple[Any, ...]:
        row = batch.num_rows - 1
        return tuple(_raw(batch.column(k)[row]) for k in self.info.schema.key)

    def _after(self, batch: pa.RecordBatch, last_key: tuple[Any, ...] | None) -> pa.RecordBatch:
        """The rows of ``batch`` whose key is above ``last_key`` (only needed for composite
        keys after a resume: a single-column key is resumed with ``>`` exactly)."""
        if last_key is None or len(self.info.schema.key) == 1:
            return batch
        key = self.info.schema.key
        above = pa.array([False] * batch.num_rows)
        equal_so_far = pa.array([True] * batch.num_rows)
        for name, value in zip(key, last_key, strict=True):
            column = batch.column(name)
            scalar = pa.scalar(value, type=column.type)
            above = pc.or_(above, pc.and_(equal_so_far, pc.greater(column, scalar)))
            equal_so_far = pc.and_(equal_so_far, pc.equal(column, scalar))
        return batch.filter(above)


def _raw(scalar: pa.Scalar) -> Any:
    if pa.types.is_timestamp(scalar.type):
        return scalar.value
    return scalar.as_py()


def _map_error(exc: Exception, addr: str) -> Exception:
    import grpc

    from nyala.rpc.errors import error_from_grpc

    if isinstance(exc, grpc.RpcError):
        return error_from_grpc(exc, target=addr)
    return exc


__all__ = ["Predicate", "Scanner", "predicate_to_pb"]
