"""Scans: projection, predicates and a row limit pushed to the tablets, results streamed back as
``pyarrow.RecordBatch``es, tablet after tablet in partition order (DESIGN.md §5).

Each tablet returns its rows in primary-key order. If the stream breaks (the leader died or
stepped down, a server became unreachable), the scan resumes on the new leader *after the last
key it returned*: the request carries the last key as its (inclusive) lower key bound, which
storage applies, and the one row equal to it, if it still exists, is dropped here; so no row is
returned twice or skipped. The key columns are fetched for this even when not projected, and
removed before the caller sees them.

Replica selection (DESIGN.md §5): ``replica="leader"`` (the default) reads through the leader,
linearizably (ReadIndex): every write acknowledged before the scan started is seen.
``"closest"`` (replicas on this host first), ``"any"`` (random order) and ``"follower"``
(followers first) send READ_FOLLOWER scans: a follower serves one at its own applied index if,
within ``max_staleness_ms``, it held everything its leader had committed; else it refuses
(``StaleReplicaError``) and the scan tries the next replica, finally the leader. Such a read is
Kudu's READ_LATEST on a follower: no ReadIndex, so it may miss writes acknowledged in the last
``max_staleness_ms`` (even the caller's own), and two tablets (or a resumed tablet) may be read
at different points in time; it never returns an uncommitted row.

Read modes (docs/consistency.md): ``read_mode="latest"`` is the above. ``"snapshot"`` reads
every tablet at one hybrid timestamp: ``snapshot_ts`` if given, else the one the first tablet's
server picks (its clock's now), reused for every other tablet, for a resumed tablet, and for
every later iteration of the same scanner; so the scan is repeatable and consistent across
tablets. ``"read_your_writes"`` is a snapshot the first tablet's server picks at or after the
latest timestamp this client has observed, so it sees the client's own writes; each iteration
picks anew. Snapshot scans may be served by followers whose safe time has passed the snapshot
(``replica=``). ``Table.diff_scan`` reads the rows that changed between two timestamps.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import itertools
import random
import socket
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from nyala import errors
from nyala._proto import tserver_pb2
from nyala.client.meta_cache import MetaCache, Replica, TableInfo, TabletLocation
from nyala.client.rpc import Backoff, ChannelPool, ObservedTimestamp
from nyala.client.write import pick_replica
from nyala.common.extras import require
from nyala.partition import range_key_interval, range_may_hold
from nyala.rpc.errors import error_from_pb
from nyala.schema import Schema, decimal_params, normalize_default, varchar_chars

#: Target Arrow bytes of one streamed batch.
SCAN_BATCH_BYTES = 4 * 1024 * 1024
#: Batches per Scan call; the scanner stays open on the server between pages, so a long scan
#: is a series of short calls and a server lost between two pages costs one page, not a stream.
SCAN_PAGE_BATCHES = 16
#: Longest wait for one page from one server; a server that stops answering (frozen, cut off)
#: costs this much before the scan moves on, instead of the whole scan's deadline.
SCAN_ATTEMPT_TIMEOUT_MS = 30_000
#: The staleness bound of a follower read when the caller names none.
FOLLOWER_STALENESS_MS_DEFAULT = 5_000
#: ``replica=`` choices: the leader, or a READ_FOLLOWER scan tried on replicas in this order.
REPLICA_SELECTIONS = ("leader", "closest", "any", "follower")
#: ``read_mode=`` choices (docs/consistency.md).
READ_MODES = ("latest", "snapshot", "read_your_writes")
#: The virtual column of a diff scan: True for a row deleted by the end of the window.
IS_DELETED_COLUMN = "is_deleted"
#: Partition pruning routes at most this many combinations of ``=``/``in`` values.
PRUNE_POINTS_MAX = 4096

_EPOCH_DATE = dt.date(1970, 1, 1)
_OPS = {
    "=": tserver_pb2.ColumnPredicatePB.EQ,
    "==": tserver_pb2.ColumnPredicatePB.EQ,
    "!=": tserver_pb2.ColumnPredicatePB.NE,
    "<>": tserver_pb2.ColumnPredicatePB.NE,
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


def predicate_to_pb(schema: Schema, predicate: Predicate) -> tserver_pb2.ColumnPredicatePB:
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


def _scalar(pb: tserver_pb2.ScalarPB, type_: str, value: Any) -> None:
    """Fills ``pb`` with ``value`` as a literal of a ``type_`` column: timestamps as int
    microseconds (UTC; a zoned value is converted, a naive one taken as UTC), dates as int
    days, decimals as exact decimal text of the column's scale."""
    try:
        if type_ == "timestamp":
            if isinstance(value, (dt.datetime, str)):
                value = pa.scalar(value, type=pa.timestamp("us", tz="UTC")).value
            if isinstance(value, bool) or int(value) != value:
                raise TypeError(value)
            pb.int_value = int(value)
        elif type_ == "date":
            if isinstance(value, str):
                value = dt.date.fromisoformat(value)
            if isinstance(value, dt.datetime) or not isinstance(value, dt.date):
                raise TypeError(value)
            pb.int_value = (value - _EPOCH_DATE).days
        elif decimal_params(type_) is not None:
            pb.string_value = str(normalize_default(type_, value))
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
        elif type_ == "string" or varchar_chars(type_) is not None:
            if not isinstance(value, str):
                raise TypeError(value)
            pb.string_value = value
        else:
            pb.binary_value = bytes(value)
    except (TypeError, ValueError, pa.ArrowInvalid, errors.InvalidArgumentError) as err:
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
        attempt_timeout_ms: int = SCAN_ATTEMPT_TIMEOUT_MS,
        batch_size_bytes: int = SCAN_BATCH_BYTES,
        page_batches: int = SCAN_PAGE_BATCHES,
        read_mode: str = "latest",
        snapshot_ts: int | None = None,
        diff_start_ts: int | None = None,
        observed: ObservedTimestamp | None = None,
    ) -> None:
        if read_mode not in READ_MODES:
            raise errors.InvalidArgumentError(
                f"read_mode must be one of {', '.join(READ_MODES)}; got {read_mode!r}"
            )
        if snapshot_ts is not None and (read_mode != "snapshot" or snapshot_ts <= 0):
            raise errors.InvalidArgumentError(
                "snapshot_ts needs read_mode='snapshot' and is a positive hybrid timestamp "
                "(nyala.timestamp_from_datetime)"
            )
        if diff_start_ts is not None and (snapshot_ts is None or diff_start_ts > snapshot_ts):
            raise errors.InvalidArgumentError("a diff scan needs start_ts <= end_ts")
        if replica not in REPLICA_SELECTIONS:
            raise errors.InvalidArgumentError(
                f"replica must be one of {', '.join(REPLICA_SELECTIONS)}; got {replica!r}"
            )
        if limit is not None and limit < 0:
            raise errors.InvalidArgumentError("limit must be >= 0")
        if max_staleness_ms < 0 or attempt_timeout_ms <= 0:
            raise errors.InvalidArgumentError(
                "max_staleness_ms must be >= 0 and attempt_timeout_ms > 0"
            )
        self.cache = cache
        self.pool = pool
        self.info = info
        schema = info.schema
        self.columns = list(columns) if columns else schema.names
        for name in self.columns:
            schema.column(name)
        self.predicates = [predicate_to_pb(schema, p) for p in where]
        self._where = list(where)
        self._points = _point_values(where)
        self.limit = limit
        self.replica = replica
        self.max_staleness_ms = max_staleness_ms or FOLLOWER_STALENESS_MS_DEFAULT
        self.timeout_ms = timeout_ms
        self.attempt_timeout_ms = attempt_timeout_ms
        #: Tablet id -> uuid of the server that served its rows in the last run.
        self.served_by: dict[str, str] = {}
        self.batch_size_bytes = batch_size_bytes
        self.page_batches = page_batches
        # Fetched columns: the projection plus any key column it lacks (for resuming).
        self._fetch = self.columns + [k for k in schema.key if k not in self.columns]
        self.output_schema = pa.schema([schema.to_arrow().field(c) for c in self.columns])
        self.read_mode = read_mode
        #: The hybrid timestamp a snapshot scan reads at: the one asked for, else the one
        #: the first tablet's server picked (None until then, and for latest reads).
        self.snapshot_ts = snapshot_ts
        self.diff_start_ts = diff_start_ts
        self._observed = observed or ObservedTimestamp()
        if diff_start_ts is not None:
            self.output_schema = self.output_schema.append(
                pa.field(IS_DELETED_COLUMN, pa.bool_(), nullable=False)
            )

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        remaining = self.limit
        self.served_by = {}
        if self.read_mode == "read_your_writes":
            self.snapshot_ts = None  # each run reads at or after what the client has seen
        for tablet in self.tablets():
            if remaining == 0:
                return
            for batch in self._scan_tablet(tablet, remaining):
                if remaining is not None:
                    batch = batch.slice(0, remaining)
                    remaining -= batch.num_rows
                if batch.num_rows:
                    # One schema for every batch, whichever replica or schema version sent it.
                    # Timestamps gain their UTC label here (a relabelling, no copy).
                    names = self.output_schema.names
                    columns = [
                        c if c.type == f.type else c.cast(f.type)
                        for c, f in zip(
                            batch.select(names).columns, self.output_schema, strict=True
                        )
                    ]
                    yield pa.RecordBatch.from_arrays(columns, schema=self.output_schema)
                if remaining == 0:
                    return

    def tablets(self) -> list[TabletLocation]:
        """The tablets this scan reads, in partition order: those partition pruning keeps.

        A range-partitioned table's layout may have changed since the client cached it
        (another client added or dropped a range), so it is asked of the master: a scan then
        reads an added range's tablets and never a dropped range's, even before the dropped
        tablets' replicas are tombstoned. Hash partitions never change: the cache serves."""
        ranged = bool(self.info.partition_schema.range_columns)
        locations = self.cache.locations(self.info, refresh=ranged)
        return self._prune(locations.tablets, locations.router)

    def to_reader(self) -> pa.RecordBatchReader:
        """The scan as a ``pyarrow.RecordBatchReader`` that reads a page at a time as it is
        consumed (client memory stays about one page, whatever the table's size)."""
        return pa.RecordBatchReader.from_batches(self.output_schema, iter(self))

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        """The Arrow PyCapsule stream protocol: ``pa.RecordBatchReader.from_stream(scanner)``,
        ``duckdb.sql("select ... from scanner")``, ``pl.DataFrame(scanner)`` read the scan
        streaming. Each call runs the scan again."""
        return self.to_reader().__arrow_c_stream__(requested_schema)

    def to_arrow(self) -> pa.Table:
        """Every row as one ``pyarrow.Table``."""
        batches = list(self)
        return pa.Table.from_batches(batches, schema=self.output_schema)

    def to_pandas(self) -> Any:
        """Every row as a pandas DataFrame (needs pandas: ``pip install 'nyala[pandas]'``;
        without it, ``MissingDependencyError`` before anything is read)."""
        require("pandas", extra="pandas", needed_by="Scanner.to_pandas")
        return self.to_arrow().to_pandas()

    def count(self) -> int:
        """The number of matching rows."""
        return sum(batch.num_rows for batch in self)

    def _scan_tablet(self, tablet: TabletLocation, limit: int | None) -> Iterator[pa.RecordBatch]:
        deadline = time.monotonic() + self.timeout_ms / 1000
        backoff = Backoff(deadline)
        last_key: pa.RecordBatch | None = None  # one row: the key columns of the last row sent
        attempt = 0
        unreachable: set[str] = set()
        # A follower read tries these servers in turn; one that refuses (stale, not running,
        # unreachable, NOT_SUPPORTED by an older server) passes the read on to the next, and
        # after the last the tablet is read from the leader (Kudu's CLOSEST_REPLICA fallback).
        candidates = self._candidates(tablet)
        while True:
            fresh = self._fresh(tablet)
            if fresh is None:
                return  # its range partition was dropped meanwhile: its rows are gone
            tablet = fresh
            follower = bool(candidates)
            if follower:
                target = candidates[0]
            else:
                target = self._pick_leader(tablet, attempt, unreachable)
                attempt += 1
            # A secure cluster's authz token for the table (renewed with the locations).
            token = self.cache.locations(self.info).authz_token
            request: tserver_pb2.ScanRequestPB | None = self._request(
                tablet.tablet_id, target.uuid, last_key, limit, follower, token
            )
            # A resumed scan's lower bound is inclusive: its first row may be the last one sent.
            resumed = last_key is not None
            stubs = self.pool.get(target.addr)
            try:
                while request is not None:
                    scanner_id, more = "", False
                    timeout_s = min(backoff.remaining_ms(), self.attempt_timeout_ms) / 1000
                    for response in stubs.tablet.Scan(request, timeout=timeout_s):
                        if response.HasField("error"):
                            raise error_from_pb(response.error)
                        self._observed.observe(response.propagated_timestamp)
                        if self.read_mode != "latest" and self.snapshot_ts is None:
                            # The first tablet's server picked the snapshot: every other
                            # tablet, and a resumed one, reads at the same timestamp.
                            self.snapshot_ts = response.snapshot_timestamp or None
                        scanner_id, more = response.scanner_id, response.has_more_results
                        if not response.batch:
                            continue
                        batch = pa.ipc.open_stream(response.batch).read_next_batch()
                        if resumed and batch.num_rows:
                            resumed = False
                            batch = self._drop_last_sent(batch, last_key)
                        if batch.num_rows == 0:
                            continue
                        last_key = self._last_key(batch)
                        if limit is not None:
                            limit -= batch.num_rows
                        self.served_by[tablet.tablet_id] = target.uuid
                        yield batch
                    # A page ended with the scanner still open: ask for the next page.
                    request = self._continue(target.uuid, scanner_id) if more else None
                return
            except Exception as exc:
                mapped = _map_error(exc, target.addr)
                if follower and isinstance(
                    mapped,
                    (*errors.RETRIABLE, errors.NotSupportedError, errors.ScannerExpiredError),
                ):
                    candidates.pop(0)
                    if backoff.expired():
                        raise mapped from None
                    continue
                resumable = isinstance(mapped, (*errors.RETRIABLE, errors.ScannerExpiredError))
                if not resumable or backoff.expired():
                    raise mapped from None
                if isinstance(mapped, (errors.NetworkError, errors.TimedOutError)):
                    unreachable.add(target.uuid)
                self.cache.invalidate(self.info.table_id)
                backoff.sleep()

    def _continue(self, dest_uuid: str, scanner_id: str) -> tserver_pb2.ScanRequestPB:
        return tserver_pb2.ScanRequestPB(
            dest_uuid=dest_uuid,
            scanner_id=scanner_id,
            batch_size_bytes=self.batch_size_bytes,
            batches_max=self.page_batches,
        )

    def _fresh(self, tablet: TabletLocation) -> TabletLocation | None:
        """``tablet`` as the cache knows it now; None if the table has it no more (the master
        lists a table's tablets until their range partition is dropped)."""
        for candidate in self.cache.locations(self.info).tablets:
            if candidate.tablet_id == tablet.tablet_id:
                return candidate
        return None

    def _prune(self, tablets: list[TabletLocation], router: Any) -> list[TabletLocation]:
        """The tablets the scan can match (partition pruning): when ``=``/``in`` predicates
        fix every partition column to a few values, only the tablets those values route to;
        then only the tablets whose range meets the ``=``, ``in``, ``<``, ``<=``, ``>`` and
        ``>=`` predicates on the first range column, and on each next one while the columns
        before it are fixed by ``=`` (``nyala.partition.range_key_interval``)."""
        return self._prune_ranges(self._prune_points(tablets, router))

    def _prune_ranges(self, tablets: list[TabletLocation]) -> list[TabletLocation]:
        columns = self.info.partition_schema.range_columns
        if not columns or len(tablets) < 2:
            return tablets
        types = [self.info.schema.column(c).type for c in columns]
        by_column = [
            [(str(p[1]), p[2]) for p in self._where if len(p) == 3 and p[0] == column]
            for column in columns
        ]
        interval = range_key_interval(types, by_column)
        return [t for t in tablets if range_may_hold(*t.partition.range_bounds(), interval)]

    def _prune_points(self, tablets: list[TabletLocation], router: Any) -> list[TabletLocation]:
        partitioning = self.info.partition_schema
        columns = list(
            dict.fromkeys(
                [c for level in partitioning.hash_levels for c in level.columns]
                + list(partitioning.range_columns)
            )
        )
        if len(tablets) < 2 or not columns or any(c not in self._points for c in columns):
            return tablets
        combos = 1
        for name in columns:
            combos *= len(self._points[name])
        if combos == 0:
            return []  # contradictory predicates: nothing matches
        if combos > PRUNE_POINTS_MAX:
            return tablets
        values = list(itertools.product(*(self._points[c] for c in columns)))
        try:
            arrays = [
                pa.array([v[i] for v in values], type=self.info.schema.column(c).arrow_type)
                for i, c in enumerate(columns)
            ]
            routes = router.route(pa.RecordBatch.from_arrays(arrays, names=columns))
        except (errors.NyalaError, pa.ArrowException, TypeError, ValueError):
            return tablets  # e.g. a value in no range partition: scan them all, to be safe
        wanted = set(routes.to_pylist())
        return [t for i, t in enumerate(tablets) if i in wanted]

    def _candidates(self, tablet: TabletLocation) -> list[Replica]:
        """The replicas a follower read tries, in order (empty for a leader read)."""
        if self.replica == "leader":
            return []
        replicas = list(tablet.replicas)
        random.shuffle(replicas)  # spreads reads over equally good replicas
        if self.replica == "follower":
            replicas.sort(key=lambda r: r.uuid == tablet.leader_uuid)
        elif self.replica == "closest":
            replicas.sort(key=lambda r: not _is_local(r.addr))
        return replicas

    @staticmethod
    def _pick_leader(tablet: TabletLocation, attempt: int, unreachable: set[str]) -> Replica:
        replica = pick_replica(tablet, attempt, unreachable)
        if replica is None:
            raise errors.ServiceUnavailableError(f"tablet {tablet.tablet_id} has no replicas")
        return replica

    def _request(
        self,
        tablet_id: str,
        dest_uuid: str,
        last_key: pa.RecordBatch | None,
        limit: int | None,
        follower: bool,
        authz_token: bytes = b"",
    ) -> tserver_pb2.ScanRequestPB:
        if limit is not None and last_key is not None:
            limit += 1  # the inclusive bound may return the last row sent again
        scan = tserver_pb2.NewScanRequestPB(
            tablet_id=tablet_id,
            projection=self._fetch,
            predicates=self.predicates,
            limit_rows=0 if limit is None else limit,
            read_mode=self._read_mode_pb(follower),
            max_staleness_ms=self.max_staleness_ms if follower else 0,
            schema_version=self.info.schema.version,
            authz_token=authz_token,
            snapshot_timestamp=self.snapshot_ts or 0,
            propagated_timestamp=self._observed.latest,
            diff_start_timestamp=self.diff_start_ts or 0,
        )
        if last_key is not None:
            scan.lower_bound_key = _ipc(last_key)
        return tserver_pb2.ScanRequestPB(
            dest_uuid=dest_uuid,
            new_scan=scan,
            batch_size_bytes=self.batch_size_bytes,
            batches_max=self.page_batches,
        )

    def _read_mode_pb(self, follower: bool) -> tserver_pb2.ReadMode.ValueType:
        if self.read_mode == "latest":
            return tserver_pb2.READ_FOLLOWER if follower else tserver_pb2.READ_LATEST
        if self.read_mode == "read_your_writes" and self.snapshot_ts is None:
            return tserver_pb2.READ_YOUR_WRITES
        return tserver_pb2.READ_AT_SNAPSHOT

    def _last_key(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch.select(self.info.schema.key).slice(batch.num_rows - 1, 1)

    def _drop_last_sent(
        self, batch: pa.RecordBatch, last_key: pa.RecordBatch | None
    ) -> pa.RecordBatch:
        """``batch`` (the first of a resumed scan) without its first row if that row is the
        last one already sent; rows are in key order, so no other row can be."""
        assert last_key is not None
        for name in self.info.schema.key:
            if batch.column(name)[0] != last_key.column(name)[0]:
                return batch
        return batch.slice(1)


def _point_values(where: Sequence[Predicate]) -> dict[str, list[Any]]:
    """Per column, the only values ``=``/``in`` predicates allow (intersected if several)."""
    points: dict[str, list[Any]] = {}
    for predicate in where:
        if len(predicate) != 3:
            continue
        op = str(predicate[1]).strip().lower()
        if op in ("=", "=="):
            allowed = [predicate[2]]
        elif op == "in":
            allowed = list(dict.fromkeys(predicate[2]))
        else:
            continue
        column = predicate[0]
        if column in points:
            allowed = [v for v in points[column] if v in allowed]
        points[column] = allowed
    return points


def _ipc(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


@functools.cache
def _local_hosts() -> frozenset[str]:
    """Names and addresses of this machine (for ``replica="closest"``)."""
    names = {"localhost", "::1", socket.gethostname()}
    # An unresolvable host name leaves loopback and the name itself.
    with contextlib.suppress(OSError):
        names.update(socket.gethostbyname_ex(socket.gethostname())[2])
    return frozenset(names)


def _is_local(addr: str) -> bool:
    host = addr.rsplit(":", 1)[0].strip("[]")
    return host.startswith("127.") or host in _local_hosts()


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
