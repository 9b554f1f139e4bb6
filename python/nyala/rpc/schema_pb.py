"""``Schema`` <-> ``SchemaPB``: the one wire form of a table schema, shared by the client, the
tservers and the master (all of which import ``nyala.rpc``).

The Arrow schema travels in IPC form, with each column's stable id in the field metadata key
``nyala.column_id`` (docs/storage-format.md), its type as written (``decimal(10,2)``,
``varchar(32)``: Arrow cannot tell a varchar from a string) in ``nyala.type``, and its write
default, if it has one, in ``nyala.default`` (``nyala.schema.default_to_json``'s form, as JSON
text). A schema without ``nyala.type`` (written before it existed) takes its types from Arrow.
The master keeps this form in its sys catalog, so a default survives master restarts and
leader changes.
"""

from __future__ import annotations

import json

import pyarrow as pa

from nyala._proto import master_pb2, metadata_pb2
from nyala.errors import InvalidArgumentError
from nyala.schema import (
    TYPES,
    Column,
    Schema,
    arrow_type_of,
    canonical_type,
    default_from_json,
    default_to_json,
)

_COLUMN_ID_KEY = b"nyala.column_id"
_DEFAULT_KEY = b"nyala.default"
_TYPE_KEY = b"nyala.type"
_TYPE_NAMES = {arrow_type: name for name, arrow_type in TYPES.items()}
_TYPE_NAMES[pa.timestamp("us")] = "timestamp"  # schemas written before timestamps had a zone


def _type_name(field: pa.Field) -> str | None:
    """The column type of a field of a wire schema, or None if nyala has no such type."""
    written = (field.metadata or {}).get(_TYPE_KEY)
    if written is not None:
        name = canonical_type(written.decode())
        return name if arrow_type_of(name) == field.type else None
    if pa.types.is_decimal128(field.type):
        return canonical_type(f"decimal({field.type.precision},{field.type.scale})")
    return _TYPE_NAMES.get(field.type)


def schema_to_pb(schema: Schema) -> metadata_pb2.SchemaPB:
    """The ``SchemaPB`` of ``schema``."""
    fields = []
    for c in schema.columns:
        metadata = {_COLUMN_ID_KEY: str(c.id).encode(), _TYPE_KEY: c.type.encode()}
        if c.default is not None:
            metadata[_DEFAULT_KEY] = json.dumps(default_to_json(c.type, c.default)).encode()
        fields.append(pa.field(c.name, c.arrow_type, nullable=c.nullable, metadata=metadata))
    return metadata_pb2.SchemaPB(
        arrow_schema=pa.schema(fields).serialize().to_pybytes(),
        key_columns=schema.key,
        version=schema.version,
    )


def schema_from_pb(pb: metadata_pb2.SchemaPB) -> Schema:
    """The ``Schema`` of a ``SchemaPB``; ``InvalidArgumentError`` if it is malformed."""
    try:
        arrow = pa.ipc.read_schema(pa.py_buffer(pb.arrow_schema))
    except (pa.ArrowInvalid, OSError) as err:
        raise InvalidArgumentError(f"schema.arrow_schema is not an Arrow schema: {err}") from None
    columns = []
    for f in arrow:
        name = _type_name(f)
        if name is None:
            raise InvalidArgumentError(f"column {f.name!r}: type {f.type} is not supported")
        metadata = f.metadata or {}
        raw_id = metadata.get(_COLUMN_ID_KEY)
        raw_default = metadata.get(_DEFAULT_KEY)
        try:
            default = (
                None if raw_default is None else default_from_json(name, json.loads(raw_default))
            )
        except ValueError as err:
            raise InvalidArgumentError(f"column {f.name!r}: bad default: {err}") from None
        columns.append(
            Column(
                f.name,
                name,
                nullable=f.nullable,
                default=default,
                id=None if raw_id is None else int(raw_id),
            )
        )
    return Schema(columns, list(pb.key_columns), version=pb.version)


def column_to_pb(column: Column) -> master_pb2.ColumnPB:
    """The ``ColumnPB`` of a column to add (AlterTable): name, type, nullability, default."""
    pb = master_pb2.ColumnPB(name=column.name, type=column.type, nullable=column.nullable)
    if column.default is not None:
        pb.default_json = json.dumps(default_to_json(column.type, column.default))
    return pb


def column_from_pb(pb: master_pb2.ColumnPB) -> Column:
    """The ``Column`` of a ``ColumnPB``; ``InvalidArgumentError`` if it is malformed."""
    default = None
    if pb.HasField("default_json"):
        try:
            default = default_from_json(canonical_type(pb.type), json.loads(pb.default_json))
        except ValueError as err:
            raise InvalidArgumentError(f"column {pb.name!r}: bad default: {err}") from None
    return Column(pb.name, pb.type, nullable=pb.nullable, default=default)


__all__ = ["column_from_pb", "column_to_pb", "schema_from_pb", "schema_to_pb"]
