"""The client's cache of table metadata and tablet locations.

A table's entry holds its schema, partition schema, the locations of all its tablets (sorted by
partition key start, with each tablet's replicas and leader as the master last reported them)
and a ``PartitionRouter`` over them. Locations expire after the TTL the master gave; any error
that says our picture is stale (``NOT_THE_LEADER`` without a usable hint, ``TABLET_NOT_FOUND``,
``WRONG_SERVER_UUID``, an unreachable server) invalidates the table's entry so the next
attempt asks the master again. A leader hint from a tserver updates one tablet in place.

Only range partitions change a table's layout after creation (added or dropped, perhaps by
another client), and no tablet server can tell a client that: so a scan of a range-partitioned
table starts from locations asked of the master (``refresh=True``), and a write that finds no
cached tablet for a row asks once before refusing it (``nyala.client.write``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass

from nyala import _native
from nyala._proto import master_pb2, metadata_pb2
from nyala.client.masters import MasterConnection
from nyala.partition import Partition, PartitionSchema
from nyala.rpc.errors import join_host_port
from nyala.rpc.schema_pb import schema_from_pb
from nyala.schema import Schema

#: Used when the master gives no TTL, in milliseconds.
LOCATIONS_TTL_DEFAULT_MS = 60_000


@dataclass(frozen=True)
class Replica:
    """One replica of a tablet as the master reports it."""

    uuid: str
    addr: str
    role: str
    member_type: str


@dataclass(frozen=True)
class TabletLocation:
    """One tablet: its partition, replicas and the leader last known."""

    tablet_id: str
    partition: Partition
    replicas: tuple[Replica, ...]
    leader_uuid: str

    def replica(self, uuid: str) -> Replica | None:
        """The replica on server ``uuid``, if any."""
        return next((r for r in self.replicas if r.uuid == uuid), None)

    @property
    def leader(self) -> Replica | None:
        """The leader's replica, if known."""
        return self.replica(self.leader_uuid) if self.leader_uuid else None


@dataclass(frozen=True)
class TableInfo:
    """What the master says about a table."""

    table_id: str
    name: str
    schema: Schema
    partition_schema: PartitionSchema
    num_replicas: int


@dataclass
class TableLocations:
    """Every tablet of one table and the router over them."""

    tablets: list[TabletLocation]
    router: _native.PartitionRouter
    expires_at: float
    schema_version: int
    #: ``time.monotonic()`` when the master answered.
    fetched_at: float = 0.0
    #: A secure cluster: this client's privileges on the table, signed by the master, for
    #: the tablet servers (valid at least until ``expires_at``; empty on an insecure cluster).
    authz_token: bytes = b""

    def expired(self) -> bool:
        """True once the TTL has passed."""
        return time.monotonic() >= self.expires_at


class MetaCache:
    """Table infos by name, locations by table id. Thread-safe."""

    def __init__(self, masters: MasterConnection) -> None:
        self.masters = masters
        self._tables: dict[str, TableInfo] = {}
        self._locations: dict[str, TableLocations] = {}
        self._lock = threading.Lock()

    def table(self, name: str, *, refresh: bool = False) -> TableInfo:
        """The table called ``name`` (``NotFoundError`` if there is none)."""
        with self._lock:
            info = None if refresh else self._tables.get(name)
        if info is not None:
            return info
        request = master_pb2.GetTableSchemaRequestPB(
            table=master_pb2.TableIdentifierPB(table_name=name)
        )
        response = self.masters.call(lambda s: s.master.GetTableSchema, request)
        info = TableInfo(
            table_id=response.table_id,
            name=response.table_name or name,
            schema=schema_from_pb(response.schema),
            partition_schema=PartitionSchema.from_pb(response.partition_schema),
            num_replicas=response.num_replicas,
        )
        with self._lock:
            self._tables[name] = info
        return info

    def peek(self, name: str) -> TableInfo | None:
        """The cached info of ``name``, if any (never asks the master)."""
        with self._lock:
            return self._tables.get(name)

    def forget_table(self, name: str) -> None:
        """Drops the cached info of ``name`` (after a DDL changed or removed it)."""
        with self._lock:
            info = self._tables.pop(name, None)
            if info is not None:
                self._locations.pop(info.table_id, None)

    def locations(self, info: TableInfo, *, refresh: bool = False) -> TableLocations:
        """The table's tablet locations, from the cache unless expired or invalidated (or
        ``refresh``: asked of the master in any case, and cached)."""
        with self._lock:
            cached = None if refresh else self._locations.get(info.table_id)
        if cached is not None and not cached.expired():
            return cached
        request = master_pb2.GetTableLocationsRequestPB(
            table=master_pb2.TableIdentifierPB(table_id=info.table_id)
        )
        response = self.masters.call(lambda s: s.master.GetTableLocations, request)
        tablets = [_location_from_pb(pb) for pb in response.tablet_locations]
        tablets.sort(key=lambda t: t.partition.key_start)
        router = _native.PartitionRouter(
            [(list(h.columns), h.buckets, h.seed) for h in info.partition_schema.hash_levels],
            list(info.partition_schema.range_columns),
            [t.partition.key_start for t in tablets],
            [t.partition.key_end for t in tablets],
        )
        ttl_ms = response.ttl_ms or LOCATIONS_TTL_DEFAULT_MS
        now = time.monotonic()
        fresh = TableLocations(
            tablets,
            router,
            now + ttl_ms / 1000,
            response.schema_version,
            fetched_at=now,
            authz_token=response.authz_token,
        )
        with self._lock:
            self._locations[info.table_id] = fresh
        return fresh

    def invalidate(self, table_id: str) -> None:
        """Forgets the table's locations: the next lookup asks the master."""
        with self._lock:
            self._locations.pop(table_id, None)

    def set_leader(self, table_id: str, tablet_id: str, leader_uuid: str) -> bool:
        """Records a leader hint from a tserver; False if the hint names no known replica
        (then the caller invalidates instead)."""
        with self._lock:
            cached = self._locations.get(table_id)
            if cached is None:
                return False
            for i, tablet in enumerate(cached.tablets):
                if tablet.tablet_id == tablet_id:
                    if tablet.replica(leader_uuid) is None:
                        return False
                    cached.tablets[i] = dataclasses.replace(tablet, leader_uuid=leader_uuid)
                    return True
        return False


def _location_from_pb(pb: master_pb2.TabletLocationsPB) -> TabletLocation:
    replicas = tuple(
        Replica(
            uuid=r.ts_info.permanent_uuid,
            addr=join_host_port(r.ts_info.rpc_addr.host, r.ts_info.rpc_addr.port),
            role=master_pb2.RaftRole.Name(r.role).removeprefix("ROLE_"),
            member_type=_member_type_name(r.member_type),
        )
        for r in pb.replicas
    )
    return TabletLocation(
        tablet_id=pb.tablet_id,
        partition=Partition.from_pb(pb.partition),
        replicas=replicas,
        leader_uuid=pb.leader_uuid,
    )


def _member_type_name(value: metadata_pb2.MemberType.ValueType) -> str:
    return metadata_pb2.MemberType.Name(value)


__all__ = ["MetaCache", "Replica", "TableInfo", "TableLocations", "TabletLocation"]
