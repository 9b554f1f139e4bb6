"""The payload of a WRITE log entry: who asked (request id), for which schema, and the rows.

Layout (little-endian; docs/tablet-write-entry.md)::

    offset  bytes  field
    0       4      magic b"NYWR"
    4       1      format version (3; 1 and 2 are still read)
    5       1      kind: 0 = row ops, 1 = schema change (the tail is the new schema, JSON)
    6       2      client id length in bytes (n, at most 1024)
    8       8      sequence number (signed; -1 = no request id)
    16      8      first incomplete sequence number (signed)
    24      4      schema version the ops were encoded for
    28      8      timestamp: the entry's hybrid time (version 3; versions 1 and 2 lack it)
    36      n      client id (UTF-8)
    36+n    p      zeros up to a multiple of 8 (versions 2 and 3; version 1 has none)
    36+n+p  ...    the op batch: one Arrow IPC stream (table columns + op-type column)

The timestamp is the commit time of every row of the batch (storage keeps it with each row
version for snapshot reads); it never decreases in op-index order within a tablet. Entries
of versions 1 and 2 read as timestamp 0, visible to every snapshot.

The op batch is the tail so that it can be handed to storage as a zero-copy slice; versions 2
and 3 start it 8-byte aligned, so the columns storage keeps can be the log's own bytes rather than
a realigned copy (an IPC stream's length is a multiple of 8, so entries stay aligned too).
The request id travels in the entry so that every replica, applying the same log, remembers
the same outcomes per client (exactly-once, DESIGN.md §4).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from nyala import _native
from nyala.errors import CorruptionError, InvalidArgumentError

MAGIC = b"NYWR"
FORMAT_VERSION = 3
_OPS_ALIGNMENT = 8
_HEADER = struct.Struct("<4sBBHqqIQ")
HEADER_BYTES = _HEADER.size
CLIENT_ID_BYTES_MAX = 1024
NO_SEQ_NO = -1
#: Largest timestamp (hybrid time is an unsigned 64-bit integer).
TIMESTAMP_MAX = 2**64 - 1
#: ``WriteEntry.kind`` values: the tail is an op batch, or a schema change (AlterSchema).
KIND_ROWS = 0
KIND_ALTER_SCHEMA = 1


#: The zeros that follow a header and client id of length ``len % 8 == i``: ``_PADDING[i]``.
_PADDING = tuple(bytes(-i % 8) for i in range(8))


@dataclass(frozen=True, slots=True)
class RequestId:
    """One client request (``RequestIdPB`` without the attempt count)."""

    client_id: str
    seq_no: int
    first_incomplete_seq_no: int


@dataclass(frozen=True, slots=True)
class WriteEntry:
    """A decoded WRITE payload; ``ops`` is a view into the payload (no copy)."""

    request_id: RequestId | None
    schema_version: int
    ops: memoryview
    kind: int = KIND_ROWS
    #: The entry's hybrid time (0 for entries written before format version 3).
    timestamp: int = 0


def _check_timestamp(timestamp: int) -> None:
    if not 0 <= timestamp <= TIMESTAMP_MAX:
        raise InvalidArgumentError(f"timestamp {timestamp} is not an unsigned 64-bit integer")


def encode_alter_schema_entry(schema_version: int, schema_doc: bytes, timestamp: int = 0) -> bytes:
    """The payload of a schema change to ``schema_version`` (``schema_doc``: the new schema
    and table name as JSON, see ``TabletReplica.alter_schema``) at hybrid time ``timestamp``.
    It travels as a WRITE entry so that it is ordered with the writes around it on every
    replica."""
    _check_timestamp(timestamp)
    head = _HEADER.pack(
        MAGIC, FORMAT_VERSION, KIND_ALTER_SCHEMA, 0, NO_SEQ_NO, NO_SEQ_NO, schema_version, timestamp
    )
    return head + _PADDING[HEADER_BYTES % _OPS_ALIGNMENT] + schema_doc


def encode_write_entry(
    request_id: RequestId | None, schema_version: int, ops: bytes, timestamp: int = 0
) -> bytes:
    """The payload of a WRITE entry for ``ops`` (Arrow IPC bytes) committed at hybrid time
    ``timestamp`` (assigned by the tablet leader; it must not decrease in op-index order)."""
    _check_timestamp(timestamp)
    client = b"" if request_id is None else request_id.client_id.encode()
    if len(client) > CLIENT_ID_BYTES_MAX:
        raise InvalidArgumentError(f"client id is {len(client)} bytes, max {CLIENT_ID_BYTES_MAX}")
    if request_id is not None and request_id.seq_no < 0:
        raise InvalidArgumentError(f"sequence number {request_id.seq_no} is negative")
    seq = NO_SEQ_NO if request_id is None else request_id.seq_no
    first = NO_SEQ_NO if request_id is None else request_id.first_incomplete_seq_no
    head = _HEADER.pack(
        MAGIC, FORMAT_VERSION, KIND_ROWS, len(client), seq, first, schema_version, timestamp
    )
    return b"".join((head, client, _PADDING[(HEADER_BYTES + len(client)) % _OPS_ALIGNMENT], ops))


def decode_write_entry(payload: bytes | memoryview) -> WriteEntry:
    """Parses a WRITE payload with the reader every replica applies with
    (``nyala_storage::write_entry``); damage is ``CorruptionError`` (the log's CRC passed, so a
    bad payload means a bug or a foreign writer, never something to skip)."""
    view = memoryview(payload)
    # The header and client id (with its padding) are all the reader looks at.
    head = bytes(view[: HEADER_BYTES + CLIENT_ID_BYTES_MAX + _OPS_ALIGNMENT])
    decoded = _native.decode_write_entry(head)
    kind, client, seq, first, schema_version, ops_start, timestamp = decoded
    if ops_start > len(view):
        raise CorruptionError("WRITE payload's client id overruns the payload")
    request_id = None if client is None else RequestId(client, seq, first)
    return WriteEntry(request_id, schema_version, view[ops_start:], kind, timestamp)
