"""``Table``: one table's handle — its schema and partitioning, writes and scans.

A handle is cheap and holds no connection of its own; it goes through its client's caches and
channels. Writes take a pyarrow Table/RecordBatch, a pandas DataFrame or a dict of numpy
arrays, are converted once (``nyala.rowops``) and return a ``WriteResult`` that gives every
row's outcome: applied, or failed with a ``RowError`` (code, reason, the row's index and key).
A row's own problem never fails the others. When requests to some tablets got no answer, the
call raises ``PartialWriteError`` carrying that result (rows applied, failed, unknown) and its
``retry()``; when nothing was applied because whole requests failed, it raises their error
(docs/write-semantics.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nyala.client.meta_cache import TableInfo, TabletLocation
from nyala.client.scanner import (
    SCAN_ATTEMPT_TIMEOUT_MS,
    SCAN_BATCH_BYTES,
    SCAN_PAGE_BATCHES,
    Predicate,
    Scanner,
)
from nyala.client.write import WriteResult
from nyala.partition import PartitionSchema
from nyala.rowops import OpType, is_arrow_stream, prepare_op_batch, stream_chunks
from nyala.schema import Schema

#: Rows per write call when a write streams its input (``Table.write``).
STREAM_WRITE_ROWS_MAX = 256 * 1024

if TYPE_CHECKING:
    from nyala.client.client import Client


class Table:
    """A table of a cluster, opened with ``client.table(name)``."""

    def __init__(self, client: Client, info: TableInfo) -> None:
        self._client = client
        self._info = info

    @property
    def name(self) -> str:
        """The table's name."""
        return self._info.name

    @property
    def id(self) -> str:
        """The table's id (stable across renames)."""
        return self._info.table_id

    @property
    def schema(self) -> Schema:
        """The schema this handle writes and scans with."""
        return self._current_info().schema

    @property
    def partition_schema(self) -> PartitionSchema:
        """The table's hash levels and range columns."""
        return self._info.partition_schema

    @property
    def num_replicas(self) -> int:
        """The replication factor."""
        return self._info.num_replicas

    def tablets(self) -> list[TabletLocation]:
        """The table's tablets with their replicas, in partition order."""
        return list(self._client._cache.locations(self._info).tablets)

    def __repr__(self) -> str:
        return f"Table({self.name!r}, {self.schema!r})"

    # --- writes -------------------------------------------------------------------------------

    def write(
        self,
        data: Any,
        op: OpType | str,
        *,
        timeout_ms: int | None = None,
        ignore_extra_columns: bool = False,
    ) -> WriteResult:
        """Applies ``data``'s rows as operation ``op`` and waits until they are durable.

        Columns the table has and ``data`` lacks take their default (or null) in INSERT and
        UPSERT rows; a column the table lacks is an error unless ``ignore_extra_columns``.

        An object exporting ``__arrow_c_stream__`` (a ``pyarrow.RecordBatchReader``, a polars
        DataFrame, a DuckDB relation, another table's scanner) is read and written in chunks
        of ``STREAM_WRITE_ROWS_MAX`` rows, one after the other, so client memory stays about
        one chunk whatever the stream's length; the result covers every row, positions
        counting from the stream's first row. If a chunk ends with rows unknown,
        ``PartialWriteError`` is raised for it (``exc.result`` covers that chunk; the chunks
        before it are applied, the rest of the stream is not read)."""
        small = type(data) is dict and not ignore_extra_columns  # one row or a few, say
        if not small and is_arrow_stream(data):
            parts = []
            for chunk in stream_chunks(data, STREAM_WRITE_ROWS_MAX):
                part = self.write(
                    chunk, op, timeout_ms=timeout_ms, ignore_extra_columns=ignore_extra_columns
                )
                part._drop_input()  # keep the outcome, not the chunk (bounded memory)
                parts.append(part)
            return WriteResult.concat(parts)
        info = self._current_info()
        kind = OpType.parse(op)
        if small:
            result = self._client._writer.write_small(info, data, kind, timeout_ms=timeout_ms)
            if result is not None:
                return result.check()
        prepared = prepare_op_batch(
            data, kind, info.schema, ignore_extra_columns=ignore_extra_columns
        )
        return self._client._writer.write(info, prepared, timeout_ms=timeout_ms).check()

    def _current_info(self) -> TableInfo:
        """The table's info, moved on to a newer schema the client has learnt meanwhile (a
        write that met a schema change refreshes the client's cache)."""
        newer = self._client._cache.peek(self._info.name)
        if (
            newer is not None
            and newer.table_id == self._info.table_id
            and newer.schema.version > self._info.schema.version
        ):
            self._info = newer
        return self._info

    def insert(self, data: Any, **kwargs: Any) -> WriteResult:
        """Inserts rows; an existing key is a row error ``ALREADY_PRESENT``."""
        return self.write(data, OpType.INSERT, **kwargs)

    def insert_ignore(self, data: Any, **kwargs: Any) -> WriteResult:
        """Inserts rows, leaving existing keys alone."""
        return self.write(data, OpType.INSERT_IGNORE, **kwargs)

    def upsert(self, data: Any, **kwargs: Any) -> WriteResult:
        """Inserts rows or replaces the existing ones."""
        return self.write(data, OpType.UPSERT, **kwargs)

    def update(self, data: Any, **kwargs: Any) -> WriteResult:
        """Replaces existing rows; an absent key is a row error ``NOT_FOUND``."""
        return self.write(data, OpType.UPDATE, **kwargs)

    def delete(self, keys: Any, **kwargs: Any) -> WriteResult:
        """Deletes the rows with these keys (only key columns are needed)."""
        return self.write(keys, OpType.DELETE, **kwargs)

    # --- reads --------------------------------------------------------------------------------

    def scan(
        self,
        columns: Sequence[str] | None = None,
        where: Sequence[Predicate] = (),
        *,
        limit: int | None = None,
        replica: str = "leader",
        max_staleness_ms: int = 0,
        timeout_ms: int | None = None,
        attempt_timeout_ms: int = SCAN_ATTEMPT_TIMEOUT_MS,
        batch_size_bytes: int = SCAN_BATCH_BYTES,
        page_batches: int = SCAN_PAGE_BATCHES,
        read_mode: str = "latest",
        snapshot_ts: int | None = None,
    ) -> Scanner:
        """A scan: iterate it for ``pyarrow.RecordBatch``es, or ``.to_arrow()`` /
        ``.to_pandas()``. ``where`` holds predicates like ``("id", ">=", 10)``.

        ``read_mode`` (docs/consistency.md): "latest" (default) reads each tablet as it is
        reached. "snapshot" reads every tablet at one hybrid timestamp, ``snapshot_ts`` or
        one the first tablet picks (``scanner.snapshot_ts`` says which), and gives the same
        answer each time it is run. "read_your_writes" reads a snapshot that includes every
        write this client has made or seen. Timestamps convert with
        ``nyala.timestamp_from_datetime`` / ``timestamp_to_datetime``.

        ``replica="leader"`` (default) is linearizable: every write acknowledged before the
        scan is seen. ``"closest"``, ``"any"`` or ``"follower"`` read from a follower no more
        than ``max_staleness_ms`` behind its leader (default 5000), which may miss the most
        recent writes; a follower that cannot promise that refuses and the next replica, and
        finally the leader, serves (see ``nyala.client.scanner``). ``attempt_timeout_ms``
        bounds the wait for one page from one server before the scan moves on."""
        return self._scanner(
            timeout_ms,
            columns=columns,
            where=where,
            limit=limit,
            replica=replica,
            max_staleness_ms=max_staleness_ms,
            attempt_timeout_ms=attempt_timeout_ms,
            batch_size_bytes=batch_size_bytes,
            page_batches=page_batches,
            read_mode=read_mode,
            snapshot_ts=snapshot_ts,
        )

    def diff_scan(
        self,
        start_ts: int,
        end_ts: int,
        columns: Sequence[str] | None = None,
        where: Sequence[Predicate] = (),
        *,
        replica: str = "leader",
        timeout_ms: int | None = None,
    ) -> Scanner:
        """The rows whose state differs between the snapshots at ``start_ts`` and ``end_ts``
        (Kudu's incremental scan): each changed row as it is at ``end_ts`` with
        ``is_deleted`` False, or, for a row that existed at ``start_ts`` and not at
        ``end_ts``, its key with ``is_deleted`` True. A row inserted and deleted in between
        is not returned. Both timestamps must be within the history kept
        (``tablet_history_max_age_s``)."""
        return self._scanner(
            timeout_ms,
            columns=columns,
            where=where,
            replica=replica,
            read_mode="snapshot",
            snapshot_ts=end_ts,
            diff_start_ts=start_ts,
        )

    def _scanner(self, timeout_ms: int | None, **options: Any) -> Scanner:
        """A scanner of this table through the client's caches, channels and timestamps."""
        return Scanner(
            self._client._cache,
            self._client._pool,
            self._info,
            timeout_ms=timeout_ms or self._client.timeout_ms,
            observed=self._client._observed,
            **options,
        )

    def count(self, where: Sequence[Predicate] = ()) -> int:
        """The number of rows (matching ``where``)."""
        return self.scan(columns=self.schema.key, where=where).count()


__all__ = ["Table"]
