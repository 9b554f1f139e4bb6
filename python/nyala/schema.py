"""Table schemas: the public ``nyala.Schema`` and ``nyala.Column`` types.

A schema is a list of columns (name, type, nullability, optional default) with a primary key
that is a prefix of non-null columns, a version that grows with every change, and stable column
ids (a rename or a drop never rewrites data; see docs/storage-format.md). The native engine
validates schemas again; this module gives early, readable errors and the CLI's string form::

    Schema.parse("id:int64, name:string?, ts:timestamp", key=["id"])

where a trailing ``?`` marks a nullable column.
"""

from __future__ import annotations

import dataclasses
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


@dataclasses.dataclass(frozen=True)
class Column:
    """One column. ``id`` is assigned by ``Schema`` when left as None."""

    name: str
    type: str
    nullable: bool = False
    default: Any = None
    id: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "type", canonical_type(self.type))

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
        """Parses ``'id:int64, name:string?, ts:timestamp'`` (``?``: nullable)."""
        columns = []
        for part in text.split(","):
            part = part.strip()
            if not part:
                raise InvalidArgumentError(f"empty column in schema {text!r}")
            name, sep, type_text = part.partition(":")
            if not sep or not name.strip() or not type_text.strip():
                raise InvalidArgumentError(f"column {part!r} must look like 'name:type[?]'")
            type_text = type_text.strip()
            nullable = type_text.endswith("?")
            columns.append(Column(name.strip(), type_text.rstrip("?").strip(), nullable=nullable))
        return cls(columns, list(key))


def format_schema(schema: Schema) -> str:
    """The string form ``Schema.parse`` reads."""
    return ", ".join(f"{c.name}:{c.type}{'?' if c.nullable else ''}" for c in schema.columns)


__all__ = ["TYPES", "Column", "Schema", "canonical_type", "format_schema"]
