"""Types and schemas between Spark and nyala, with Arrow as the bridge.

Spark hands a Python data source Arrow batches (writes) and takes Arrow batches back (reads), so
every check and conversion here works on Arrow schemas and arrays and never on rows. The module
owns: the type mapping both ways, the Spark DDL of a nyala table (what ``DataSource.schema``
returns), the write plan that says, before any row is written, whether a DataFrame fits a table
(and how each column converts), and the per-batch selection that follows that plan. It imports
neither pyspark nor the client.

Type mapping (Spark SQL ↔ nyala): TINYINT int8, SMALLINT int16, INT int32, BIGINT int64, FLOAT
float, DOUBLE double, BOOLEAN bool, STRING string (and varchar(n), read back as STRING), BINARY
binary, TIMESTAMP and TIMESTAMP_NTZ timestamp (microseconds since the epoch, UTC; read back as
TIMESTAMP, as Kudu's ``UNIXTIME_MICROS`` is), DECIMAL(p,s) decimal(p,s), DATE date. Nested
types have no nyala column type: a DataFrame holding one is refused with the column's name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pyarrow as pa

from nyala.errors import InvalidArgumentError, SchemaMismatchError
from nyala.rowops import OpType
from nyala.schema import Column, Schema, canonical_type, decimal_params, varchar_chars

#: nyala column type → Spark SQL type name.
SPARK_TYPES: dict[str, str] = {
    "int8": "TINYINT",
    "int16": "SMALLINT",
    "int32": "INT",
    "int64": "BIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "bool": "BOOLEAN",
    "string": "STRING",
    "binary": "BINARY",
    "timestamp": "TIMESTAMP",
    "date": "DATE",
}
#: The time zone Spark's Python data source reader expects on timestamp columns.
READ_TIMEZONE = "UTC"
_INT_WIDTH = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}


def spark_type(type_name: str) -> str:
    """The Spark SQL type of a nyala column type (``DECIMAL(10,2)``; varchar(n) is STRING)."""
    params = decimal_params(type_name)
    if params is not None:
        return f"DECIMAL({params[0]},{params[1]})"
    if varchar_chars(type_name) is not None:
        return "STRING"
    return SPARK_TYPES[type_name]


def nyala_type_of(arrow_type: pa.DataType) -> str | None:
    """The nyala column type holding values of ``arrow_type`` exactly, or None."""
    if pa.types.is_decimal128(arrow_type):
        return canonical_type(f"decimal({arrow_type.precision},{arrow_type.scale})")
    if arrow_type == pa.date32():
        return "date"
    if pa.types.is_timestamp(arrow_type):
        # Spark sends TIMESTAMP as timestamp[us, tz=<session zone>] and TIMESTAMP_NTZ as
        # timestamp[us]; both carry UTC microseconds, which is what nyala stores.
        return "timestamp" if arrow_type.unit == "us" else None
    simple = {
        pa.int8(): "int8",
        pa.int16(): "int16",
        pa.int32(): "int32",
        pa.int64(): "int64",
        pa.float32(): "float",
        pa.float64(): "double",
        pa.bool_(): "bool",
        pa.string(): "string",
        pa.large_string(): "string",
        pa.binary(): "binary",
        pa.large_binary(): "binary",
    }
    return simple.get(arrow_type)


def converts_losslessly(source: str, target: str) -> bool:
    """True if every value of nyala type ``source`` is a value of ``target`` (same type,
    a narrower integer into a wider one, or float into double)."""
    if source == target:
        return True
    source_decimal, target_decimal = decimal_params(source), decimal_params(target)
    if source_decimal is not None and target_decimal is not None:
        # Every value fits when the integer digits and the scale both grow or stay.
        (sp, ss), (tp, ts) = source_decimal, target_decimal
        return ss <= ts and sp - ss <= tp - ts
    if varchar_chars(source) is not None:
        return target == "string"
    if source in _INT_WIDTH and target in _INT_WIDTH:
        return _INT_WIDTH[source] < _INT_WIDTH[target]
    return source == "float" and target == "double"


def quote_identifier(name: str) -> str:
    """A Spark SQL identifier for ``name`` (backticks, doubled inside)."""
    return "`" + name.replace("`", "``") + "`"


def spark_ddl(schema: Schema, columns: Sequence[str] | None = None) -> str:
    """The Spark DDL (``"`id` BIGINT NOT NULL, `v` DOUBLE"``) of ``columns`` of ``schema``."""
    names = list(columns) if columns is not None else schema.names
    parts = []
    for name in names:
        column = schema.column(name)
        null = "" if column.nullable else " NOT NULL"
        parts.append(f"{quote_identifier(name)} {spark_type(column.type)}{null}")
    return ", ".join(parts)


def read_arrow_schema(schema: Schema, columns: Sequence[str]) -> pa.Schema:
    """The Arrow schema Spark's reader expects for ``columns`` of ``schema`` (what pyspark's
    ``to_arrow_schema`` makes of ``spark_ddl``: timestamps carry the UTC zone)."""
    fields = []
    for name in columns:
        column = schema.column(name)
        arrow_type = column.arrow_type
        if column.type == "timestamp":
            arrow_type = pa.timestamp("us", tz=READ_TIMEZONE)
        fields.append(pa.field(name, arrow_type, nullable=column.nullable))
    return pa.schema(fields)


def to_read_batch(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """A scan batch relabelled as ``target`` (columns by name; timestamps gain their zone, a
    metadata-only change, so no buffer is copied)."""
    arrays = []
    for field in target:
        array = batch.column(field.name)
        if array.type != field.type:
            array = array.cast(field.type)
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, schema=target)


def schema_for_create(input_schema: pa.Schema, key: Sequence[str]) -> Schema:
    """The nyala schema ``nyala.createTable`` makes from a DataFrame's Arrow schema: key
    columns are NOT NULL whatever the DataFrame says (Spark marks most columns nullable)."""
    columns = []
    for field in input_schema:
        type_ = nyala_type_of(field.type)
        if type_ is None:
            raise SchemaMismatchError(
                f"column {field.name!r} has type {field.type}, which nyala cannot store "
                f"(supported: {', '.join(SPARK_TYPES.values())}, DECIMAL(p,s)); cast it first"
            )
        nullable = field.nullable and field.name not in key
        columns.append(Column(field.name, type_, nullable=nullable))
    missing = [k for k in key if k not in input_schema.names]
    if missing:
        raise SchemaMismatchError(f"primary key column(s) {missing} are not in the DataFrame")
    return Schema(columns, list(key))


def converts_by_row(source: str, target: str) -> bool:
    """True if values of nyala type ``source`` can be written to a ``target`` column, each
    value that does not fit (an integer out of ``target``'s range) being refused as a row error
    by the client (``nyala.rowops``): integers into any integer or floating column, floats into
    floats, and every type into itself."""
    numbers = {"int8", "int16", "int32", "int64", "float", "double"}
    if converts_losslessly(source, target):
        return True
    if decimal_params(target) is not None:
        # Each value must fit the precision and rescale exactly, else it is a row error.
        return source in _INT_WIDTH or decimal_params(source) is not None
    if varchar_chars(target) is not None:
        return source == "string" or varchar_chars(source) is not None  # truncated on write
    if source in _INT_WIDTH:
        return target in numbers
    return source in ("float", "double") and target in ("float", "double")


@dataclasses.dataclass(frozen=True)
class ColumnPlan:
    """How one table column is filled from the input."""

    name: str
    #: Target Arrow type (the table's).
    arrow_type: pa.DataType
    #: True if the input lacks the column: it is left out, and the tablet server writes its
    #: default (or null) in INSERT and UPSERT rows.
    omitted: bool


@dataclasses.dataclass(frozen=True)
class WritePlan:
    """The checked mapping from a DataFrame's columns to a table's, made before any write."""

    table: str
    operation: OpType
    columns: tuple[ColumnPlan, ...]
    schema_version: int

    @property
    def names(self) -> list[str]:
        """Columns of the batches handed to the client, in table order."""
        return [c.name for c in self.columns if not c.omitted]


def plan_write(
    input_schema: pa.Schema,
    table: str,
    schema: Schema,
    op: OpType,
    *,
    ignore_extra_columns: bool = False,
    parse_strings: bool = False,
) -> WritePlan:
    """Checks that a DataFrame with ``input_schema`` can be written to ``table`` with ``op``;
    ``SchemaMismatchError`` lists every problem at once, before any row is written.

    Deletes need only the key columns (others are ignored). Inserts and upserts may omit
    nullable columns and columns with a default (the tablet server writes the default, or
    null: Kudu's write default); updates replace whole rows, so they need every column.
    Columns the table lacks are a problem unless ``ignore_extra_columns``. A narrowing
    conversion (``bigint`` into an ``int32`` column) is accepted: each value that does not fit
    is a row error, the other rows are written. With ``parse_strings`` (text files) a string
    column may feed any column: each value that does not parse is a row error.
    """
    problems: list[str] = []
    present = {f.name: f for f in input_schema}
    if len(present) != len(input_schema):
        problems.append("the DataFrame has duplicate column names")
    unknown = [n for n in present if n not in schema.names]
    if unknown and not op.is_delete and not ignore_extra_columns:
        problems.append(
            f"column(s) {unknown} are not in table {table!r} (ignoreExtraColumns drops them)"
        )
    key = set(schema.key)
    plans = []
    for column in schema.columns:
        if op.is_delete and column.name not in key:
            continue
        field = present.get(column.name)
        if field is None:
            may_omit = column.nullable or column.default is not None
            if (
                may_omit
                and column.name not in key
                and op not in (OpType.UPDATE, OpType.UPDATE_IGNORE)
            ):
                plans.append(ColumnPlan(column.name, column.arrow_type, True))
            else:
                problems.append(f"column {column.name!r} ({column.type}) is missing")
            continue
        source = nyala_type_of(field.type)
        parsed = parse_strings and source == "string"
        if source is None or not (parsed or converts_by_row(source, column.type)):
            problems.append(
                f"column {column.name!r} is {field.type} in the DataFrame but {column.type} "
                f"in the table"
            )
            continue
        plans.append(ColumnPlan(column.name, column.arrow_type, False))
    if problems:
        raise SchemaMismatchError(
            f"the DataFrame does not fit table {table!r} for {op.name.lower()}: "
            + "; ".join(problems)
        )
    return WritePlan(table, op, tuple(plans), schema.version)


def conform(batch: pa.RecordBatch, plan: WritePlan) -> pa.RecordBatch:
    """``batch`` with the plan's columns in table order (zero-copy: no column is converted
    here; the client converts them and refuses the rows that do not fit, one by one)."""
    arrays: list[pa.Array] = []
    for name in plan.names:
        array = batch.column(name)
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, names=plan.names)


def check_projection(schema: Schema, columns: Sequence[str]) -> None:
    """``InvalidArgumentError`` unless every name in ``columns`` is a column of ``schema``."""
    unknown = [c for c in columns if c not in schema.names]
    if unknown:
        raise InvalidArgumentError(f"column(s) {unknown} are not in the table")


__all__ = [
    "READ_TIMEZONE",
    "SPARK_TYPES",
    "ColumnPlan",
    "WritePlan",
    "check_projection",
    "conform",
    "converts_by_row",
    "converts_losslessly",
    "nyala_type_of",
    "plan_write",
    "quote_identifier",
    "read_arrow_schema",
    "schema_for_create",
    "spark_ddl",
    "spark_type",
    "to_read_batch",
]
