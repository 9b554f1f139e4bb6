"""Table schemas: the public ``nyala.Schema`` and ``nyala.Column`` types.

A schema is a list of columns (name, type, nullability, optional default) with a primary key
that is a prefix of non-null columns, a version that grows with every change, and stable column
ids (a rename or a drop never rewrites data; see docs/storage-format.md). The native engine
validates schemas again; this module gives early, readable errors and the CLI's string form::

    Schema.parse("id:int64, name:string?, price:decimal(10,2), day:date, code:varchar(8)",
                 key=["id"])

where a trailing ``?`` marks a nullable column and ``=VALUE`` gives the column's write default.
The types (docs/types-and-partitioning.md) are the integers, ``float``, ``double``, ``bool``,
``string``, ``binary``, ``timestamp`` (microseconds, UTC: zoned input is converted, naive input
is taken as UTC, scans return ``timestamp[us, tz=UTC]``), ``decimal(p,s)`` (1 <= p <= 38,
0 <= s <= p; Arrow decimal128), ``date`` (Arrow date32) and ``varchar(n)`` (1 <= n <= 65,535
characters; the tablet servers truncate longer values to n characters, as Kudu does).

A column's default (Kudu's write default) is what an INSERT or UPSERT row that leaves the column
out gets, and what rows written before the column was added read as. It is checked and
normalised here (an ``int32`` default must fit 32 bits; a timestamp default is microseconds
since the epoch, a ``datetime`` is converted), and it has one JSON form, ``default_to_json``,
which the wire schema and the tablet superblock both carry.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from nyala.errors import InvalidArgumentError

#: The column types without parameters, by their canonical names (``decimal(p,s)`` and
#: ``varchar(n)`` are the parameterised ones: ``arrow_type_of``).
TYPES: dict[str, pa.DataType] = {
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bool": pa.bool_(),
    "string": pa.string(),
    "binary": pa.binary(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(),
}
#: Most digits of a decimal, and most characters of a varchar (as in Kudu).
DECIMAL_PRECISION_MAX = 38
VARCHAR_CHARS_MAX = 65_535
_PARAMETERISED = re.compile(r"^(decimal|numeric|varchar)\s*\(([^()]*)\)$")

_ALIASES = {
    "float32": "float",
    "float64": "double",
    "boolean": "bool",
    "utf8": "string",
    "str": "string",
    "bytes": "binary",
    "timestamp[us]": "timestamp",
    "date32": "date",
}

#: The range of each integer type (timestamps are int64 microseconds).
_INT_RANGES = {
    "int8": (-(1 << 7), (1 << 7) - 1),
    "int16": (-(1 << 15), (1 << 15) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
    "timestamp": (-(1 << 63), (1 << 63) - 1),
}
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)

#: Types that cannot be part of a primary key (as in Kudu).
_NON_KEY_TYPES = frozenset({"float", "double", "bool"})
COLUMN_NAME_BYTES_MAX = 256
COLUMNS_MAX = 1024

NativeColumn = tuple[int, str, str, bool, Any]
NativeSchema = tuple[list[NativeColumn], int, int, int]


def canonical_type(name: str) -> str:
    """The canonical name of a column type (``decimal(10,2)``, ``varchar(32)``, ``int64``);
    ``InvalidArgumentError`` if unknown or its parameters are out of range."""
    lowered = name.strip().lower()
    lowered = _ALIASES.get(lowered, lowered)
    if lowered in TYPES:
        return lowered
    match = _PARAMETERISED.match(lowered)
    if match is None:
        raise InvalidArgumentError(
            f"unknown column type {name!r}; expected one of {', '.join(TYPES)}, "
            "decimal(p,s), varchar(n)"
        )
    base, params = match.group(1), [p.strip() for p in match.group(2).split(",")]
    try:
        numbers = [int(p) for p in params]
    except ValueError:
        raise InvalidArgumentError(f"column type {name!r}: parameters must be integers") from None
    if base == "varchar":
        if len(numbers) != 1 or not 1 <= numbers[0] <= VARCHAR_CHARS_MAX:
            raise InvalidArgumentError(
                f"column type {name!r}: varchar(n) needs 1 <= n <= {VARCHAR_CHARS_MAX}"
            )
        return f"varchar({numbers[0]})"
    if len(numbers) == 1:
        numbers.append(0)  # decimal(p) has scale 0, as in SQL and Kudu
    if len(numbers) != 2 or not (
        1 <= numbers[0] <= DECIMAL_PRECISION_MAX and 0 <= numbers[1] <= numbers[0]
    ):
        raise InvalidArgumentError(
            f"column type {name!r}: decimal(p,s) needs 1 <= p <= {DECIMAL_PRECISION_MAX} "
            "and 0 <= s <= p"
        )
    return f"decimal({numbers[0]},{numbers[1]})"


def decimal_params(type_name: str) -> tuple[int, int] | None:
    """``(precision, scale)`` of a canonical ``decimal(p,s)`` type name, else None."""
    if not type_name.startswith("decimal("):
        return None
    precision, scale = type_name[len("decimal(") : -1].split(",")
    return int(precision), int(scale)


def varchar_chars(type_name: str) -> int | None:
    """``n`` of a canonical ``varchar(n)`` type name, else None."""
    if not type_name.startswith("varchar("):
        return None
    return int(type_name[len("varchar(") : -1])


def arrow_type_of(type_name: str) -> pa.DataType:
    """The Arrow type of a canonical column type name: what writes are cast to and scans
    return (``timestamp[us, tz=UTC]`` for timestamps)."""
    params = decimal_params(type_name)
    if params is not None:
        return pa.decimal128(*params)
    if varchar_chars(type_name) is not None:
        return pa.string()
    return TYPES[type_name]


def storage_arrow_type_of(type_name: str) -> pa.DataType:
    """The Arrow type the storage engine holds for a column type: ``arrow_type_of`` except
    timestamps, which it stores without the zone label (always UTC microseconds)."""
    if type_name == "timestamp":
        return pa.timestamp("us")
    return arrow_type_of(type_name)


def normalize_default(type_name: str, value: Any) -> Any:
    """``value`` as a default of a ``type_name`` column (int, float, bool, str or bytes;
    timestamps as int microseconds since the epoch; dates as ``datetime.date``; decimals as an
    exact ``decimal.Decimal`` of the column's scale; varchar text cut to n characters), or
    ``InvalidArgumentError``."""
    if value is None:
        return None
    bad = InvalidArgumentError(f"default {value!r} does not fit a {type_name} column")
    if type_name == "timestamp" and isinstance(value, datetime.datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
        value = (aware - _EPOCH) // datetime.timedelta(microseconds=1)
    params = decimal_params(type_name)
    if params is not None:
        return _exact_decimal(value, *params, bad)
    if type_name == "date":
        if isinstance(value, datetime.datetime) or not isinstance(value, datetime.date):
            raise bad
        return value
    chars = varchar_chars(type_name)
    if chars is not None:
        if not isinstance(value, str):
            raise bad
        return value[:chars]
    if type_name in _INT_RANGES:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        low, high = _INT_RANGES[type_name]
        if not low <= value <= high:
            raise bad
        return int(value)
    if type_name in ("float", "double"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        return float(value)
    if type_name == "bool":
        if not isinstance(value, bool):
            raise bad
        return value
    if type_name == "string":
        if not isinstance(value, str):
            raise bad
        return value
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise bad
    return bytes(value)


def _exact_decimal(
    value: Any, precision: int, scale: int, bad: InvalidArgumentError
) -> decimal.Decimal:
    """``value`` (Decimal, int or decimal text) at ``scale`` places, when that is exact and it
    has at most ``precision`` digits."""
    if isinstance(value, bool) or not isinstance(value, (decimal.Decimal, int, str)):
        raise bad
    context = _EXACT
    try:
        exact = decimal.Decimal(value.strip() if isinstance(value, str) else value)
        if not exact.is_finite():
            raise bad
        scaled = exact.quantize(decimal.Decimal(1).scaleb(-scale), context=context)
    except (decimal.InvalidOperation, ValueError):
        raise bad from None
    if scaled != exact or abs(unscaled(scaled, scale)) >= 10**precision:
        raise bad
    return scaled


_EXACT = decimal.Context(prec=2 * DECIMAL_PRECISION_MAX)


def unscaled(value: decimal.Decimal, scale: int) -> int:
    """The unscaled integer of an exact decimal at ``scale`` places (Arrow's storage form)."""
    return int(value.scaleb(scale, context=_EXACT))


def from_unscaled(value: int, scale: int) -> decimal.Decimal:
    """Inverse of ``unscaled``: the decimal of ``value`` with ``scale`` places."""
    return decimal.Decimal(value).scaleb(-scale, context=_EXACT)


def default_to_json(type_name: str, value: Any) -> Any:
    """The JSON form of a default (None stays None): numbers, booleans and strings as
    themselves, a non-finite float as its name (``"nan"``, ``"inf"``, ``"-inf"``), binary as
    base64 text."""
    if value is None:
        return None
    if type_name == "binary":
        return base64.b64encode(value).decode()
    if isinstance(value, (decimal.Decimal, datetime.date)):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def default_from_json(type_name: str, doc: Any) -> Any:
    """Inverse of ``default_to_json``; ``InvalidArgumentError`` if it does not fit the type."""
    if doc is None:
        return None
    if type_name == "binary":
        if not isinstance(doc, str):
            raise InvalidArgumentError(f"binary default {doc!r} is not base64 text")
        return base64.b64decode(doc.encode(), validate=True)
    if type_name in ("float", "double") and isinstance(doc, str):
        return float(doc)
    if type_name == "date" and isinstance(doc, str):
        try:
            return datetime.date.fromisoformat(doc)
        except ValueError:
            raise InvalidArgumentError(f"date default {doc!r} is not an ISO date") from None
    return normalize_default(type_name, doc)


@dataclasses.dataclass(frozen=True)
class Column:
    """One column. ``id`` is assigned by ``Schema`` when left as None. ``default`` is the
    value an INSERT or UPSERT that leaves the column out writes (and that rows written before
    the column was added read as); None means null."""

    name: str
    type: str
    nullable: bool = False
    default: Any = None
    id: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "type", canonical_type(self.type))
        object.__setattr__(self, "default", normalize_default(self.type, self.default))

    @property
    def arrow_type(self) -> pa.DataType:
        """The Arrow type of this column's values (writes are cast to it, scans return it)."""
        return arrow_type_of(self.type)

    @property
    def storage_arrow_type(self) -> pa.DataType:
        """The Arrow type the storage engine holds (``storage_arrow_type_of``)."""
        return storage_arrow_type_of(self.type)


class Schema:
    """A validated table schema; immutable (changes return a new version)."""

    def __init__(
        self,
        columns: Sequence[Column],
        key: Sequence[str],
        *,
        version: int = 0,
        next_column_id: int | None = None,
    ) -> None:
        key = list(key)
        by_name: dict[str, Column] = {}
        for column in columns:
            if column.name in by_name:
                raise InvalidArgumentError(f"duplicate column name {column.name!r}")
            by_name[column.name] = column
        if not key:
            raise InvalidArgumentError("the primary key needs at least one column")
        if len(set(key)) != len(key):
            raise InvalidArgumentError(f"key {key} names a column twice")
        missing = [k for k in key if k not in by_name]
        if missing:
            raise InvalidArgumentError(f"key column(s) {missing} are not in the schema")
        # The key is a prefix of the columns: key columns move to the front, in key order.
        ordered = [by_name[k] for k in key] + [c for c in columns if c.name not in set(key)]
        ids_given = [c.id for c in ordered if c.id is not None]
        next_free = max(ids_given, default=-1) + 1
        numbered: list[Column] = []
        for column in ordered:
            if column.id is None:
                column = dataclasses.replace(column, id=next_free)
                next_free += 1
            numbered.append(column)
        self._columns: tuple[Column, ...] = tuple(numbered)
        self._key_count = len(key)
        self._version = version
        highest = max((c.id for c in numbered if c.id is not None), default=-1) + 1
        self._next_column_id = max(highest, next_column_id or 0)
        self._native: NativeSchema | None = None  # to_native's answer, made once
        self._validate()

    def _validate(self) -> None:
        if not 1 <= len(self._columns) <= COLUMNS_MAX:
            raise InvalidArgumentError(f"a schema has 1..={COLUMNS_MAX} columns")
        ids = [c.id for c in self._columns]
        if len(set(ids)) != len(ids):
            raise InvalidArgumentError("duplicate column ids")
        for i, column in enumerate(self._columns):
            name_bytes = len(column.name.encode())
            if not 0 < name_bytes <= COLUMN_NAME_BYTES_MAX or column.name.startswith("__"):
                raise InvalidArgumentError(
                    f"column name {column.name!r} must be 1..={COLUMN_NAME_BYTES_MAX} bytes "
                    "and not start with '__' (reserved)"
                )
            if i < self._key_count:
                if column.nullable:
                    raise InvalidArgumentError(f"key column {column.name!r} must not be nullable")
                if column.type in _NON_KEY_TYPES:
                    raise InvalidArgumentError(
                        f"key column {column.name!r} has type {column.type}, which cannot be a key"
                    )

    # --- reading ---------------------------------------------------------------------------

    @property
    def columns(self) -> tuple[Column, ...]:
        """The columns, key columns first."""
        return self._columns

    @property
    def key(self) -> list[str]:
        """The key column names, in key order."""
        return [c.name for c in self._columns[: self._key_count]]

    @property
    def version(self) -> int:
        """Grows by one with every schema change."""
        return self._version

    @property
    def next_column_id(self) -> int:
        """The id the next added column gets (ids are never reused)."""
        return self._next_column_id

    @property
    def names(self) -> list[str]:
        """Column names in order."""
        return [c.name for c in self._columns]

    def column(self, name: str) -> Column:
        """The column called ``name``."""
        for column in self._columns:
            if column.name == name:
                return column
        raise InvalidArgumentError(f"no column named {name!r}")

    def to_arrow(self) -> pa.Schema:
        """The Arrow schema of this table's rows (as scans return them)."""
        return pa.schema(
            [pa.field(c.name, c.arrow_type, nullable=c.nullable) for c in self._columns]
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Schema):
            return NotImplemented
        return (
            self._columns == other._columns
            and self._key_count == other._key_count
            and self._version == other._version
            and self._next_column_id == other._next_column_id
        )

    def __hash__(self) -> int:
        return hash((self._columns, self._key_count, self._version))

    def __repr__(self) -> str:
        return f"Schema({format_schema(self)!r}, key={self.key}, version={self._version})"

    # --- changes ---------------------------------------------------------------------------

    def add_column(self, column: Column) -> Schema:
        """The next version with ``column`` appended (nullable or with a default)."""
        if not column.nullable and column.default is None:
            raise InvalidArgumentError(
                f"added column {column.name!r} must be nullable or have a default"
            )
        added = dataclasses.replace(column, id=self._next_column_id)
        return self._successor([*self._columns, added], self._next_column_id + 1)

    def drop_column(self, name: str) -> Schema:
        """The next version without the non-key column ``name``."""
        if name in self.key:
            raise InvalidArgumentError(f"cannot drop key column {name!r}")
        self.column(name)
        return self._successor([c for c in self._columns if c.name != name])

    def rename_column(self, old: str, new: str) -> Schema:
        """The next version with column ``old`` called ``new``."""
        self.column(old)
        renamed = [dataclasses.replace(c, name=new) if c.name == old else c for c in self._columns]
        return self._successor(renamed)

    def _successor(self, columns: list[Column], next_id: int | None = None) -> Schema:
        key = [c.name for c in columns[: self._key_count]]
        return Schema(
            columns,
            key,
            version=self._version + 1,
            next_column_id=next_id if next_id is not None else self._next_column_id,
        )

    # --- native form -----------------------------------------------------------------------

    def to_native(self) -> NativeSchema:
        """The tuple form ``nyala._native`` takes (made once: a write of one row passes it on
        every call; do not change it)."""
        if self._native is None:
            columns = [
                (int(c.id or 0), c.name, c.type, c.nullable, _native_default(c.type, c.default))
                for c in self._columns
            ]
            self._native = (columns, self._key_count, self._version, self._next_column_id)
        return self._native

    @classmethod
    def from_native(cls, native: NativeSchema) -> Schema:
        """Inverse of ``to_native``."""
        columns, key_count, version, next_column_id = native
        cols = [
            Column(
                name=name,
                type=type_,
                nullable=nullable,
                default=_default_from_native(type_, default),
                id=id_,
            )
            for (id_, name, type_, nullable, default) in columns
        ]
        return cls(
            cols,
            [c.name for c in cols[:key_count]],
            version=version,
            next_column_id=next_column_id,
        )

    # --- the CLI's string form ---------------------------------------------------------------

    @classmethod
    def parse(cls, text: str, key: Iterable[str]) -> Schema:
        """Parses ``'id:int64, name:string?, price:decimal(10,2), n:int32=7'`` (``?``:
        nullable, ``=VALUE``: the write default; a default holds no comma, a comma inside a
        type's parentheses does not split columns)."""
        parts = split_columns(text)
        if any(not part.strip() for part in parts):
            raise InvalidArgumentError(f"empty column in schema {text!r}")
        return cls([parse_column(part) for part in parts], list(key))


def split_columns(text: str) -> list[str]:
    """``text`` split at the commas outside parentheses (``decimal(10,2)`` stays whole)."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(depth - 1, 0)
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _native_default(type_name: str, value: Any) -> Any:
    """A default in the form ``nyala._native`` takes: dates as days since the epoch, decimals
    as their unscaled integer."""
    if value is None:
        return None
    if type_name == "date":
        return (value - _EPOCH.date()).days
    params = decimal_params(type_name)
    if params is not None:
        return unscaled(value, params[1])
    return value


def _default_from_native(type_name: str, value: Any) -> Any:
    """Inverse of ``_native_default``."""
    if value is None:
        return None
    if type_name == "date" and isinstance(value, int):
        return _EPOCH.date() + datetime.timedelta(days=value)
    params = decimal_params(type_name)
    if params is not None and isinstance(value, int):
        return from_unscaled(value, params[1])
    return value


def parse_column(text: str) -> Column:
    """One column of ``Schema.parse``'s form: ``'name:type[?][=default]'``."""
    part = text.strip()
    if not part:
        raise InvalidArgumentError("a column of the schema is empty")
    name, sep, type_text = part.partition(":")
    type_text, has_default, default_text = type_text.partition("=")
    if not sep or not name.strip() or not type_text.strip():
        raise InvalidArgumentError(f"column {part!r} must look like 'name:type[?][=default]'")
    type_text = type_text.strip()
    nullable = type_text.endswith("?")
    type_name = canonical_type(type_text.rstrip("?").strip())
    default = parse_default(type_name, default_text) if has_default else None
    return Column(name.strip(), type_name, nullable=nullable, default=default)


def parse_default(type_name: str, text: str) -> Any:
    """A default written as text (the CLI's form) as a value of ``type_name``: integers,
    floats, ``true``/``false``, strings as given (quotes optional), binary as UTF-8 bytes,
    timestamps as microseconds or ISO 8601, dates as ISO 8601, decimals as decimal text."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    try:
        if type_name in ("int8", "int16", "int32", "int64"):
            return normalize_default(type_name, int(text))
        if type_name in ("float", "double"):
            return float(text)
        if type_name == "bool":
            if text.lower() not in ("true", "false"):
                raise ValueError(text)
            return text.lower() == "true"
        if type_name == "timestamp":
            if text.lstrip("-").isdigit():
                return int(text)
            return normalize_default(type_name, datetime.datetime.fromisoformat(text))
        if type_name == "date":
            return datetime.date.fromisoformat(text)
        if decimal_params(type_name) is not None:
            return normalize_default(type_name, text)
    except ValueError:
        raise InvalidArgumentError(f"default {text!r} is not a {type_name} value") from None
    return text.encode() if type_name == "binary" else text


def format_schema(schema: Schema) -> str:
    """The string form ``Schema.parse`` reads."""
    return ", ".join(
        f"{c.name}:{c.type}{'?' if c.nullable else ''}"
        + ("" if c.default is None else f"={_format_default(c.default)}")
        for c in schema.columns
    )


def _format_default(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return value.decode(errors="backslashreplace")
    return str(value)  # a Decimal or a date prints as the text parse_default reads


__all__ = [
    "DECIMAL_PRECISION_MAX",
    "TYPES",
    "VARCHAR_CHARS_MAX",
    "Column",
    "Schema",
    "arrow_type_of",
    "canonical_type",
    "decimal_params",
    "default_from_json",
    "default_to_json",
    "format_schema",
    "from_unscaled",
    "normalize_default",
    "parse_column",
    "parse_default",
    "split_columns",
    "storage_arrow_type_of",
    "unscaled",
    "varchar_chars",
]
