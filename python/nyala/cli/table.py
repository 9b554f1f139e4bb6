"""``nyala table ...``: create, list, describe, alter (rename, add/drop/rename columns), delete,
scan, count, load and copy tables, and their statistics."""

from __future__ import annotations

import datetime as dt
import re
import time
from pathlib import Path
from typing import Any

import click

from nyala.cli.cluster_client import client_for, masters_option, one_line
from nyala.cli.output import emit, emit_one, format_option, replica_label
from nyala.common.clock import timestamp_from_datetime, timestamp_to_datetime
from nyala.errors import InvalidArgumentError

#: Rows per write when loading a file (one op batch each, split per tablet).
LOAD_BATCH_ROWS = 100_000
#: Rows ``scan`` prints when no ``--limit`` is given (in every format), to keep a terminal
#: usable; ``--limit 0`` prints every row.
SCAN_PRINT_ROWS_DEFAULT = 1_000

_WHERE = re.compile(
    r"^\s*(?P<col>[^\s<>=!]+)\s*"
    r"(?P<op>is\s+not\s+null|is\s+null|<=|>=|==|!=|<>|=|<|>|in\b)\s*(?P<rest>.*)$",
    re.IGNORECASE,
)
#: What ``--where`` accepts, for its error messages.
WHERE_FORMS = (
    "COLUMN OP VALUE with OP one of = == != <> < <= > >=; COLUMN IN (V1, V2, ...); "
    "COLUMN IS NULL; COLUMN IS NOT NULL. Values: integers, decimals (12.50), true/false, "
    "'quoted' or bare text, dates (2024-01-31), timestamps (2024-01-31 10:00:00[.ffffff]"
    "[+01:00|Z], ISO 8601 with T, or integer microseconds since 1970; no zone means UTC)"
)


@click.group(name="table")
def group() -> None:
    """Create, inspect, change, read and load tables."""


def _parse_hash(text: str) -> Any:
    from nyala.partition import HashPartitioning

    columns, sep, buckets = text.rpartition(":")
    if not sep or not buckets.strip().isdigit():
        raise InvalidArgumentError(f"--hash {text!r} must look like 'col[,col]:BUCKETS'")
    return HashPartitioning([c.strip() for c in columns.split(",")], int(buckets))


def parse_value(schema: Any, column: str, text: str) -> Any:
    """A literal typed as ``column``'s values (``'quoted'`` text loses its quotes): integers,
    floats, booleans, text, decimals (exact), ISO dates, timestamps as ISO 8601 with or without
    a zone (none: UTC) or integer microseconds since the epoch."""
    from nyala.schema import parse_default

    kind = schema.column(column).type
    try:
        if kind == "timestamp":
            return _parse_timestamp(text)
        return parse_default(kind, text)
    except (InvalidArgumentError, ValueError):
        raise InvalidArgumentError(
            f"{text.strip()!r} is not a {kind} value for {column!r}; accepted: {WHERE_FORMS}"
        ) from None


def _parse_timestamp(text: str) -> Any:
    """An aware ``datetime`` (UTC when no zone is written) or int microseconds."""
    import datetime

    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1].strip()
    if text.lstrip("-").isdigit():
        return int(text)
    value = datetime.datetime.fromisoformat(text)
    return value if value.tzinfo else value.replace(tzinfo=datetime.UTC)


def _split_list(text: str) -> list[str]:
    """``a, 'b,c', d`` split at the commas outside quotes."""
    items: list[str] = []
    current: list[str] = []
    quote = ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == ",":
            items.append("".join(current))
            current = []
            continue
        current.append(char)
    if quote:
        raise InvalidArgumentError(f"unterminated quote in {text!r}")
    items.append("".join(current))
    return items


def parse_where(schema: Any, text: str) -> tuple[Any, ...]:
    """``'id >= 10'``, ``'name is null'``, ``'id in (1, 2)'``, ``"day != '2024-01-01'"`` as
    a predicate tuple; ``InvalidArgumentError`` listing the accepted forms otherwise."""
    match = _WHERE.match(text)
    if match is None:
        raise InvalidArgumentError(f"cannot parse --where {text!r}; accepted: {WHERE_FORMS}")
    column, op, rest = match["col"], " ".join(match["op"].lower().split()), match["rest"]
    schema.column(column)
    op = {"==": "=", "<>": "!="}.get(op, op)
    if op in ("is null", "is not null"):
        if rest.strip():
            raise InvalidArgumentError(
                f"--where {text!r}: nothing may follow {op!r}; accepted: {WHERE_FORMS}"
            )
        return (column, op)
    if op == "in":
        inner = rest.strip()
        if not (inner.startswith("(") and inner.endswith(")")):
            raise InvalidArgumentError(
                f"--where {text!r}: IN takes '(v1, v2, ...)'; accepted: {WHERE_FORMS}"
            )
        values = [parse_value(schema, column, v) for v in _split_list(inner[1:-1])]
        return (column, "in", values)
    if not rest.strip():
        raise InvalidArgumentError(f"--where {text!r} needs a value; accepted: {WHERE_FORMS}")
    return (column, op, parse_value(schema, column, rest))


def _range_spec(schema: Any, columns: str | None, splits: tuple[str, ...]) -> Any:
    from nyala.partition import RangePartitioning

    if not columns:
        if splits:
            raise InvalidArgumentError("--split needs --range")
        return None
    names = [c.strip() for c in columns.split(",")]
    rows = []
    for split in splits:
        values = split.split(",")
        if len(values) != len(names):
            raise InvalidArgumentError(f"--split {split!r} needs {len(names)} value(s)")
        rows.append(tuple(parse_value(schema, n, v) for n, v in zip(names, values, strict=True)))
    return RangePartitioning(names, rows)


@group.command(name="create")
@click.argument("name")
@click.option("--schema", "schema_text", required=True, help="'id:int64, name:string?, ...'")
@click.option("--key", required=True, help="Primary key column(s), comma-separated.")
@click.option("--hash", "hashes", multiple=True, help="Hash level 'col[,col]:BUCKETS' (repeat).")
@click.option("--range", "range_columns", default=None, help="Range partition column(s).")
@click.option("--split", "splits", multiple=True, help="Range split values 'v[,v]' (repeat).")
@click.option("--replicas", default=3, show_default=True, help="Replication factor (odd).")
@masters_option
@format_option
@one_line
def create(
    name: str,
    schema_text: str,
    key: str,
    hashes: tuple[str, ...],
    range_columns: str | None,
    splits: tuple[str, ...],
    replicas: int,
    masters: str,
    fmt: str,
) -> None:
    """Create table NAME."""
    from nyala.schema import Schema

    schema = Schema.parse(schema_text, key=[k.strip() for k in key.split(",") if k.strip()])
    spec: list[Any] = [_parse_hash(h) for h in hashes]
    ranged = _range_spec(schema, range_columns, splits)
    if ranged is not None:
        spec.append(ranged)
    with client_for(masters) as client:
        table = client.create_table(name, schema, partitioning=spec or None, replicas=replicas)
        emit_one({"created": table.name, "id": table.id, "tablets": len(table.tablets())}, fmt)


@group.command(name="list")
@click.option("--filter", "name_filter", default="", help="Substring of the table name.")
@masters_option
@format_option
@one_line
def list_tables(name_filter: str, masters: str, fmt: str) -> None:
    """List tables."""
    with client_for(masters) as client:
        emit(client.list_tables(name_filter), fmt)


@group.command(name="describe")
@click.argument("name")
@masters_option
@format_option
@one_line
def describe(name: str, masters: str, fmt: str) -> None:
    """Show a table's schema, partitioning and tablets."""
    with client_for(masters) as client:
        doc = client.describe_table(name)
    if fmt == "json":
        emit_one(doc, fmt)
        return
    click.echo(f"table {doc['name']} (id {doc['id']}), schema version {doc['schema_version']}")
    click.echo(f"partitioning: {doc['partitioning']}; replicas: {doc['replicas']}")
    key = set(doc["key"])
    emit([{**c, "key": c["name"] in key} for c in doc["columns"]], fmt)
    click.echo("")
    tablets = [
        {
            "tablet_id": t["tablet_id"],
            "partition": t["partition"],
            "leader": replica_label(t["leader"], t["replicas"]),
            "replicas": [replica_label(r["uuid"], t["replicas"]) for r in t["replicas"]],
        }
        for t in doc["tablets"]
    ]
    emit(tablets, fmt)


@group.command(name="delete")
@click.argument("name")
@masters_option
@format_option
@one_line
def delete(name: str, masters: str, fmt: str) -> None:
    """Delete a table and its data."""
    with client_for(masters) as client:
        client.delete_table(name)
    emit_one({"deleted": name}, fmt)


def _privileges_command(name: str, revoke: bool, help_text: str) -> None:
    """Registers ``nyala table grant`` or ``revoke`` (one shape, one direction each)."""

    @group.command(name=name, help=help_text)
    @click.argument("table")
    @click.argument("user")
    @click.argument("privileges")
    @masters_option
    @format_option
    @one_line
    def command(table: str, user: str, privileges: str, masters: str, fmt: str) -> None:
        with client_for(masters) as client:
            change = client.revoke if revoke else client.grant
            now = change(table, user, privileges)
        emit_one({"table": table, "user": user, "privileges": now}, fmt)


_privileges_command(
    "grant",
    False,
    "GRANT PRIVILEGES (select,insert,update,delete,alter,drop or all) on TABLE to USER "
    "(a secure cluster: the table's owner or an admin; docs/security.md).",
)
_privileges_command("revoke", True, "REVOKE PRIVILEGES on TABLE from USER.")


@group.command(name="rename")
@click.argument("old")
@click.argument("new")
@masters_option
@format_option
@one_line
def rename(old: str, new: str, masters: str, fmt: str) -> None:
    """Rename table OLD to NEW."""
    with client_for(masters) as client:
        table = client.alter_table(old, new_name=new)
    emit_one({"renamed": old, "to": table.name}, fmt)


@group.command(name="add-column")
@click.argument("name")
@click.argument("column")
@click.option("--default", "default", default=None, help="The column's write default.")
@click.option(
    "--not-null",
    is_flag=True,
    help="Make the column NOT NULL (it then needs --default, Kudu's rule).",
)
@masters_option
@format_option
@one_line
def add_column(
    name: str, column: str, default: str | None, not_null: bool, masters: str, fmt: str
) -> None:
    """Add COLUMN ('col:type') to table NAME: nullable unless --not-null; rows already written
    read as its --default (or null)."""
    from nyala.schema import Column, canonical_type, parse_default

    col_name, sep, type_text = column.partition(":")
    if not sep or not col_name.strip() or not type_text.strip():
        raise InvalidArgumentError(f"column {column!r} must look like 'name:type'")
    type_name = canonical_type(type_text.strip().rstrip("?"))
    value = None if default is None else parse_default(type_name, default)
    if not_null and value is None:
        raise InvalidArgumentError("a NOT NULL column added to a table needs --default")
    new = Column(col_name.strip(), type_name, nullable=not not_null, default=value)
    with client_for(masters) as client:
        table = client.alter_table(name, add_columns=[new])
    emit_one({"table": name, "added": new.name, "schema_version": table.schema.version}, fmt)


@group.command(name="drop-column")
@click.argument("name")
@click.argument("column")
@masters_option
@format_option
@one_line
def drop_column(name: str, column: str, masters: str, fmt: str) -> None:
    """Drop non-key COLUMN from table NAME."""
    with client_for(masters) as client:
        table = client.alter_table(name, drop_columns=[column])
    emit_one({"table": name, "dropped": column, "schema_version": table.schema.version}, fmt)


@group.command(name="rename-column")
@click.argument("name")
@click.argument("old")
@click.argument("new")
@masters_option
@format_option
@one_line
def rename_column(name: str, old: str, new: str, masters: str, fmt: str) -> None:
    """Rename column OLD of table NAME to NEW (key columns too; data is kept)."""
    with client_for(masters) as client:
        table = client.alter_table(name, rename_columns={old: new})
    emit_one(
        {"table": name, "renamed": old, "to": new, "schema_version": table.schema.version}, fmt
    )


_KUDU_OPS = {"=": "=", "<": "<", "<=": "<=", ">": ">", ">=": ">=", "IN": "in"}


def parse_predicates(schema: Any, text: str) -> list[tuple[Any, ...]]:
    """Kudu's JSON predicates (``kudu table copy -predicates``) as predicate tuples:
    ``["AND", ["=", "id", 1], [">=", "v", 2.5], ["IN", "c", [1, 2]], ["NULL", "n"],
    ["NOTNULL", "n"]]``."""
    import json

    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgumentError(f"--predicates is not JSON: {exc}") from None
    if not isinstance(doc, list) or not doc or str(doc[0]).upper() != "AND":
        raise InvalidArgumentError('--predicates must look like ["AND", [OP, COLUMN, VALUE], ...]')
    out: list[tuple[Any, ...]] = []
    for term in doc[1:]:
        if not isinstance(term, list) or len(term) < 2 or not isinstance(term[1], str):
            raise InvalidArgumentError(f"--predicates: {term!r} is not [OP, COLUMN, ...]")
        op, column = str(term[0]).upper(), term[1]
        schema.column(column)
        if op in ("NULL", "NOTNULL") and len(term) == 2:
            out.append((column, "is null" if op == "NULL" else "is not null"))
        elif op in _KUDU_OPS and len(term) == 3:
            if op == "IN" and not isinstance(term[2], list):
                raise InvalidArgumentError(f"--predicates: IN takes a list: {term!r}")
            out.append((column, _KUDU_OPS[op], term[2]))
        else:
            raise InvalidArgumentError(f"--predicates: cannot use {term!r}")
    return out


@group.command(name="copy")
@click.argument("src")
@click.argument("dst")
@click.option("--predicates", default=None, help="""Kudu's JSON: '["AND", [">=", "id", 10]]'.""")
@click.option("--where", "wheres", multiple=True, help="Predicate like 'id >= 10' (repeat).")
@click.option(
    "--write-type",
    type=click.Choice(["insert", "upsert"]),
    default="insert",
    show_default=True,
    help="How rows are written to DST.",
)
@click.option(
    "--create-table/--no-create-table",
    default=True,
    show_default=True,
    help="Create DST like SRC (schema, hash levels, replicas) when it does not exist.",
)
@masters_option
@format_option
@one_line
def copy(
    src: str,
    dst: str,
    predicates: str | None,
    wheres: tuple[str, ...],
    write_type: str,
    create_table: bool,
    masters: str,
    fmt: str,
) -> None:
    """Copy the rows of table SRC (those matching the predicates) into table DST, batch by
    batch, with progress on a terminal. Exits 1 if any row was not written."""
    from nyala.errors import NotFoundError

    with client_for(masters) as client:
        source = client.table(src)
        where = [parse_where(source.schema, w) for w in wheres]
        if predicates:
            where += parse_predicates(source.schema, predicates)
        try:
            target = client.table(dst)
        except NotFoundError:
            if not create_table:
                raise
            target = client.create_table(
                dst,
                source.schema,
                partitioning=_same_partitioning(source),
                replicas=client.describe_table(src)["replicas"],
            )
        started = time.monotonic()
        copied = failed = 0
        progress = _CopyProgress(enabled=fmt != "json")
        for batch in source.scan(where=where):
            result = target.write(batch, write_type)
            copied += result.applied
            failed += batch.num_rows - result.applied
            progress.update(copied, started)
        progress.finish()
    elapsed = time.monotonic() - started
    emit_one(
        {
            "source": src,
            "destination": dst,
            "rows": copied,
            "failed": failed,
            "rows_per_s": round(copied / elapsed) if elapsed > 0 else None,
        },
        fmt,
    )
    if failed:
        raise SystemExit(1)


def _same_partitioning(source: Any) -> Any:
    """The partitioning of table ``source``: its hash levels, and its range partitions as they
    are now (every range's bounds, read from its tablets: splits and gaps both carry over)."""
    from nyala.partition import RangePartitioning, decode_key

    partition_schema = source.partition_schema
    spec: list[Any] = list(partition_schema.hash_levels)
    columns = list(partition_schema.range_columns)
    if columns:
        types = [source.schema.column(c).type for c in columns]
        ranges = sorted({t.partition.range_bounds() for t in source.tablets()})
        bounds = [
            (decode_key(types, low) if low else None, decode_key(types, high) if high else None)
            for low, high in ranges
        ]
        spec.append(RangePartitioning(columns, bounds=bounds))
    return spec or None


class _CopyProgress:
    """Rows copied so far and rows per second, on one stderr line, only on a terminal."""

    def __init__(self, *, enabled: bool) -> None:
        self._stream = click.get_text_stream("stderr")
        self._enabled = enabled and self._stream.isatty()
        self._shown = False

    def update(self, rows: int, started: float) -> None:
        if self._enabled:
            rate = rows / max(time.monotonic() - started, 1e-6)
            self._stream.write(f"\rcopied {rows:,} rows, {rate:,.0f} rows/s")
            self._stream.flush()
            self._shown = True

    def finish(self) -> None:
        if self._shown:
            self._stream.write("\n")


@group.command(name="scan")
@click.argument("name")
@click.option("--columns", default=None, help="Columns to return, comma-separated.")
@click.option("--where", "wheres", multiple=True, help="Predicate like 'id >= 10' (repeat).")
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=SCAN_PRINT_ROWS_DEFAULT,
    show_default=True,
    help="At most this many rows, in every format (0: all).",
)
@click.option(
    "--replica",
    type=click.Choice(["leader", "closest", "any", "follower"]),
    default="leader",
    show_default=True,
    help="leader: linearizable; the others may read a follower (docs/scans.md).",
)
@click.option(
    "--max-staleness-ms",
    type=click.IntRange(min=0),
    default=0,
    help="Staleness bound of follower reads (default: the client's, 5000).",
)
@click.option(
    "--read-mode",
    type=click.Choice(["latest", "snapshot", "read_your_writes"]),
    default=None,
    help="latest (default): each tablet as reached; snapshot: every tablet at one "
    "timestamp (docs/consistency.md).",
)
@click.option(
    "--snapshot",
    "snapshot",
    default=None,
    metavar="TS",
    help="Read the table as of TS: a hybrid timestamp (integer) or an ISO date-time "
    "(UTC unless it names a zone). Implies --read-mode snapshot.",
)
@click.option(
    "--diff-from",
    default=None,
    metavar="TS",
    help="With --snapshot: only the rows that changed after TS, with is_deleted.",
)
@masters_option
@format_option
@one_line
def scan(
    name: str,
    columns: str | None,
    wheres: tuple[str, ...],
    limit: int,
    replica: str,
    max_staleness_ms: int,
    read_mode: str | None,
    snapshot: str | None,
    diff_from: str | None,
    masters: str,
    fmt: str,
) -> None:
    """Print the rows of table NAME: at most --limit (1000) rows in any format; when rows
    were left out, a notice on stderr says so. A snapshot read says on stderr which
    timestamp it read at (pass it to --snapshot to read the same rows again)."""
    snapshot_ts = None if snapshot is None else parse_timestamp(snapshot, "--snapshot")
    if snapshot_ts is not None:
        if read_mode not in (None, "snapshot"):
            raise click.UsageError("--snapshot needs --read-mode snapshot")
        read_mode = "snapshot"
    if diff_from is not None and snapshot_ts is None:
        raise click.UsageError("--diff-from needs --snapshot (the end of the window)")
    with client_for(masters) as client:
        table = client.table(name)
        names = [c.strip() for c in columns.split(",")] if columns else None
        where = [parse_where(table.schema, w) for w in wheres]
        cut = limit + 1 if limit else None  # one more row tells whether any were cut
        if diff_from is not None:
            assert snapshot_ts is not None
            start = parse_timestamp(diff_from, "--diff-from")
            scanner = table.diff_scan(start, snapshot_ts, columns=names, where=where)
            shown = [*(names or table.schema.names), "is_deleted"]
        else:
            scanner = table.scan(
                columns=names,
                where=where,
                limit=cut,
                replica=replica,
                max_staleness_ms=max_staleness_ms,
                read_mode=read_mode or "latest",
                snapshot_ts=snapshot_ts,
            )
            shown = names or table.schema.names
        rows = scanner.to_arrow().to_pylist()
    truncated = bool(limit) and len(rows) > limit
    emit(rows[:limit] if limit else rows, fmt, columns=shown)
    if scanner.snapshot_ts is not None:
        when = timestamp_to_datetime(scanner.snapshot_ts).isoformat()
        click.echo(f"nyala: read at snapshot {scanner.snapshot_ts} ({when})", err=True)
    if truncated:
        click.echo(
            f"nyala: showing the first {limit:,} rows; more match (--limit N for more, "
            "--limit 0 for all)",
            err=True,
        )


def parse_timestamp(text: str, option: str) -> int:
    """A hybrid timestamp from the command line: an integer, or an ISO date-time."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        return timestamp_from_datetime(dt.datetime.fromisoformat(text))
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is neither a hybrid timestamp nor an ISO date-time", param_hint=option
        ) from None


@group.command(name="count")
@click.argument("name")
@click.option("--where", "wheres", multiple=True, help="Predicate like 'id >= 10' (repeat).")
@masters_option
@format_option
@one_line
def count(name: str, wheres: tuple[str, ...], masters: str, fmt: str) -> None:
    """Count the rows of table NAME."""
    with client_for(masters) as client:
        table = client.table(name)
        rows = table.count(where=[parse_where(table.schema, w) for w in wheres])
    emit_one({"table": name, "rows": rows}, fmt)


@group.command(name="statistics")
@click.argument("name")
@masters_option
@format_option
@one_line
def statistics(name: str, masters: str, fmt: str) -> None:
    """Rows (an estimate) and bytes on disk of table NAME, per tablet and in total, from the
    tablet leaders' latest reports to the master: no scan, up to one heartbeat old."""
    with client_for(masters) as client:
        doc = client.table_statistics(name)
    if fmt == "json":
        emit_one(doc, fmt)
        return
    emit(doc["tablets"], fmt)
    click.echo(f"total: {doc['rows']:,} rows, {doc['on_disk_bytes']:,} bytes on disk")


@group.command(name="load")
@click.argument("name")
@click.argument("path", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--operation", default="upsert", show_default=True, help="insert, upsert, ...")
@click.option(
    "--ignore-extra-columns",
    is_flag=True,
    help="Drop file columns the table lacks (otherwise they are an error).",
)
@click.option(
    "--rejects",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write the rows not applied to this Parquet file (values, row, error).",
)
@masters_option
@format_option
@one_line
def load(
    name: str,
    path: Path,
    operation: str,
    ignore_extra_columns: bool,
    rejects: Path | None,
    masters: str,
    fmt: str,
) -> None:
    """Load a Parquet or CSV file into table NAME.

    Every row is applied, failed (a reason per row: a null in a NOT NULL column, a value out of
    range, a duplicate key, ...) or unknown (no answer in time); the summary lists failed rows
    with their key values, --rejects keeps them all for reprocessing, and the command exits 1
    if any row was not applied. Columns the file lacks take their default (or null). A
    progress bar shows on a terminal (not with --format json)."""
    from nyala.rowops import OpType
    from nyala.spark.load import RowErrorsError, load_file

    op = OpType.parse(operation)
    with client_for(masters) as client, _Progress(path, enabled=fmt != "json") as progress:
        try:
            report = load_file(
                client,
                name,
                path,
                operation=op,
                batch_rows=LOAD_BATCH_ROWS,
                ignore_extra_columns=ignore_extra_columns,
                rejects=rejects,
                on_batch=progress.update,
            )
        except RowErrorsError as exc:
            report = exc.report
    emit_one(
        {
            "table": name,
            "rows": report.rows_in,
            "applied": report.rows_applied,
            "failed": report.rows_failed,
            "unknown": report.rows_unknown,
            "failed_by_code": report.errors_by_code,
            "failed_sample": report.sample,
            "rejects": str(rejects) if rejects is not None and report.rows_not_applied else None,
            "rows_per_s": round(report.rows_in / report.elapsed_s) if report.elapsed_s else None,
        },
        fmt,
    )
    if report.rows_not_applied:
        raise SystemExit(1)


class _Progress:
    """``click.progressbar`` over a file load, on stderr and only on a terminal: the share of
    the file read, rows so far and rows per second."""

    def __init__(self, path: Path, *, enabled: bool) -> None:
        stream = click.get_text_stream("stderr")
        self._enabled = enabled and stream.isatty()
        self._stream = stream
        self._path = path
        self._bar: Any = None
        self._shown = 0
        self._started = time.monotonic()
        self._rows = 0

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.render_finish()

    def update(self, source: Any, report: Any) -> None:
        """Called after each batch read: moves the bar to ``source.done`` of ``total``."""
        if not self._enabled:
            return
        if self._bar is None:
            self._bar = click.progressbar(
                length=max(source.total, 1),
                label=f"loading {self._path.name}",
                file=self._stream,
                show_percent=True,
                show_eta=True,
                item_show_func=self._label,
            )
            self._bar.render_progress()
        self._rows = report.rows_in
        self._bar.update(source.done - self._shown, current_item=self._rows)
        self._shown = source.done

    def _label(self, rows: int | None) -> str:
        elapsed = max(time.monotonic() - self._started, 1e-6)
        return f"{self._rows:,} rows, {self._rows / elapsed:,.0f} rows/s"


__all__ = ["group", "parse_value", "parse_where"]


def _range_bound(client: Any, table: str, text: str) -> Any:
    """A range bound of ``table`` from the command line: the range column values
    (comma-separated when there are several), or ``unbounded`` (or empty)."""
    if text.strip().lower() in ("", "unbounded"):
        return None
    handle = client.table(table)
    columns = handle.partition_schema.range_columns
    if not columns:
        raise InvalidArgumentError(f"table {table!r} has no range partitioning")
    values = _split_list(text) if len(columns) > 1 else [text]
    if len(values) != len(columns):
        raise InvalidArgumentError(
            f"bound {text!r} needs {len(columns)} comma-separated value(s) for {list(columns)}"
        )
    row = tuple(parse_value(handle.schema, c, v) for c, v in zip(columns, values, strict=True))
    return row if len(row) > 1 else row[0]


def _alter_range(name: str, lower: str, upper: str, masters: str, fmt: str, add: bool) -> None:
    from nyala.partition import describe_range

    with client_for(masters) as client:
        bounds = (_range_bound(client, name, lower), _range_bound(client, name, upper))
        key = "add_range_partition" if add else "drop_range_partition"
        table = client.alter_table(name, **{key: bounds})
        ranges = sorted({t.partition.range_bounds() for t in table.tablets()})
        shown = [
            describe_range(table.schema, table.partition_schema.range_columns, lo, hi)
            for lo, hi in ranges
        ]
    emit_one(
        {
            "table": name,
            "added" if add else "dropped": [lower, upper],
            "tablets": len(table.tablets()),
            "ranges": shown,
        },
        fmt,
    )


def _range_command(add: bool, summary: str) -> None:
    """Registers ``add-range-partition`` or ``drop-range-partition`` (the same arguments)."""

    @group.command(name=f"{'add' if add else 'drop'}-range-partition", help=summary)
    @click.argument("name")
    @click.argument("lower")
    @click.argument("upper")
    @masters_option
    @format_option
    @one_line
    def command(name: str, lower: str, upper: str, masters: str, fmt: str) -> None:
        _alter_range(name, lower, upper, masters, fmt, add=add)


_range_command(
    True,
    "Add the range LOWER <= key < UPPER to table NAME (in every hash bucket). Bounds are "
    "values of the range column(s), comma-separated when there are several, or 'unbounded'.",
)
_range_command(
    False,
    "Drop the range LOWER <= key < UPPER of table NAME: its tablets and rows are deleted.",
)
