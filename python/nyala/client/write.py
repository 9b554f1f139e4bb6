"""Sending row operations to tablet leaders, exactly once, with an outcome for every row
(DESIGN.md §4, docs/write-semantics.md).

The write contract: every row of a call ends **applied**, **failed** (with a code and a
reason), or **unknown** (its request got no answer before the deadline; it may or may not have
been applied). Nothing is dropped silently and a partial write is never hidden.

* Rows that break a rule of the table (``nyala.rowops.prepare_op_batch``: a value out of range,
  a null in a NOT NULL column, a cell or row over the size limits) are refused before sending;
  so are rows that no tablet covers (a gap between range partitions). Each is a ``RowError``.
  A tablet that disappears from the table while its rows are being sent (its range partition
  was dropped, perhaps by another client) fails its rows the same way, not the call.
* The other rows are split per tablet in Rust (``PartitionRouter.split_requests``: routing over
  whole columns, each row measured, one gather per request, IPC encoding, no per-row Python, the
  GIL released) into requests of bounded rows and bytes, and every tablet's requests go to its
  leader in order, tablets in parallel. Per-row failures the tablet reports (duplicate key on
  INSERT, missing key on UPDATE/DELETE) come back as ``RowError``s naming the caller's row.
* Each request gets a sequence number once, when it is built; every retry (after
  ``NOT_THE_LEADER``, an unreachable server, a timeout) resends the very same bytes with the
  same request id, so a request that was applied before its answer was lost is answered from the
  replicas' result cache and never applied twice. A request still unanswered at the deadline
  leaves its rows **unknown**, and the later requests to the same tablet are not sent (they
  would overtake it): their rows fail with ``ABORTED``. ``WriteResult.retry()`` resends exactly
  these requests, in order, under their request ids; until then the ids stay outstanding, so
  the replicas keep the outcomes a retry needs.
* A request the tablet refuses because it was encoded for another schema version is re-sent for
  the table's current version when its columns still fit it (a column was added, say), so a
  long-running writer survives schema changes.

``Table.write`` raises ``PartialWriteError`` (carrying the ``WriteResult``) when rows are left
unknown or unsent, and the request's own error when no row was applied and every failure was a
whole request's; otherwise it returns the result.
"""

from __future__ import annotations

import enum
import itertools
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from nyala import _native, errors
from nyala._proto import common_pb2, tserver_pb2
from nyala.client.meta_cache import (
    MetaCache,
    Replica,
    TableInfo,
    TableLocations,
    TabletLocation,
)
from nyala.client.rpc import Backoff, ChannelPool, ObservedTimestamp
from nyala.client.write_pipe import WritePipe
from nyala.rowops import OP_COLUMN, OpType, PreparedRows, check_columns, prepare_op_batch
from nyala.rpc.credentials import channel_tls_config
from nyala.rpc.errors import error_to_pb
from nyala.schema import Schema

#: Most rows and most Arrow bytes of one Write request: each tablet's rows are cut into
#: requests of at most this much (fewer, larger requests: each is one Raft round and one
#: fsync). Any valid row (``nyala._native.ROW_BYTES_MAX``) fits in one request.
WRITE_REQUEST_ROWS_MAX = 256 * 1024
WRITE_REQUEST_BYTES_MAX = 16 * 1024 * 1024
#: A write of at most this many rows, given as a dict of lists, goes by ``Writer.write_small``.
SMALL_WRITE_ROWS_MAX = 64
_SHAPES_MAX = 1024  # request shapes the writer keeps for small writes
_NO_ROWS = np.zeros(0, dtype=np.int64)


def _row_range(rows: int) -> np.ndarray[Any, Any]:
    positions = np.arange(rows, dtype=np.uint32)
    positions.setflags(write=False)  # shared by every request of that many rows
    return positions


#: The positions of a small write's rows when they all go to one tablet (0, 1, ... in order).
_ROWS = tuple(_row_range(n) for n in range(SMALL_WRITE_ROWS_MAX + 1))

#: The reason of a row no tablet covers.
NO_TABLET_MESSAGE = "no tablet covers the row's key (it falls between the table's range partitions)"

#: Errors with which a server refuses a write before proposing it: an attempt that ends so did
#: not apply the request. Every other failed attempt may have (its outcome is unknown).
_NOT_PROPOSED = (
    errors.WrongServerUuidError,
    errors.TabletNotFoundError,
    errors.TabletNotRunningError,
    errors.SchemaMismatchError,
    errors.ServiceUnavailableError,  # not serving yet, or over its soft memory limit
)


class RowOutcome(enum.IntEnum):
    """What happened to one row of a write (``WriteResult.outcomes``)."""

    APPLIED = 0
    #: Not applied; ``WriteResult.row_errors`` says why.
    FAILED = 1
    #: Its request got no answer: it may or may not have been applied (``WriteResult.unknown``).
    UNKNOWN = 2


@dataclass(frozen=True)
class RowError:
    """One row that was not applied (or whose outcome is unknown): its position in the
    caller's data, an ``ErrorCode`` name, why, and the row's key values."""

    row: int
    code: str
    message: str
    key: Mapping[str, Any] = field(default_factory=dict)


#: Numbers done that ``RequestTracker``'s queue may hold beyond twice the outstanding ones.
_TRACKER_SLACK = 1024


class RequestTracker:
    """Sequence numbers for one client id, and the lowest one still awaiting an answer.

    Numbers are handed out in increasing order, so they queue in that order; the lowest
    outstanding one is the queue's head once the numbers done are dropped from its front.
    Asked on every send, that is O(1) amortized, where a minimum over every outstanding
    number cost O(n) per send to a client with thousands of writes in flight. The queue keeps
    numbers done behind an outstanding one until it is done too, so it is rebuilt from the
    outstanding numbers when it holds more than twice as many (plus a margin).
    """

    def __init__(self) -> None:
        self.client_id = uuid.uuid4().hex
        self._next = itertools.count(1)
        self._outstanding: set[int] = set()
        self._order: deque[int] = deque()  # every outstanding number, ascending, and some done
        self._lock = threading.Lock()

    def new(self) -> int:
        """A fresh sequence number, outstanding until ``done``."""
        with self._lock:
            seq_no = next(self._next)
            self._outstanding.add(seq_no)
            self._order.append(seq_no)
            if len(self._order) > 2 * len(self._outstanding) + _TRACKER_SLACK:
                self._order = deque(sorted(self._outstanding))
            return seq_no

    def done(self, seq_no: int) -> None:
        """The request will never be sent again (answered, or given up)."""
        with self._lock:
            self._outstanding.discard(seq_no)

    def first_incomplete(self, default: int) -> int:
        """The lowest outstanding sequence number (``default`` if none is)."""
        with self._lock:
            order, outstanding = self._order, self._outstanding
            while order and order[0] not in outstanding:
                order.popleft()
            return order[0] if order else default

    @property
    def outstanding(self) -> int:
        """How many requests are outstanding (for tests)."""
        with self._lock:
            return len(self._outstanding)


@dataclass(frozen=True)
class _Shape:
    """What every request of one write holds: its columns, and whether any row updates."""

    columns: tuple[tuple[str, pa.DataType], ...]
    has_updates: bool
    only_deletes: bool

    def fits(self, schema: Schema) -> bool:
        """Whether requests of this shape are valid for ``schema`` (a later version)."""
        by_name = {c.name: c for c in schema.columns}
        for name, arrow_type in self.columns:
            column = by_name.get(name)
            if column is None or column.arrow_type != arrow_type:
                return False
        given = {name for name, _ in self.columns}
        for i, column in enumerate(schema.columns):
            if column.name in given or (self.only_deletes and i >= len(schema.key)):
                continue
            if i < len(schema.key) or self.has_updates:
                return False
            if not column.nullable and column.default is None:
                return False
        return True


@dataclass(eq=False)
class _Request:
    """One request: the rows of one tablet it carries (as IPC bytes), and where they came
    from. ``seq_no`` and ``ops`` never change; a retry resends them."""

    tablet_id: str
    seq_no: int
    ops: bytes
    positions: np.ndarray[Any, Any]  # caller's row index of each row of ``ops``
    shape: _Shape
    schema_version: int
    #: Some attempt may have reached a leader that proposed it (its outcome may be unknown).
    maybe_sent: bool = False
    #: The table's authz token when the request was made (a secure cluster; else empty).
    authz_token: bytes = b""


@dataclass
class _Settled:
    """The outcome of one request: a response, or the error that ended it."""

    request: _Request
    response: tserver_pb2.WriteResponsePB | None = None
    error: BaseException | None = None
    #: Not answered: the request must be retried (its rows unknown, or failed if never sent).
    pending: bool = False
    #: Its tablet left the table (range partition dropped): its rows failed, one by one.
    dropped: bool = False


class _Outcomes:
    """Per-row outcomes of a write being assembled."""

    def __init__(self, rows: int) -> None:
        self.state = np.zeros(rows, dtype=np.uint8)  # RowOutcome per row
        self.reasons: dict[int, tuple[str, str]] = {}  # row -> (code, message)
        #: The first error that ended a whole request, and whether any row was refused alone.
        self.request_error: BaseException | None = None
        self.row_failures = False
        #: The latest timestamp of the requests answered (0: none was).
        self.timestamp = 0

    def set(self, rows: Iterable[int], outcome: RowOutcome, code: str, message: str) -> None:
        for row in rows:
            self.state[row] = outcome
            self.reasons[row] = (code, message)

    def copy(self) -> _Outcomes:
        out = _Outcomes(len(self.state))
        out.state = self.state.copy()
        out.reasons = dict(self.reasons)
        out.row_failures = self.row_failures
        out.timestamp = self.timestamp
        return out


def error_code(exc: BaseException) -> str:
    """The ``ErrorCode`` name of an exception (``UNKNOWN_ERROR`` for unmapped ones)."""
    return common_pb2.ErrorCode.Name(error_to_pb(exc).code)


class WriteResult:
    """The outcome of a write, row by row: applied, failed (``row_errors``, with
    ``failed_rows`` holding their values) or unknown (``unknown``, ``unknown_rows``).
    ``outcomes[i]`` is row i's ``RowOutcome``. ``retry()`` resends the requests that got no
    answer, under their request ids."""

    def __init__(
        self,
        outcomes: _Outcomes,
        source: pa.RecordBatch | None,
        key: list[str],
        retry_with: _Retry | None = None,
        converted: pa.RecordBatch | None = None,
    ) -> None:
        self._outcomes = outcomes
        self._source = source  # the caller's rows as given
        self._converted = source if converted is None else converted  # in the table's types
        self._key = key
        self._retry_with = retry_with
        self.rows = len(outcomes.state)
        #: The write's hybrid timestamp (the latest of its tablets' if it spanned several; 0
        #: if no tablet answered): a snapshot scan at it or later sees every applied row.
        self.timestamp = outcomes.timestamp
        if outcomes.reasons:  # every row failed or unknown has its reason
            failed = _positions(outcomes.state, RowOutcome.FAILED)
            unknown = _positions(outcomes.state, RowOutcome.UNKNOWN)
        else:
            failed = unknown = _NO_ROWS
        self.row_errors = self._errors(failed)
        self.unknown = self._errors(unknown)
        self.failed_rows = _take(source, failed)
        self.unknown_rows = _take(source, unknown)

    @classmethod
    def of(
        cls,
        source: pa.RecordBatch,
        key: list[str],
        failed: Iterable[RowError] = (),
        unknown: Iterable[RowError] = (),
    ) -> WriteResult:
        """A result over ``source``'s rows in which ``failed`` failed, ``unknown`` are
        unknown and the rest applied (for stand-ins of a cluster; it has nothing to retry)."""
        outcomes = _Outcomes(source.num_rows)
        for error in failed:
            outcomes.set((error.row,), RowOutcome.FAILED, error.code, error.message)
            outcomes.row_failures = True
        for error in unknown:
            outcomes.set((error.row,), RowOutcome.UNKNOWN, error.code, error.message)
        rows = source.drop_columns([OP_COLUMN]) if OP_COLUMN in source.schema.names else source
        return cls(outcomes, rows, key)

    @classmethod
    def all_applied(cls, rows: int, timestamp: int, key: list[str]) -> WriteResult:
        """A result in which all ``rows`` rows were applied at ``timestamp`` (a small write
        that one answer settled: nothing failed, so no row needs keeping)."""
        outcomes = _Outcomes(rows)
        outcomes.timestamp = timestamp
        return cls(outcomes, None, key)

    @classmethod
    def concat(cls, parts: Sequence[WriteResult]) -> WriteResult:
        """One result over the rows of ``parts`` in order (the chunks of a streamed write):
        row positions count from the first part's first row; only rows that failed or are
        unknown keep their values (``failed_rows``, ``unknown_rows``). Nothing to retry: a
        streamed write raises on a chunk with unknown rows."""
        merged = cls.__new__(cls)
        outcomes = _Outcomes(0)
        outcomes.state = np.concatenate(
            [p._outcomes.state for p in parts] or [np.zeros(0, dtype=np.uint8)]
        )
        row_errors: list[RowError] = []
        unknown: list[RowError] = []
        offset = 0
        for part in parts:
            outcomes.reasons.update({offset + r: why for r, why in part._outcomes.reasons.items()})
            outcomes.row_failures |= part._outcomes.row_failures
            if outcomes.request_error is None:
                outcomes.request_error = part._outcomes.request_error
            row_errors += [replace(e, row=e.row + offset) for e in part.row_errors]
            unknown += [replace(e, row=e.row + offset) for e in part.unknown]
            offset += part.rows
        merged._outcomes = outcomes
        merged._source = merged._converted = None
        merged._key = parts[0]._key if parts else []
        merged._retry_with = None
        merged.rows = offset
        merged.timestamp = outcomes.timestamp = max((p.timestamp for p in parts), default=0)
        merged.row_errors = row_errors
        merged.unknown = unknown
        merged.failed_rows = _concat_tables([p.failed_rows for p in parts])
        merged.unknown_rows = _concat_tables([p.unknown_rows for p in parts])
        return merged

    def _drop_input(self) -> None:
        """Lets go of the rows as given and of the requests (``retry()`` then has nothing to
        resend); the outcomes and the failed and unknown rows stay. A streamed write calls it
        on each chunk's result, or every chunk would stay in memory until the stream ends."""
        self._source = self._converted = None
        self._retry_with = None

    @property
    def outcomes(self) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """One ``RowOutcome`` per input row (a copy)."""
        return self._outcomes.state.copy()

    @property
    def ok(self) -> bool:
        """True if every row was applied."""
        return not self.row_errors and not self.unknown

    @property
    def applied(self) -> int:
        """How many rows were applied (not counting unknown ones that may have been)."""
        return int(np.count_nonzero(self._outcomes.state == RowOutcome.APPLIED))

    @property
    def retriable(self) -> bool:
        """True if some requests got no answer (their rows unknown or unsent): see ``retry``."""
        return self._retry_with is not None and bool(self._retry_with.requests)

    def retry(self, *, timeout_ms: int | None = None) -> WriteResult:
        """Resends the requests that got no answer (rows unknown, and rows not sent after
        them) under their original request ids, in order, so that nothing is applied twice;
        returns the whole call's result with those rows settled. Raises like the write
        (``PartialWriteError`` if rows are still unknown)."""
        if not self.retriable:
            return self
        assert self._retry_with is not None
        result = self._retry_with.run(self, timeout_ms)
        return result.check()

    def check(self) -> WriteResult:
        """Returns self, or raises as ``Table.write`` does: ``PartialWriteError`` if requests
        got no answer; the first request's error if nothing was applied and every failure
        was a whole request's."""
        if self.retriable:
            raise errors.PartialWriteError(self._summary(), result=self)
        error = self._outcomes.request_error
        if error is not None and not self.applied and not self._outcomes.row_failures:
            raise error
        return self

    def raise_for_errors(self) -> WriteResult:
        """Raises the first failed row's error as its ``nyala.errors`` class (or
        ``PartialWriteError`` if rows are unknown); returns self if every row was applied."""
        if self.unknown:
            raise errors.PartialWriteError(self._summary(), result=self)
        if self.row_errors:
            from nyala.rpc.errors import error_from_pb

            first = self.row_errors[0]
            pb = common_pb2.ErrorPB(code=common_pb2.ErrorCode.Value(first.code))
            exc = error_from_pb(pb)
            raise type(exc)(
                f"{len(self.row_errors)} of {self.rows} rows failed; row {first.row} "
                f"{dict(first.key)}: {first.code}: {first.message}"
            )
        return self

    def _summary(self) -> str:
        shown = self.unknown or self.row_errors
        why = f"; row {shown[0].row}: {shown[0].code}: {shown[0].message}" if shown else ""
        return (
            f"write of {self.rows} rows: {self.applied} applied, {len(self.row_errors)} failed, "
            f"{len(self.unknown)} unknown{why}"
        )

    def _errors(self, positions: np.ndarray[Any, Any]) -> list[RowError]:
        if not len(positions):
            return []
        keys = self._keys(positions)
        reasons = self._outcomes.reasons
        out = []
        for i, row in enumerate(positions.tolist()):
            code, message = reasons.get(row, ("UNKNOWN_ERROR", ""))
            out.append(RowError(row, code, message, keys[i] if keys else {}))
        return out

    def _keys(self, positions: np.ndarray[Any, Any]) -> list[dict[str, Any]]:
        """The key values of the rows at ``positions``, in the table's types where they
        converted (as given where they did not)."""
        if not self._key:
            return []
        # Kept whenever a row failed or is unknown (Writer._finish).
        assert self._converted is not None, "rows kept"
        assert self._source is not None, "rows kept"
        taken = pa.array(positions, pa.int64())
        keys: list[dict[str, Any]] = self._converted.select(self._key).take(taken).to_pylist()
        if any(None in k.values() for k in keys):
            given = self._source.select(self._key).take(taken).to_pylist()
            keys = [g if None in k.values() else k for k, g in zip(keys, given, strict=True)]
        return keys

    def __repr__(self) -> str:
        return (
            f"WriteResult(rows={self.rows}, applied={self.applied}, "
            f"failed={len(self.row_errors)}, unknown={len(self.unknown)})"
        )


def _positions(state: np.ndarray[Any, Any], outcome: RowOutcome) -> np.ndarray[Any, Any]:
    return np.flatnonzero(state == outcome)


def _concat_tables(tables: Sequence[pa.Table | None]) -> pa.Table | None:
    present = [t for t in tables if t is not None]
    return pa.concat_tables(present, promote_options="permissive") if present else None


def _take(source: pa.RecordBatch, positions: np.ndarray[Any, Any]) -> pa.Table | None:
    if not len(positions):
        return None
    return pa.Table.from_batches([source.take(pa.array(positions, pa.int64()))])


@dataclass
class _Retry:
    """What ``WriteResult.retry`` needs: the writer, the table and the unanswered requests in
    per-tablet order."""

    writer: Writer
    info: TableInfo
    requests: list[_Request]

    def run(self, previous: WriteResult, timeout_ms: int | None) -> WriteResult:
        outcomes = previous._outcomes.copy()
        outcomes.request_error = None
        for request in self.requests:
            outcomes.set(request.positions.tolist(), RowOutcome.APPLIED, "", "")
            for row in request.positions.tolist():
                outcomes.reasons.pop(row, None)
        per_tablet: dict[str, list[_Request]] = {}
        for request in self.requests:
            per_tablet.setdefault(request.tablet_id, []).append(request)
        return self.writer._finish(
            self.info,
            per_tablet,
            outcomes,
            (previous._source, previous._converted),
            previous._key,
            timeout_ms,
        )


#: A result's rows (as given, as converted), or a function making them (``Writer._finish``).
_Sources = (
    tuple[pa.RecordBatch | None, pa.RecordBatch | None]
    | Callable[[], tuple[pa.RecordBatch, pa.RecordBatch]]
)


class Writer:
    """Writes op batches of any table through one client's channels and caches."""

    def __init__(
        self,
        cache: MetaCache,
        pool: ChannelPool,
        executor: ThreadPoolExecutor,
        *,
        timeout_ms: int,
        observed: ObservedTimestamp | None = None,
        channel: bool = True,
    ) -> None:
        self.cache = cache
        self.pool = pool
        self.executor = executor
        self.timeout_ms = timeout_ms
        self.observed = observed or ObservedTimestamp()
        self.requests = RequestTracker()
        self._pipes: dict[str, WritePipe] = {}
        self._pipes_lock = threading.Lock()
        # Calls on the servers' peer channels (write_pipe); on a secure cluster with this
        # client's certificate, loaded once.
        tls = pool.settings.tls
        self._channel = channel and (tls is None or bool(tls.cert_pem))
        self._channel_tls = None
        if self._channel and tls is not None:
            self._channel_tls = channel_tls_config(tls, server=False)
        self._shapes: dict[
            tuple[str, int, tuple[str, ...], OpType], tuple[_Shape, tuple[str, ...]]
        ] = {}

    def write(
        self, info: TableInfo, prepared: PreparedRows, *, timeout_ms: int | None = None
    ) -> WriteResult:
        """Applies ``prepared``'s rows (an op batch of ``info``'s table) and waits for every
        tablet; every row ends applied, failed or unknown (see the module doc). Raises only
        for a failure before any row was sent."""
        batch = prepared.batch
        outcomes = _Outcomes(batch.num_rows)
        for problem in prepared.problems:
            outcomes.set((problem.row,), RowOutcome.FAILED, problem.code, problem.message)
        outcomes.row_failures = bool(prepared.problems)
        per_tablet = self._requests(info, prepared, outcomes)
        sources = (prepared.input, prepared.batch)
        return self._finish(info, per_tablet, outcomes, sources, info.schema.key, timeout_ms)

    def write_small(
        self,
        info: TableInfo,
        data: dict[str, Any],
        op: OpType,
        *,
        timeout_ms: int | None = None,
    ) -> WriteResult | None:
        """``write`` for a few rows given as a dict of lists, without pyarrow: the rows are
        converted, checked, routed and encoded in one native call (``split_small_rows``),
        whose pyarrow counterparts each gave up the GIL and so cost a thread switch when many
        threads write (docs/performance.md, "Small writes from many threads"). The rows as
        pyarrow batches are built only if the result needs them (a row failed or is
        unknown); rows that all go to one tablet are sent from here, and a write that one
        answer settles whole makes its result without the general assembly. Returns None,
        having sent nothing, for input this path does not take
        (more than ``SMALL_WRITE_ROWS_MAX`` rows, values other than lists of plain Python
        values, a row that does not convert or breaks a rule, a row no tablet covers): the
        caller then takes ``prepare_op_batch`` and ``write``. Raises what ``prepare_op_batch``
        raises for the columns."""
        rows = -1
        for values in data.values():
            if type(values) is not list:
                return None
            rows = len(values)
        if not 0 < rows <= SMALL_WRITE_ROWS_MAX or OP_COLUMN in data:
            return None
        schema = info.schema
        shape, order = self._shape(info, tuple(data), op)
        given = [(name, data[name]) for name in order]
        locations = self.cache.locations(info)
        split = locations.router.split_small_rows(
            schema.to_native(), given, int(op), WRITE_REQUEST_ROWS_MAX, WRITE_REQUEST_BYTES_MAX
        )
        if split is None or split[1]:
            return None

        def sources() -> tuple[pa.RecordBatch, pa.RecordBatch]:
            prepared = prepare_op_batch(data, op, schema)
            return prepared.input, prepared.batch

        pieces = split[0]
        if len(pieces) == 1:  # one tablet: the rows in order, and no thread but the caller's
            partition, _, ops = pieces[0]
            at = _ROWS[rows]
            request = self._add_request({}, locations, partition, at, ops, shape, info)
            try:
                response = self._send(info, request, self._deadline(timeout_ms))
            except errors.NyalaError as exc:
                settled = _failed(request, exc)
            except BaseException:
                self._release_when_dropped([request])
                raise
            else:
                if not response.per_row_errors:
                    self.requests.done(request.seq_no)
                    return WriteResult.all_applied(rows, response.timestamp, schema.key)
                settled = _Settled(request, response=response)
            return self._assemble(info, [settled], _Outcomes(rows), sources, schema.key)
        per_tablet: dict[str, list[_Request]] = {}
        try:
            for partition, positions, ops in pieces:
                at = np.array(positions, dtype=np.uint32)
                self._add_request(per_tablet, locations, partition, at, ops, shape, info)
        except BaseException:
            self._never_sent(per_tablet)
            raise
        return self._finish(info, per_tablet, _Outcomes(rows), sources, schema.key, timeout_ms)

    def _shape(
        self, info: TableInfo, names: tuple[str, ...], op: OpType
    ) -> tuple[_Shape, tuple[str, ...]]:
        """The shape of a small write's requests, and ``names`` in the table's column order;
        raises ``prepare_op_batch``'s errors for columns the table lacks or the rows must
        carry."""
        key = (info.table_id, info.schema.version, names, op)
        known = self._shapes.get(key)
        if known is None:
            schema = info.schema
            only_deletes = op.is_delete
            has_updates = op in (OpType.UPDATE, OpType.UPDATE_IGNORE)
            check_columns(set(names), schema, only_deletes, has_updates, False)
            columns = tuple((c.name, c.arrow_type) for c in schema.columns if c.name in names)
            known = (_Shape(columns, has_updates, only_deletes), tuple(n for n, _ in columns))
            if len(self._shapes) >= _SHAPES_MAX:
                self._shapes.clear()
            self._shapes[key] = known
        return known

    def _finish(
        self,
        info: TableInfo,
        per_tablet: dict[str, list[_Request]],
        outcomes: _Outcomes,
        sources: _Sources,
        key: list[str],
        timeout_ms: int | None,
    ) -> WriteResult:
        """Sends ``per_tablet``'s requests and assembles the result over ``sources`` (the
        caller's rows as given, and as converted to the table's types; a function making
        them, called only if the result needs them)."""
        deadline = self._deadline(timeout_ms)
        settled: list[_Settled] = []
        try:
            if len(per_tablet) == 1:
                # Sent from the caller's thread: concurrent callers then meet in the write pipe
                # (their writes coalesce) instead of queueing for the executor's few threads.
                settled = self._send_all(info, next(iter(per_tablet.values())), deadline)
            elif per_tablet:
                futures: list[Future[list[_Settled]]] = [
                    self.executor.submit(self._send_all, info, requests, deadline)
                    for requests in per_tablet.values()
                ]
                for future in futures:
                    settled.extend(future.result())
        except BaseException:
            for requests in per_tablet.values():
                self._release_when_dropped(requests)
            raise
        return self._assemble(info, settled, outcomes, sources, key)

    def _assemble(
        self,
        info: TableInfo,
        settled: list[_Settled],
        outcomes: _Outcomes,
        sources: _Sources,
        key: list[str],
    ) -> WriteResult:
        """The result of a write whose requests are ``settled``; releases the answered ones
        (and holds the others for ``WriteResult.retry``)."""
        pending = [s.request for s in settled if s.pending]
        self._release_when_dropped(pending)
        for one in settled:
            self._record(one, outcomes)
        for request in (s.request for s in settled if not s.pending):
            self.requests.done(request.seq_no)
        retry = _Retry(self, info, pending) if pending else None
        if callable(sources):
            needed = bool(outcomes.reasons) or retry is not None
            sources = sources() if needed else (None, None)
        source, converted = sources
        return WriteResult(outcomes, source, key, retry, converted)

    def _requests(
        self, info: TableInfo, prepared: PreparedRows, outcomes: _Outcomes
    ) -> dict[str, list[_Request]]:
        batch = prepared.batch
        per_tablet: dict[str, list[_Request]] = {}
        selection = prepared.selection()
        if batch.num_rows == 0 or (selection is not None and not len(selection)):
            return per_tablet
        asked_at = time.monotonic()
        locations = self.cache.locations(info)

        def split(locations: Any) -> tuple[Any, np.ndarray[Any, Any]]:
            pieces, unrouted = locations.router.split_requests(
                batch,
                WRITE_REQUEST_ROWS_MAX,
                WRITE_REQUEST_BYTES_MAX,
                selection=None if selection is None else pa.array(selection, pa.uint32()),
            )
            return pieces, np.asarray(unrouted)

        pieces, gaps = split(locations)
        if len(gaps) and locations.fetched_at < asked_at:
            # A range may have been added since the locations were cached (by another
            # client): ask the master once before refusing the rows (Kudu's client looks up
            # a key it has no tablet for, too).
            self.cache.invalidate(info.table_id)
            locations = self.cache.locations(info)
            pieces, gaps = split(locations)
        if len(gaps):
            outcomes.row_failures = True
            outcomes.set(gaps.tolist(), RowOutcome.FAILED, "NOT_FOUND", NO_TABLET_MESSAGE)
        shape = _shape(prepared)
        try:
            for partition, positions, ops in pieces:
                self._add_request(
                    per_tablet, locations, partition, np.asarray(positions), ops, shape, info
                )
        except BaseException:  # interrupted: nothing was sent
            self._never_sent(per_tablet)
            raise
        return per_tablet

    def _add_request(
        self,
        per_tablet: dict[str, list[_Request]],
        locations: TableLocations,
        partition: int,
        positions: np.ndarray[Any, Any],
        ops: bytes,
        shape: _Shape,
        info: TableInfo,
    ) -> _Request:
        """A request for ``ops`` (the caller's rows at ``positions``) to ``partition``'s
        tablet, under a new sequence number, added to that tablet's list in ``per_tablet``."""
        request = _Request(
            locations.tablets[partition].tablet_id,
            self.requests.new(),
            ops,
            positions,
            shape,
            info.schema.version,
            authz_token=locations.authz_token,
        )
        per_tablet.setdefault(request.tablet_id, []).append(request)
        return request

    def _deadline(self, timeout_ms: int | None) -> float:
        """When a write given ``timeout_ms`` (None: the client's) gives up, on the monotonic
        clock."""
        return time.monotonic() + (timeout_ms or self.timeout_ms) / 1000

    def _never_sent(self, per_tablet: dict[str, list[_Request]]) -> None:
        """Releases requests made for a write that stopped before sending them."""
        for requests in per_tablet.values():
            for request in requests:
                self.requests.done(request.seq_no)

    def _release_when_dropped(self, requests: list[_Request]) -> None:
        """Requests that may be sent again (a result's ``retry()``) stay outstanding until no
        result holds them any more. Answered ones are released at once (``_finish``): a
        finalizer for each request cost a few microseconds of every small write."""
        for request in requests:
            weakref.finalize(request, self.requests.done, request.seq_no)

    def _send_all(
        self, info: TableInfo, requests: list[_Request], deadline: float
    ) -> list[_Settled]:
        """Sends one tablet's requests in order. After one that got no answer, the rest are
        not sent: they could overtake it (a later write of a key applied before an earlier)."""
        settled: list[_Settled] = []
        blocked = False
        for request in requests:
            if blocked:
                settled.append(_Settled(request, pending=True))
                continue
            try:
                settled.append(_Settled(request, response=self._send(info, request, deadline)))
            except errors.NyalaError as exc:
                # Without its traceback: through this frame, it would keep ``settled`` (and
                # every request's rows) in a cycle until the cyclic collector runs.
                settled.append(_failed(request, errors.kept_as_answer(exc)))
            blocked = settled[-1].pending
        return settled

    def _record(self, settled: _Settled, outcomes: _Outcomes) -> None:
        request = settled.request
        if settled.response is not None:
            outcomes.timestamp = max(outcomes.timestamp, settled.response.timestamp)
            for e in settled.response.per_row_errors:
                code = common_pb2.ErrorCode.Name(e.code)
                row = int(request.positions[e.row_index])
                outcomes.set((row,), RowOutcome.FAILED, code, e.message)
                outcomes.row_failures = True
            return
        rows = request.positions.tolist()
        if settled.dropped:
            # Whether or not an earlier attempt reached the tablet, its rows are gone with it.
            outcomes.set(rows, RowOutcome.FAILED, "NOT_FOUND", str(settled.error))
            outcomes.row_failures = True
            return
        if settled.error is None:  # not sent: an earlier request of its tablet got no answer
            outcomes.set(
                rows,
                RowOutcome.FAILED,
                "ABORTED",
                "not sent: an earlier write to its tablet has an unknown outcome "
                "(WriteResult.retry() sends both, in order)",
            )
            return
        error = settled.error
        outcomes.request_error = outcomes.request_error or error
        if settled.pending and request.maybe_sent:
            outcomes.set(rows, RowOutcome.UNKNOWN, error_code(error), f"outcome unknown: {error}")
        else:
            outcomes.set(rows, RowOutcome.FAILED, error_code(error), str(error))

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
            # The WriteRequestPB without its rows, encoded by the extension: building and
            # serializing protobuf's messages was most of this method's own time per write.
            head = _native.write_request_head(
                replica.uuid,
                request.tablet_id,
                self.requests.client_id,
                request.seq_no,
                self.requests.first_incomplete(request.seq_no),
                attempt,
                request.schema_version,
                request.authz_token,
                self.observed.latest,
            )
            attempt += 1
            try:
                response = self.pipe(replica.addr).write_encoded(
                    replica.uuid, head, request.ops, backoff.remaining_ms()
                )
                self.observed.observe(response.timestamp)
                return response
            except errors.SchemaMismatchError:
                if not self._adopt_schema(info, request):
                    raise
                if backoff.expired():
                    raise
                backoff.sleep()
            except errors.RETRIABLE as exc:
                if not isinstance(exc, _NOT_PROPOSED):
                    request.maybe_sent = True
                if isinstance(exc, (errors.NetworkError, errors.TimedOutError)):
                    unreachable.add(replica.uuid)
                self._on_retriable(info, tablet, exc)
                if backoff.expired():
                    raise errors.TimedOutError(
                        f"write to tablet {request.tablet_id} not acknowledged before the "
                        f"deadline: {exc}"
                    ) from exc
                if not isinstance(exc, errors.NotLeaderError) or not exc.leader_uuid:
                    backoff.sleep()
            except errors.NyalaError:
                raise
            except Exception as exc:  # a transport bug: the request may have gone out
                request.maybe_sent = True
                raise errors.NetworkError(f"write to {replica.addr} failed: {exc!r}") from exc

    def _adopt_schema(self, info: TableInfo, request: _Request) -> bool:
        """After ``MISMATCHED_SCHEMA``: True if the request may be sent again, for the table's
        current schema version (its columns still fit), or as it is (the tablet has not caught
        up with the version it was encoded for)."""
        fresh = self.cache.table(info.name, refresh=True)
        if fresh.table_id != info.table_id:
            return False
        if fresh.schema.version == request.schema_version:
            return True  # the tablet is behind the master: wait for it
        if not request.shape.fits(fresh.schema):
            return False
        request.schema_version = fresh.schema.version
        return True

    def pipe(self, addr: str) -> WritePipe:
        """The write pipe to the server at ``addr``: concurrent writes to it share calls."""
        pipe = self._pipes.get(addr)
        if pipe is None:
            with self._pipes_lock:
                pipe = self._pipes.get(addr)
                if pipe is None:
                    stubs = self.pool.get(addr)
                    pipe = WritePipe(stubs, channel=self._channel, tls=self._channel_tls)
                    self._pipes[addr] = pipe
        return pipe

    def close(self) -> None:
        """Closes the pipes' connections."""
        with self._pipes_lock:
            pipes, self._pipes = list(self._pipes.values()), {}
        for pipe in pipes:
            pipe.close()

    def _tablet(self, info: TableInfo, tablet_id: str) -> TabletLocation:
        for tablet in self.cache.locations(info).tablets:
            if tablet.tablet_id == tablet_id:
                return tablet
        raise _TabletDropped(
            f"no tablet covers the row's key: its range partition was dropped (tablet "
            f"{tablet_id} of {info.name} no longer exists)"
        )

    def _on_retriable(self, info: TableInfo, tablet: TabletLocation, exc: Exception) -> None:
        if isinstance(exc, errors.ServiceUnavailableError):
            return  # the right server, busy (e.g. over its soft memory limit): back off only
        hint = exc.leader_uuid if isinstance(exc, errors.NotLeaderError) else None
        if hint and self.cache.set_leader(info.table_id, tablet.tablet_id, hint):
            return
        self.cache.invalidate(info.table_id)


class _TabletDropped(errors.NotFoundError):
    """A request's tablet is no longer one of its table's: its range partition was dropped."""


_UPDATES = frozenset({int(OpType.UPDATE), int(OpType.UPDATE_IGNORE)})
_DELETES = frozenset({int(OpType.DELETE), int(OpType.DELETE_IGNORE)})


def _failed(request: _Request, exc: errors.NyalaError) -> _Settled:
    """The outcome of ``request`` whose sending ended with ``exc``."""
    if isinstance(exc, _TabletDropped):
        return _Settled(request, error=exc, dropped=True)
    if isinstance(exc, errors.InvalidArgumentError):
        # Refused whole at apply (deterministically) or before proposing: final.
        return _Settled(request, error=exc, pending=request.maybe_sent)
    answered = not errors.is_retriable(exc)
    return _Settled(request, error=exc, pending=not answered or request.maybe_sent)


def _shape(prepared: PreparedRows) -> _Shape:
    batch = prepared.batch
    ops = batch.column(OP_COLUMN).to_numpy(zero_copy_only=False)
    columns = tuple((f.name, f.type) for f in batch.schema if f.name != OP_COLUMN)
    kinds = {int(op) for op in np.unique(ops)}  # one or two, almost always
    return _Shape(columns, bool(kinds & _UPDATES), kinds <= _DELETES)


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


__all__ = [
    "WRITE_REQUEST_BYTES_MAX",
    "WRITE_REQUEST_ROWS_MAX",
    "RequestTracker",
    "RowError",
    "RowOutcome",
    "WriteResult",
    "Writer",
    "error_code",
    "pick_replica",
]
