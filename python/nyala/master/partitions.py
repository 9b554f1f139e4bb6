"""The partitions of a new table: hash buckets x range partitions.

Uses ``nyala.partition`` (the client's partitioning code, shared so the client and the master
encode partition keys the same way) when it is present; until then only hash partitioning
over one unbounded range is supported here, with each hash level encoded as a 4-byte
big-endian bucket number at the front of the partition key (Kudu's layout).
"""

from __future__ import annotations

import importlib
import itertools
from typing import Any

from nyala._proto import metadata_pb2
from nyala.errors import InvalidArgumentError, NotSupportedError
from nyala.schema import Schema

#: At most this many tablets per table (each is a Raft group on RF tservers).
TABLETS_PER_TABLE_MAX = 1_000
_BUCKET_BYTES = 4


def _validate(schema: Schema, partition_schema: Any) -> None:
    key = set(schema.key)
    for level in partition_schema.hash_schema:
        if level.num_buckets < 2:
            raise InvalidArgumentError("a hash level needs at least 2 buckets")
        if not level.columns:
            raise InvalidArgumentError("a hash level needs at least one column")
        for column in level.columns:
            if column not in key:
                raise InvalidArgumentError(f"hash column {column!r} is not a key column")
    for column in partition_schema.range_columns:
        if column not in key:
            raise InvalidArgumentError(f"range column {column!r} is not a key column")


def _with_shared_module(schema: Schema, request: Any) -> list[Any] | None:
    try:
        module: Any = importlib.import_module("nyala.partition")
    except ImportError:
        return None
    enumerate_fn = getattr(module, "partitions_for_create_table", None)
    if enumerate_fn is None:
        return None
    return list(enumerate_fn(schema, request))


def table_partitions(schema: Schema, request: Any) -> list[Any]:
    """The ``PartitionPB`` of every tablet of a table created by ``request``
    (a ``CreateTableRequestPB``), sorted by partition key start."""
    partition_schema = request.partition_schema
    _validate(schema, partition_schema)
    shared = _with_shared_module(schema, request)
    if shared is not None:
        partitions = shared
    else:
        if request.split_rows or len(request.range_bounds) > 0:
            raise NotSupportedError("range partitions need nyala.partition, not present yet")
        partitions = _hash_partitions([h.num_buckets for h in partition_schema.hash_schema])
    if len(partitions) > TABLETS_PER_TABLE_MAX:
        raise InvalidArgumentError(
            f"{len(partitions)} tablets requested; at most {TABLETS_PER_TABLE_MAX} per table"
        )
    return sorted(partitions, key=lambda p: bytes(p.partition_key_start))


def _hash_partitions(buckets_per_level: list[int]) -> list[Any]:
    if not buckets_per_level:
        return [metadata_pb2.PartitionPB()]
    out = []
    combos = list(itertools.product(*(range(n) for n in buckets_per_level)))
    for i, combo in enumerate(combos):
        # The first tablet starts at the beginning of the key space: every key has a home.
        start = b"" if i == 0 else b"".join(b.to_bytes(_BUCKET_BYTES, "big") for b in combo)
        end = b""
        if i + 1 < len(combos):
            end = b"".join(b.to_bytes(_BUCKET_BYTES, "big") for b in combos[i + 1])
        out.append(
            metadata_pb2.PartitionPB(
                hash_buckets=list(combo), partition_key_start=start, partition_key_end=end
            )
        )
    return out
