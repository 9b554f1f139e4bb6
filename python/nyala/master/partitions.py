"""The partitions of a new table: hash buckets x range partitions, computed by
``nyala.partition`` (shared with the client, so both encode partition keys the same way); the
master only adds its own limit on tablets per table.
"""

from __future__ import annotations

from nyala._proto import master_pb2, metadata_pb2
from nyala.errors import InvalidArgumentError
from nyala.partition import partitions_for_create_table
from nyala.schema import Schema

#: At most this many tablets per table (each is a Raft group on RF tservers).
TABLETS_PER_TABLE_MAX = 1_000


def table_partitions(
    schema: Schema, request: master_pb2.CreateTableRequestPB
) -> list[metadata_pb2.PartitionPB]:
    """The ``PartitionPB`` of every tablet of a table created by ``request``
    (a ``CreateTableRequestPB``), sorted by partition key start."""
    partitions = partitions_for_create_table(schema, request)
    if len(partitions) > TABLETS_PER_TABLE_MAX:
        raise InvalidArgumentError(
            f"{len(partitions)} tablets requested; at most {TABLETS_PER_TABLE_MAX} per table"
        )
    return sorted(partitions, key=lambda p: bytes(p.partition_key_start))
