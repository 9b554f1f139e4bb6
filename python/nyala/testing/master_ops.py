"""Master calls against a ``MiniCluster``, for tests and the stress test.

Each helper finds the leader master (``MiniCluster.leader_master``), names it as
``dest_uuid`` and sends one RPC of master.proto. ``call`` retries retriable refusals (not the
leader, catalog not loaded, unreachable) until ``deadline_s``; ``call_once`` does not, so a
caller can tell an acknowledged operation from one whose outcome is unknown.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from nyala import errors
from nyala._proto import master_pb2, metadata_pb2
from nyala.rpc.messages import Addressable
from nyala.rpc.schema_pb import schema_to_pb
from nyala.schema import Schema
from nyala.testing.mini_cluster import MiniCluster

RETRY_PAUSE_S = 0.05


# ``call_once`` and ``call`` name the RPC (``"CreateTable"``): their answer is typed Any, as its
# message type depends on that name.


def call_once(
    cluster: MiniCluster, method: str, request: Addressable, *, timeout_ms: int = 10_000
) -> Any:
    """One attempt at the current leader master."""
    leader = cluster.leader_master()
    request.dest_uuid = leader.uuid or ""
    with leader.proxy() as proxy:
        return proxy.call(getattr(proxy.master, method), request, timeout_ms=timeout_ms)


def call(
    cluster: MiniCluster, method: str, request: Addressable, *, deadline_s: float = 30.0
) -> Any:
    """``call_once`` until it is answered (or a final error), within ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return call_once(cluster, method, request)
        except errors.RETRIABLE:
            if time.monotonic() > deadline:
                raise
            time.sleep(RETRY_PAUSE_S)


def table_ident(name: str) -> master_pb2.TableIdentifierPB:
    """The ``TableIdentifierPB`` of a table name."""
    return master_pb2.TableIdentifierPB(table_name=name)


def create_table_request(
    name: str,
    schema: Schema,
    *,
    hash_columns: Sequence[str] = (),
    buckets: int = 0,
    replicas: int = 3,
) -> master_pb2.CreateTableRequestPB:
    """A ``CreateTableRequestPB``; hash partitioning when ``buckets`` > 1. It carries a
    fresh request id, so ``call`` may retry it safely."""
    request = master_pb2.CreateTableRequestPB(
        name=name, schema=schema_to_pb(schema), num_replicas=replicas, request_id=uuid.uuid4().hex
    )
    if buckets > 1:
        request.partition_schema.hash_schema.add(
            columns=list(hash_columns or schema.key), num_buckets=buckets
        )
    return request


def add_column_request(name: str, column: str, type_name: str) -> master_pb2.AlterTableRequestPB:
    """An ``AlterTableRequestPB`` adding one nullable column."""
    request = master_pb2.AlterTableRequestPB(table=table_ident(name), request_id=uuid.uuid4().hex)
    step = request.steps.add()
    step.add_column.column.name = column
    step.add_column.column.type = type_name
    step.add_column.column.nullable = True
    return request


def wait_until(
    predicate: Callable[[], object], *, timeout_s: float = 30.0, what: str = "condition"
) -> None:
    """Polls ``predicate()`` (retriable errors count as False) until true."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except errors.RETRIABLE:
            pass
        time.sleep(RETRY_PAUSE_S)
    raise errors.TimedOutError(f"{what} not reached within {timeout_s} s")


def wait_create_done(cluster: MiniCluster, name: str, *, timeout_s: float = 30.0) -> None:
    """Until every tablet of ``name`` has a leader."""
    request = master_pb2.IsCreateTableDoneRequestPB(table=table_ident(name))
    wait_until(
        lambda: call_once(cluster, "IsCreateTableDone", request).done,
        timeout_s=timeout_s,
        what=f"creation of {name}",
    )


def wait_alter_done(cluster: MiniCluster, name: str, *, timeout_s: float = 30.0) -> None:
    """Until every tablet of ``name`` reported the table's schema version."""
    request = master_pb2.IsAlterTableDoneRequestPB(table=table_ident(name))
    wait_until(
        lambda: call_once(cluster, "IsAlterTableDone", request).done,
        timeout_s=timeout_s,
        what=f"alter of {name}",
    )


def list_tables(cluster: MiniCluster) -> dict[str, master_pb2.ListTablesResponsePB.TableInfoPB]:
    """Live tables by name."""
    response: master_pb2.ListTablesResponsePB = call(
        cluster, "ListTables", master_pb2.ListTablesRequestPB()
    )
    return {t.name: t for t in response.tables}


def locations(cluster: MiniCluster, name: str) -> list[master_pb2.TabletLocationsPB]:
    """The ``TabletLocationsPB`` of every tablet of ``name``."""
    request = master_pb2.GetTableLocationsRequestPB(table=table_ident(name))
    response: master_pb2.GetTableLocationsResponsePB = call(cluster, "GetTableLocations", request)
    return list(response.tablet_locations)


def masters(cluster: MiniCluster) -> list[master_pb2.MasterEntryPB]:
    """``MasterEntryPB`` of every master, as the leader sees them."""
    response: master_pb2.ListMastersResponsePB = call(
        cluster, "ListMasters", master_pb2.ListMastersRequestPB()
    )
    return list(response.masters)


def is_voter(entry: master_pb2.MasterEntryPB) -> bool:
    """Whether a ``MasterEntryPB`` is a VOTER."""
    return entry.member_type == metadata_pb2.VOTER
