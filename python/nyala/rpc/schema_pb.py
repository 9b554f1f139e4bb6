"""``Schema`` <-> ``SchemaPB``: the one wire form of a table schema, shared by the client, the
tservers and the master (all of which import ``nyala.rpc``).

The Arrow schema travels in IPC form, with each column's stable id in the field metadata key
``nyala.column_id`` (docs/storage-format.md).
"""

from __future__ import annotations

import pyarrow as pa

from nyala._proto import metadata_pb2
from nyala.errors import InvalidArgumentError
from nyala.schema import TYPES, Column, Schema

_COLUMN_ID_KEY = b"nyala.column_id"
_TYPE_NAMES = {arrow_type: name for name, arrow_type in TYPES.items()}


def schema_to_pb(schema: Schema) -> metadata_pb2.SchemaPB:
    """The ``SchemaPB`` of ``schema``."""
    fields = [
        pa.field(
            c.name, c.arrow_type, nullable=c.nullable, metadata={_COLUMN_ID_KEY: str(c.id).encode()}
        )
        for c in schema.columns
    ]
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
        name = _TYPE_NAMES.get(f.type)
        if name is None:
            raise InvalidArgumentError(f"column {f.name!r}: type {f.type} is not supported")
        raw_id = (f.metadata or {}).get(_COLUMN_ID_KEY)
        columns.append(
            Column(f.name, name, nullable=f.nullable, id=None if raw_id is None else int(raw_id))
        )
    return Schema(columns, list(pb.key_columns), version=pb.version)


__all__ = ["schema_from_pb", "schema_to_pb"]
