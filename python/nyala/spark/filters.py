"""Spark filters → nyala scan predicates.

Spark offers a Python data source the conjuncts of a query's WHERE clause as
``pyspark.sql.datasource.Filter`` objects; each one this module can express exactly as a
nyala predicate (``=, <, <=, >, >=, IN, IS [NOT] NULL`` on one column, DESIGN.md §5) is pushed
into the tablet scans, the rest stay with Spark. A filter is pushed only if its literal is a
value of the column's type (``id > 2.5`` on an int64 column is Spark's to evaluate), so a pushed
predicate never changes which rows a query returns. Predicates on floating-point columns are
pushed and also handed back to Spark, which re-checks them: NaN ordering is where engines
differ, and re-checking a few surviving rows costs little.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
from collections.abc import Sequence
from typing import Any

from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
)

from nyala.errors import InvalidArgumentError
from nyala.schema import Column, Schema, decimal_params, normalize_default, varchar_chars

#: A nyala scan predicate as ``table.scan(where=...)`` takes it: ``(column, op, value)``, or
#: ``(column, "is null")`` / ``(column, "is not null")``.
Predicate = tuple[Any, ...]
#: Most values one pushed ``IN`` may hold; a longer list stays with Spark.
IN_VALUES_MAX = 1024

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_COMPARISONS: dict[type[Filter], str] = {
    EqualTo: "=",
    GreaterThan: ">",
    GreaterThanOrEqual: ">=",
    LessThan: "<",
    LessThanOrEqual: "<=",
}
_INT_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64, "timestamp": 64}


class _NotExpressible(Exception):
    """A literal that is not a value of the column's type."""


@dataclasses.dataclass(frozen=True)
class Pushdown:
    """The outcome of translating a list of filters."""

    #: Predicates for the scans (their conjunction).
    predicates: tuple[Predicate, ...]
    #: Filters Spark must still evaluate (by identity: each is one of the inputs).
    remaining: tuple[Filter, ...]


def translate(filters: Sequence[Filter], schema: Schema) -> Pushdown:
    """Splits ``filters`` (a conjunction) into nyala predicates and what Spark keeps."""
    predicates: list[Predicate] = []
    remaining: list[Filter] = []
    for spark_filter in filters:
        predicate = translate_one(spark_filter, schema)
        if predicate is None:
            remaining.append(spark_filter)
            continue
        predicates.append(predicate)
        if schema.column(predicate[0]).type in ("float", "double"):
            remaining.append(spark_filter)
    return Pushdown(tuple(predicates), tuple(remaining))


def translate_one(spark_filter: Filter, schema: Schema) -> Predicate | None:
    """The nyala predicate equal to ``spark_filter``, or None if there is none."""
    attribute = getattr(spark_filter, "attribute", None)
    if attribute is None or len(attribute) != 1 or attribute[0] not in schema.names:
        return None  # Not(...), nested fields, unknown columns
    column = schema.column(attribute[0])
    try:
        return _predicate(spark_filter, column)
    except _NotExpressible:
        return None


def _predicate(spark_filter: Filter, column: Column) -> Predicate | None:
    name = column.name
    if isinstance(spark_filter, IsNull):
        return (name, "is null")
    if isinstance(spark_filter, IsNotNull):
        return (name, "is not null")
    if isinstance(spark_filter, EqualNullSafe):
        if spark_filter.value is None:
            return (name, "is null")
        return (name, "=", literal(spark_filter.value, column))
    op = _COMPARISONS.get(type(spark_filter))
    if op is not None:
        value = getattr(spark_filter, "value", None)
        if value is None:
            return None  # `a = NULL` is never true; Spark folds it, and nyala has no null literal
        return (name, op, literal(value, column))
    if isinstance(spark_filter, In):
        values = [v for v in spark_filter.value if v is not None]
        if not values or len(values) > IN_VALUES_MAX:
            return None
        return (name, "in", [literal(v, column) for v in values])
    return None  # string prefix/suffix/contains: nyala has no such predicate


def literal(value: Any, column: Column) -> Any:
    """``value`` as a literal of ``column``'s type; ``_NotExpressible`` if it is not one."""
    type_ = column.type
    if type_ in ("int8", "int16", "int32", "int64"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise _NotExpressible
        bits = _INT_BITS[type_]
        if not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
            raise _NotExpressible
        return value
    if type_ in ("float", "double"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _NotExpressible
        return float(value)
    if type_ == "timestamp":
        if not isinstance(value, datetime.datetime):
            raise _NotExpressible
        return timestamp_micros(value)
    if type_ == "date":
        if isinstance(value, datetime.datetime) or not isinstance(value, datetime.date):
            raise _NotExpressible
        return value
    if decimal_params(type_) is not None:
        if isinstance(value, bool) or not isinstance(value, (int, decimal.Decimal)):
            raise _NotExpressible
        try:  # a literal the column cannot hold exactly matches no row: Spark keeps it
            return normalize_default(type_, value)
        except InvalidArgumentError:
            raise _NotExpressible from None
    if varchar_chars(type_) is not None:
        # Stored values are cut to n characters, so a longer literal could match a cut
        # value: only literals that fit are pushed.
        if not isinstance(value, str) or len(value) > (varchar_chars(type_) or 0):
            raise _NotExpressible
        return value
    expected: dict[str, type | tuple[type, ...]] = {
        "bool": bool,
        "string": str,
        "binary": (bytes, bytearray),
    }
    if not isinstance(value, expected[type_]):
        raise _NotExpressible
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def timestamp_micros(value: datetime.datetime) -> int:
    """Microseconds since the epoch. Spark passes TIMESTAMP literals zone-aware; a naive value
    (TIMESTAMP_NTZ) is a UTC wall clock, which is what nyala stores."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.UTC)
    return (value - _EPOCH) // datetime.timedelta(microseconds=1)


__all__ = ["IN_VALUES_MAX", "Predicate", "Pushdown", "literal", "translate", "translate_one"]
