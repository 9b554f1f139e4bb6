"""Table schemas: the public ``nyala.Schema`` and ``nyala.Column`` types.

A schema is a list of columns (name, type, nullability, optional default) with a primary key
that is a prefix of non-null columns, a version that grows with every change, and stable column
ids (a rename or a drop never rewrites data; see docs/storage-format.md). The native engine
validates schemas again; this module gives early, readable errors and the CLI's string form::

    Schema.parse("id:int64, name:string?, ts:timestamp, n:int32=7", key=["id"])

where a trailing ``?`` marks a nullable column and ``=VALUE`` gives the column's write default.

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
import math
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from nyala.errors import InvalidArgumentError

#: The column types, by their canonical names.
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
    "timestamp": pa.timestamp("us"),
}

_ALIASES = {
    "float32": "float",
    "float64": "double",
    "boolean": "bool",
    "utf8": "string",
    "str": "string",
    "bytes": "binary",
    "timestamp[us]": "timestamp",
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
    """The canonical name of a column type; ``InvalidArgumentError`` if unknown."""
    lowered = name.strip().lower()
    lowered = _ALIASES.get(lowered, lowered)
    if lowered not in TYPES:
        raise InvalidArgumentError(
            f"unknown column type {name!r}; expected one of {', '.join(TYPES)}"
        )
    return lowered


def normalize_default(type_name: str, value: Any) -> Any:
    """``value`` as a default of a ``type_name`` column (int, float, bool, str or bytes;
    timestamps as int microseconds since the epoch), or ``InvalidArgumentError``."""
    if value is None:
        return None
    bad = InvalidArgumentError(f"default {value!r} does not fit a {type_name} column")
    if type_name == "timestamp" and isinstance(value, datetime.datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
        value = (aware - _EPOCH) // datetime.timedelta(microseconds=1)
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


def default_to_json(type_name: str, value: Any) -> Any:
    """The JSON form of a default (None stays None): numbers, booleans and strings as
    themselves, a non-finite float as its name (``"nan"``, ``"inf"``, ``"-inf"``), binary as
    base64 text."""
    if value is None:
        return None
    if type_name == "binary":
        return base64.b64encode(value).decode()
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
        """The Arrow type of this column's values."""
        return TYPES[self.type]


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
        """The Arrow schema of this table's rows."""
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
        """The tuple form ``nyala._native`` takes."""
        columns = [(int(c.id or 0), c.name, c.type, c.nullable, c.default) for c in self._columns]
        return (columns, self._key_count, self._version, self._next_column_id)

    @classmethod
    def from_native(cls, native: NativeSchema) -> Schema:
        """Inverse of ``to_native``."""
        columns, key_count, version, next_column_id = native
        cols = [
            Column(name=name, type=type_, nullable=nullable, default=default, id=id_)
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
        """Parses ``'id:int64, name:string?, ts:timestamp, n:int32=7'`` (``?``: nullable,
        ``=VALUE``: the write default; a default holds no comma)."""
        parts = text.split(",")
        if any(not part.strip() for part in parts):
            raise InvalidArgumentError(f"empty column in schema {text!r}")
        return cls([parse_column(part) for part in parts], list(key))


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
    timestamps as microseconds or ISO 8601."""
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
    return str(value)


__all__ = [
    "TYPES",
    "Column",
    "Schema",
    "canonical_type",
    "default_from_json",
    "default_to_json",
    "format_schema",
    "normalize_default",
    "parse_column",
    "parse_default",
]
