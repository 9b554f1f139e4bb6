"""The PySpark Python data source ``nyala``: DataSource, Arrow writer, reader.

Where each piece runs (PySpark 4.3): ``DataSource.schema``, ``writer`` and ``reader`` (with
``pushFilters`` and ``partitions``) run once per job in a Python worker on the driver; ``write``
and ``read`` run in each task's Python worker on the executors; ``commit``/``abort`` run on the
driver after the tasks. Everything that crosses from one to another (the writer, the reader, the
partitions, the commit messages) is pickled, so they hold options and plans, never a client.

Writes: the driver checks the DataFrame against the table (``schema_map.plan_write``) before any
task starts, creating the table first under ``nyala.createTable``; each task writes its Arrow
batches through one client (``load.TableWriter``): every row ends applied, failed or unknown,
and a task with rows not applied fails with a sample of them (``nyala.failOnRowErrors``, default
true; with false it succeeds and reports them). ``commit`` logs the job's row counts and writes
them, per task too, as JSON to ``nyala.reportPath``.
Mode ``overwrite`` first deletes every row of the table, then writes as ``append`` does; it is not
atomic (readers see the table empty, then filling, and a failed job leaves it partly written).

Reads: one Spark partition per tablet, each listing its replicas' hosts. PySpark's Python data
source API passes no preferred locations to Spark's scheduler (its ``InputPartition`` has none),
so the hosts are informational; ``nyala.replicaSelection=closest_replica`` reads through the
client's follower reads. Spark does not tell a Python data source which columns a query uses,
so projection is ``nyala.columns`` (or a ``.schema(...)`` given to the reader); filters are
pushed as nyala predicates (``filters``). PySpark 4.3 caches a loaded DataFrame's planned read and
reuses it for a later query that has no filter it can push, predicates included (docs/spark.md,
"Limits"): one ``load()`` per query with different filters.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    Filter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from nyala.common.clock import timestamp_to_datetime
from nyala.errors import NotFoundError
from nyala.rowops import OpType
from nyala.schema import Schema
from nyala.spark import filters as spark_filters
from nyala.spark import schema_map
from nyala.spark.load import RowErrorsError, TableWriter, WriteReport
from nyala.spark.options import (
    ReadOptions,
    ReplicaSelection,
    WriteOptions,
    parse_read_options,
    parse_write_options,
)

if TYPE_CHECKING:
    from nyala.client import Client, Table
    from nyala.client.meta_cache import TabletLocation

log = logging.getLogger("nyala.spark")


def _connect(options: ReadOptions | WriteOptions) -> Client:
    """A client of the job's cluster, with the job's credentials directory if it names one."""
    from nyala.client import connect

    if options.timeout_ms is None:
        return connect(options.masters, credentials=options.credentials)
    return connect(options.masters, timeout_ms=options.timeout_ms, credentials=options.credentials)


class NyalaDataSource(DataSource):
    """Format ``nyala``: ``spark.read.format("nyala")`` and ``df.write.format("nyala")``."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "nyala"

    def schema(self) -> str:
        """The table's columns (or ``nyala.columns`` of them) as Spark DDL."""
        options = parse_read_options(self.options)
        with _connect(options) as client:
            table_schema: Schema = client.table(options.table).schema
        columns = options.columns or table_schema.names
        schema_map.check_projection(table_schema, columns)
        return schema_map.spark_ddl(table_schema, columns)

    def reader(self, schema: StructType) -> NyalaReader:
        """The reader for the columns of ``schema`` (checked against the table)."""
        options = parse_read_options(self.options)
        with _connect(options) as client:
            table_schema: Schema = client.table(options.table).schema
        columns = [field.name for field in schema.fields]
        schema_map.check_projection(table_schema, columns)
        return NyalaReader(options, table_schema, columns)

    def writer(self, schema: StructType, overwrite: bool) -> NyalaWriter:
        """Checks the DataFrame against the table (creating or truncating it first as the
        options and mode say) before any task runs."""
        from pyspark.sql.pandas.types import to_arrow_schema

        options = parse_write_options(self.options)
        input_schema = to_arrow_schema(schema, timezone="UTC")
        with _connect(options) as client:
            table_schema = _open_or_create(client, options, input_schema)
            plan = schema_map.plan_write(
                input_schema,
                options.table,
                table_schema,
                options.operation,
                ignore_extra_columns=options.ignore_extra_columns,
            )
            if overwrite:
                deleted = truncate(client, options.table)
                log.info("nyala: overwrite deleted %d rows of %r", deleted, options.table)
        return NyalaWriter(options, plan)


def _open_or_create(client: Client, options: WriteOptions, input_schema: pa.Schema) -> Schema:
    try:
        return client.table(options.table).schema
    except NotFoundError:
        create = options.create_table
        if create is None:
            raise
    from nyala.partition import HashPartitioning

    schema = schema_map.schema_for_create(input_schema, create.primary_key)
    levels = [HashPartitioning(level.columns, level.buckets) for level in create.hash_levels]
    table = client.create_table(
        options.table, schema, partitioning=levels or None, replicas=create.replicas
    )
    return table.schema


def truncate(client: Client, table_name: str) -> int:
    """Deletes every row of ``table_name`` (key columns scanned, ``delete_ignore`` written);
    returns how many rows it deleted."""
    table = client.table(table_name)
    key = table.schema.key
    deleted = 0
    with TableWriter(client, table_name, OpType.DELETE_IGNORE) as writer:
        for batch in table.scan(columns=key):
            writer.write_batch(batch)
            deleted += batch.num_rows
        writer.flush()
    return deleted


# --- writes -------------------------------------------------------------------------------


@dataclasses.dataclass
class NyalaCommitMessage(WriterCommitMessage):
    """One task's report, sent to the driver."""

    report: WriteReport


class NyalaWriter(DataSourceArrowWriter):
    """Writes each task's Arrow batches through one client session."""

    def __init__(self, options: WriteOptions, plan: schema_map.WritePlan) -> None:
        self.options = options
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> NyalaCommitMessage:
        """Runs in a task: writes every batch; fails with a sample of the rows not applied
        (unless ``nyala.failOnRowErrors`` is false)."""
        options = self.options
        with (
            _connect(options) as client,
            TableWriter(
                client,
                options.table,
                options.operation,
                batch_rows=options.batch_rows,
                ignore_duplicate_row_errors=options.ignore_duplicate_row_errors,
                ignore_null=options.ignore_null,
                ignore_extra_columns=options.ignore_extra_columns,
                plan=self.plan,
            ) as writer,
        ):
            report = writer.write(iterator)
        report.tasks = [report.task_counts(_task_id())]
        if report.rows_not_applied and options.fail_on_row_errors:
            raise RowErrorsError(report)
        return NyalaCommitMessage(report)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Runs on the driver once every task succeeded: reports the job's row counts."""
        total = self._merged(messages)
        log.warning(
            "nyala: wrote %d rows to %r (%s): %d applied, %d failed, %d unknown, %d ignored",
            total.rows_in,
            total.table,
            total.operation,
            total.rows_applied,
            total.rows_failed,
            total.rows_unknown,
            total.rows_ignored,
        )
        self._report(total, "committed")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Runs on the driver after a task failed. Each task closed its own session; rows
        that succeeded tasks applied stay applied (nyala has no multi-row transactions)."""
        total = self._merged(messages)
        log.warning(
            "nyala: write to %r aborted; %d rows were applied by tasks that finished",
            total.table,
            total.rows_applied,
        )
        self._report(total, "aborted")

    def _merged(self, messages: list[WriterCommitMessage | None]) -> WriteReport:
        total = WriteReport(self.options.table, self.options.operation.name.lower())
        for message in messages:
            if isinstance(message, NyalaCommitMessage):
                total.merge(message.report)
        return total

    def _report(self, total: WriteReport, outcome: str) -> None:
        path = self.options.report_path
        if path is None:
            return
        text = total.to_json()[:-1] + f', "outcome": "{outcome}"}}\n'
        tmp = Path(f"{path}.tmp-{os.getpid()}")
        tmp.write_text(text)
        tmp.replace(path)


def _task_id() -> int:
    """The Spark partition this task writes (-1 outside a task)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return -1 if context is None else context.partitionId()


# --- reads --------------------------------------------------------------------------------


class TabletPartition(InputPartition):
    """One tablet to read: its id, its replicas' hosts (leader first), and the snapshot
    timestamp every partition of the read uses (None for a latest read)."""

    def __init__(
        self, tablet_id: str, hosts: Sequence[str], snapshot_ts: int | None = None
    ) -> None:
        super().__init__(tablet_id)
        self.tablet_id = tablet_id
        self.hosts = tuple(hosts)
        self.snapshot_ts = snapshot_ts


class NyalaReader(DataSourceReader):
    """Reads one tablet per partition, with the projection and the pushed predicates."""

    def __init__(self, options: ReadOptions, schema: Schema, columns: Sequence[str]) -> None:
        self.options = options
        self.table_schema = schema
        self.columns = list(columns)
        self.predicates: tuple[spark_filters.Predicate, ...] = ()
        #: The timestamp this read's partitions scan at (set by ``partitions``).
        self.snapshot_ts: int | None = None

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        """Keeps the filters nyala can evaluate; yields the ones Spark must still apply."""
        pushed = spark_filters.translate(filters, self.table_schema)
        self.predicates = pushed.predicates
        yield from pushed.remaining

    def partitions(self) -> list[InputPartition]:
        """One partition per tablet the pushed predicates can match (hash and range
        partition pruning, as the client's scans do)."""
        options = self.options
        with _connect(options) as client:
            table = client.table(options.table)
            tablets = table.scan(where=list(self.predicates)).tablets()
            if options.read_mode == "snapshot":
                self.snapshot_ts = options.snapshot_timestamp or pick_snapshot(table)
                log.info(
                    "reading table %r at snapshot %d (%s)",
                    options.table,
                    self.snapshot_ts,
                    timestamp_to_datetime(self.snapshot_ts).isoformat(),
                )
        return [TabletPartition(t.tablet_id, _hosts(t), self.snapshot_ts) for t in tablets]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Runs in a task: scans one tablet and yields Arrow batches in Spark's types."""
        assert isinstance(partition, TabletPartition)
        options = self.options
        target = schema_map.read_arrow_schema(self.table_schema, self.columns)
        with _connect(options) as client:
            table = client.table(options.table)
            for batch in scan_tablet(table, partition, self.columns, self.predicates, options):
                if batch.num_rows:
                    yield schema_map.to_read_batch(batch, target)


def pick_snapshot(table: Table) -> int:
    """A snapshot timestamp for a whole read: the one a tablet server picks for a one-row
    snapshot scan (its clock's now, once the writes before it are applied there). Every
    partition then reads at it, on whichever replica, as often as Spark retries."""
    scanner = table.scan(columns=table.schema.key, limit=1, read_mode="snapshot")
    scanner.to_arrow()
    assert scanner.snapshot_ts is not None, "a snapshot scan reports its timestamp"
    return scanner.snapshot_ts


def scan_tablet(
    table: Table,
    partition: TabletPartition,
    columns: Sequence[str],
    predicates: Sequence[spark_filters.Predicate],
    options: ReadOptions,
) -> Iterator[pa.RecordBatch]:
    """The rows of one tablet: the client's scan (projection, predicates, replica choice,
    resumption after a leader change) restricted to that tablet."""
    follower = options.replica_selection is ReplicaSelection.CLOSEST_REPLICA
    scanner = table.scan(
        columns=list(columns),
        where=list(predicates),
        replica="follower" if follower else "leader",
        max_staleness_ms=options.max_staleness_ms or 0,
        read_mode="latest" if partition.snapshot_ts is None else "snapshot",
        snapshot_ts=partition.snapshot_ts,
    )
    tablet = next((t for t in table.tablets() if t.tablet_id == partition.tablet_id), None)
    if tablet is None:
        raise NotFoundError(f"tablet {partition.tablet_id} of {table.name!r} no longer exists")
    # The client's Scanner walks every tablet in turn; its per-tablet step is what a Spark
    # partition needs (the client has no public single-tablet scan yet).
    for batch in scanner._scan_tablet(tablet, None):
        yield batch.select(list(columns))


def _hosts(tablet: TabletLocation) -> list[str]:
    """Replica hosts, leader first."""
    ordered = sorted(tablet.replicas, key=lambda r: r.uuid != tablet.leader_uuid)
    return [r.addr.rpartition(":")[0] for r in ordered]


__all__ = [
    "NyalaCommitMessage",
    "NyalaDataSource",
    "NyalaReader",
    "NyalaWriter",
    "TabletPartition",
    "truncate",
]
