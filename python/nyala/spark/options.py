"""The data source's options: parsing and validation of the ``nyala.*`` vocabulary.

The names follow Kudu's Spark connector (``kudu.master`` → ``nyala.masters``, ``kudu.table`` →
``nyala.table``, ``kudu.operation``, ``kudu.batchSize`` → ``nyala.batchRows``,
``kudu.ignoreNull``, ``kudu.scanLocality`` → ``nyala.replicaSelection``). Spark hands options
over with lower-cased keys, so lookups here are case-insensitive. An unknown ``nyala.*`` key is
an error rather than silently ignored: a typo in ``nyala.operaton`` must not turn a delete job
into an upsert. This module imports neither pyspark nor the client, so it runs anywhere.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Mapping

from nyala.errors import InvalidArgumentError
from nyala.rowops import OpType

PREFIX = "nyala."
#: Rows per op batch handed to the client session when ``nyala.batchRows`` is not given. The
#: session splits each batch by tablet, so a tablet's write request holds about this many rows
#: over the table's tablet count; 131072 rather than 65536 cut the tablet servers' CPU per row
#: of the Spark load bench (6 tablets) by a quarter (docs/spark.md, "Session 8").
BATCH_ROWS_DEFAULT = 131_072
#: Largest ``nyala.batchRows`` accepted (the storage engine's op-batch row limit, 2**20).
BATCH_ROWS_MAX = 1 << 20
#: Row errors kept per task for the failure message.
ROW_ERROR_SAMPLE_MAX = 10
#: Replication factor of tables made by ``nyala.createTable`` unless ``nyala.replicas`` says.
REPLICAS_DEFAULT = 3

_WRITE_KEYS = {
    "masters",
    "table",
    "operation",
    "batchrows",
    "createtable",
    "primarykey",
    "hashpartitions",
    "replicas",
    "ignorenull",
    "ignoreduplicaterowerrors",
    "ignoreextracolumns",
    "failonrowerrors",
    "timeoutms",
    "reportpath",
    "credentials",
}
_READ_KEYS = {
    "masters",
    "table",
    "columns",
    "replicaselection",
    "maxstalenessms",
    "readmode",
    "snapshottimestamp",
    "timeoutms",
    "credentials",
}


class ReplicaSelection(enum.Enum):
    """Which replica serves a read (Kudu's ``kudu.scanLocality``)."""

    #: Linearizable reads from each tablet's leader (the default, as in Kudu).
    LEADER_ONLY = "leader_only"
    #: A follower replica (the client's follower reads), no staler than ``maxStalenessMs``.
    CLOSEST_REPLICA = "closest_replica"


@dataclasses.dataclass(frozen=True)
class HashLevel:
    """One level of hash partitioning: ``columns`` hashed into ``buckets`` buckets."""

    columns: tuple[str, ...]
    buckets: int


@dataclasses.dataclass(frozen=True)
class CreateTableOptions:
    """How ``nyala.createTable`` makes a missing table (its schema comes from the DataFrame)."""

    primary_key: tuple[str, ...]
    hash_levels: tuple[HashLevel, ...]
    replicas: int


@dataclasses.dataclass(frozen=True)
class WriteOptions:
    """Validated options of a ``df.write.format("nyala")`` job."""

    masters: str
    table: str
    operation: OpType
    batch_rows: int
    create_table: CreateTableOptions | None
    ignore_null: bool
    #: Kudu's ``ignoreDuplicateRowErrors``: ``ALREADY_PRESENT`` rows do not fail the task.
    ignore_duplicate_row_errors: bool
    #: DataFrame columns the table lacks are dropped instead of refusing the job.
    ignore_extra_columns: bool
    #: A task whose rows were not all applied fails (with a sample of its row errors); with
    #: false it succeeds and its counts go to the job's report.
    fail_on_row_errors: bool
    timeout_ms: int | None
    #: Where the driver writes the job's JSON summary at commit (None: log line only).
    report_path: str | None
    #: A secure cluster: the credentials directory on every executor (docs/security.md); the
    #: plan carries this path, never a key. None: ``NYALA_CREDENTIALS`` or none.
    credentials: str | None = None


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """Validated options of a ``spark.read.format("nyala")`` job."""

    masters: str
    table: str
    #: Projection (None: every column of the table, or of a schema the user gave).
    columns: tuple[str, ...] | None
    replica_selection: ReplicaSelection
    max_staleness_ms: int | None
    timeout_ms: int | None
    #: As in ``WriteOptions``.
    credentials: str | None = None
    #: "snapshot" (the default, as Kudu's Spark reads): every partition, and every retry of
    #: a task, reads at one timestamp picked when the read is planned; "latest": each tablet
    #: as its task reaches it.
    read_mode: str = "snapshot"
    #: ``nyala.snapshotTimestamp``: the hybrid timestamp to read at (None: picked at plan).
    snapshot_timestamp: int | None = None


def _lowered(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def _check_known(options: dict[str, str], known: set[str], what: str) -> None:
    for key in options:
        if key.startswith(PREFIX) and key[len(PREFIX) :] not in known:
            expected = ", ".join(sorted(PREFIX + k for k in known))
            raise InvalidArgumentError(f"unknown {what} option {key!r}; expected one of {expected}")


def _required(options: dict[str, str], name: str, env: str | None = None) -> str:
    value = options.get(PREFIX + name.lower(), "").strip()
    if not value and env is not None:
        value = os.environ.get(env, "").strip()
    if not value:
        hint = f" (or set {env})" if env else ""
        raise InvalidArgumentError(f"option {PREFIX}{name} is required{hint}")
    return value


def parse_bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    """The boolean option ``nyala.<name>`` (``true/false``, any case)."""
    raw = _lowered(options).get(PREFIX + name.lower())
    if raw is None:
        return default
    text = raw.strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise InvalidArgumentError(f"option {PREFIX}{name} must be true or false, not {raw!r}")


def parse_int(
    options: Mapping[str, str], name: str, default: int | None, *, low: int, high: int
) -> int | None:
    """The integer option ``nyala.<name>`` within ``[low, high]``."""
    raw = _lowered(options).get(PREFIX + name.lower())
    if raw is None:
        return default
    try:
        value = int(raw.strip().replace("_", ""))
    except ValueError:
        raise InvalidArgumentError(
            f"option {PREFIX}{name} must be an integer, not {raw!r}"
        ) from None
    if not low <= value <= high:
        raise InvalidArgumentError(f"option {PREFIX}{name} must be in {low}..={high}, not {value}")
    return value


def parse_column_list(text: str, what: str) -> tuple[str, ...]:
    """``"a, b"`` → ``("a", "b")``; empty names and repeats are errors."""
    names = tuple(part.strip() for part in text.split(","))
    if not names or any(not n for n in names):
        raise InvalidArgumentError(f"{what} {text!r} has an empty column name")
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"{what} {text!r} names a column twice")
    return names


def parse_hash_partitions(text: str) -> tuple[HashLevel, ...]:
    """The CLI's ``--hash`` form: ``"id:4"``, several columns ``"a+b:8"``, levels joined by
    ``;`` (``"a:4;b:2"``)."""
    levels = []
    for part in text.split(";"):
        columns, sep, buckets = part.strip().rpartition(":")
        if not sep:
            raise InvalidArgumentError(f"hash partitioning {part!r} must look like 'col:buckets'")
        try:
            count = int(buckets)
        except ValueError:
            raise InvalidArgumentError(f"hash partitioning {part!r}: bad bucket count") from None
        if count < 2:
            raise InvalidArgumentError(f"hash partitioning {part!r} needs at least 2 buckets")
        names = tuple(c.strip() for c in columns.split("+"))
        if any(not n for n in names):
            raise InvalidArgumentError(f"hash partitioning {part!r} has an empty column name")
        levels.append(HashLevel(names, count))
    return tuple(levels)


def _create_table(options: dict[str, str]) -> CreateTableOptions | None:
    if not parse_bool(options, "createTable", False):
        for name in ("primarykey", "hashpartitions", "replicas"):
            if PREFIX + name in options:
                raise InvalidArgumentError(
                    f"option {PREFIX}{name} only applies with {PREFIX}createTable=true"
                )
        return None
    key = parse_column_list(_required(options, "primaryKey"), f"{PREFIX}primaryKey")
    hash_text = options.get(PREFIX + "hashpartitions", "").strip()
    levels = parse_hash_partitions(hash_text) if hash_text else ()
    for level in levels:
        outside = [c for c in level.columns if c not in key]
        if outside:
            raise InvalidArgumentError(
                f"hash partitioning column(s) {outside} are not in the primary key {list(key)}"
            )
    replicas = parse_int(options, "replicas", REPLICAS_DEFAULT, low=1, high=7)
    assert replicas is not None
    if replicas % 2 == 0:
        raise InvalidArgumentError(f"option {PREFIX}replicas must be odd, not {replicas}")
    return CreateTableOptions(key, levels, replicas)


def parse_write_options(raw: Mapping[str, str]) -> WriteOptions:
    """Validates the options of a write job; ``InvalidArgumentError`` names the bad one."""
    options = _lowered(raw)
    _check_known(options, _WRITE_KEYS, "write")
    operation = OpType.parse(options.get(PREFIX + "operation", "upsert"))
    batch_rows = parse_int(options, "batchRows", BATCH_ROWS_DEFAULT, low=1, high=BATCH_ROWS_MAX)
    assert batch_rows is not None
    ignore_null = parse_bool(options, "ignoreNull", False)
    if ignore_null and operation not in (OpType.UPSERT, OpType.UPDATE, OpType.UPDATE_IGNORE):
        raise InvalidArgumentError(
            f"option {PREFIX}ignoreNull applies to upsert and update, not {operation.name.lower()}"
        )
    report = options.get(PREFIX + "reportpath", "").strip()
    return WriteOptions(
        masters=_required(options, "masters", "NYALA_MASTERS"),
        table=_required(options, "table"),
        operation=operation,
        batch_rows=batch_rows,
        create_table=_create_table(options),
        ignore_null=ignore_null,
        ignore_duplicate_row_errors=parse_bool(options, "ignoreDuplicateRowErrors", False),
        ignore_extra_columns=parse_bool(options, "ignoreExtraColumns", False),
        fail_on_row_errors=parse_bool(options, "failOnRowErrors", True),
        timeout_ms=parse_int(options, "timeoutMs", None, low=1, high=3_600_000),
        report_path=report or None,
        credentials=options.get(PREFIX + "credentials", "").strip() or None,
    )


def parse_read_options(raw: Mapping[str, str]) -> ReadOptions:
    """Validates the options of a read job; ``InvalidArgumentError`` names the bad one."""
    options = _lowered(raw)
    _check_known(options, _READ_KEYS, "read")
    selection_text = options.get(PREFIX + "replicaselection", "leader_only").strip().lower()
    try:
        selection = ReplicaSelection(selection_text)
    except ValueError:
        choices = ", ".join(s.value for s in ReplicaSelection)
        raise InvalidArgumentError(
            f"option {PREFIX}replicaSelection must be one of {choices}, not {selection_text!r}"
        ) from None
    staleness = parse_int(options, "maxStalenessMs", None, low=0, high=86_400_000)
    if staleness is not None and selection is ReplicaSelection.LEADER_ONLY:
        raise InvalidArgumentError(
            f"option {PREFIX}maxStalenessMs applies only to replicaSelection=closest_replica"
        )
    read_mode = options.get(PREFIX + "readmode", "snapshot").strip().lower()
    if read_mode not in ("snapshot", "latest"):
        raise InvalidArgumentError(
            f"option {PREFIX}readMode must be snapshot or latest, not {read_mode!r}"
        )
    snapshot = parse_int(options, "snapshotTimestamp", None, low=1, high=2**63 - 1)
    if snapshot is not None and read_mode != "snapshot":
        raise InvalidArgumentError(f"option {PREFIX}snapshotTimestamp needs readMode=snapshot")
    columns_text = options.get(PREFIX + "columns", "").strip()
    return ReadOptions(
        masters=_required(options, "masters", "NYALA_MASTERS"),
        table=_required(options, "table"),
        columns=parse_column_list(columns_text, f"{PREFIX}columns") if columns_text else None,
        replica_selection=selection,
        max_staleness_ms=staleness,
        timeout_ms=parse_int(options, "timeoutMs", None, low=1, high=3_600_000),
        credentials=options.get(PREFIX + "credentials", "").strip() or None,
        read_mode=read_mode,
        snapshot_timestamp=snapshot,
    )


__all__ = [
    "BATCH_ROWS_DEFAULT",
    "BATCH_ROWS_MAX",
    "ROW_ERROR_SAMPLE_MAX",
    "CreateTableOptions",
    "HashLevel",
    "ReadOptions",
    "ReplicaSelection",
    "WriteOptions",
    "parse_bool",
    "parse_column_list",
    "parse_hash_partitions",
    "parse_int",
    "parse_read_options",
    "parse_write_options",
]
