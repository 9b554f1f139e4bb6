"""The in-memory catalog of the leader master: tables and tablets as their committed records.

Records are protobufs (``SysTableEntryPB``/``SysTabletEntryPB``) that are never changed in
place: a mutation copies a record, changes the copy, replicates it, and only then swaps it in
(copy-on-write, seed 002 "Ensure strict ordering"), so a reader always sees committed state.

Maps (seed 002, "What master metadata is replicated"): tables by id (deleted ones included),
tables by name (deleted ones omitted, so a new table may reuse the name), tablets by id (all).
Replica locations live in each tablet record's consensus state, never in a separate cache
(KUDU-1353).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from google.protobuf.message import Message

from nyala._proto import master_pb2, metadata_pb2
from nyala.errors import NotFoundError
from nyala.rpc.schema_pb import schema_from_pb
from nyala.schema import Schema

TABLE_REMOVED = master_pb2.SYS_TABLE_REMOVED
TABLET_LIVE_STATES = (master_pb2.SYS_TABLET_CREATING, master_pb2.SYS_TABLET_RUNNING)

_Record = TypeVar("_Record", bound=Message)


def copy_record(pb: _Record) -> _Record:
    """A copy of a record, to change and replicate (records are never changed in place)."""
    new = type(pb)()
    new.CopyFrom(pb)
    return new


def config_opid_index(config: metadata_pb2.RaftConfigPB) -> int:
    """The op index of a ``RaftConfigPB`` (-1: the bootstrap config, which has none)."""
    return int(config.opid_index) if config.HasField("opid_index") else -1


@dataclass(eq=False)
class TabletInfo:
    """One tablet; ``pb`` is its committed record."""

    pb: master_pb2.SysTabletEntryPB  # replaced on commit, never mutated

    @property
    def tablet_id(self) -> str:
        """The tablet's id."""
        return str(self.pb.tablet_id)

    @property
    def is_live(self) -> bool:
        """CREATING or RUNNING (not replaced, not deleted)."""
        return self.pb.state in TABLET_LIVE_STATES


@dataclass(eq=False)
class TableInfo:
    """One table; ``pb`` is its committed record, ``tablets`` every tablet ever created for it."""

    pb: master_pb2.SysTableEntryPB  # replaced on commit, never mutated
    tablets: dict[str, TabletInfo] = field(default_factory=dict)

    @property
    def table_id(self) -> str:
        """The table's id."""
        return str(self.pb.table_id)

    @property
    def name(self) -> str:
        """The table's current name."""
        return str(self.pb.name)

    @property
    def is_removed(self) -> bool:
        """Deleted (kept by id only)."""
        return bool(self.pb.state == TABLE_REMOVED)

    def schema(self) -> Schema:
        """The table's current schema, with its column-id counter."""
        parsed = schema_from_pb(self.pb.schema)
        return Schema(
            parsed.columns,
            parsed.key,
            version=parsed.version,
            next_column_id=self.pb.next_column_id,
        )

    def live_tablets(self) -> list[TabletInfo]:
        """CREATING and RUNNING tablets, by partition key start."""
        live = [t for t in self.tablets.values() if t.is_live]
        return sorted(live, key=lambda t: bytes(t.pb.partition.partition_key_start))


class Catalog:
    """The three maps; changed only through ``commit_*`` after a replicated write."""

    def __init__(self) -> None:
        self.tables_by_id: dict[str, TableInfo] = {}
        self.tables_by_name: dict[str, TableInfo] = {}
        self.tablets_by_id: dict[str, TabletInfo] = {}

    @staticmethod
    def from_records(
        tables: Iterable[master_pb2.SysTableEntryPB],
        tablets: Iterable[master_pb2.SysTabletEntryPB],
    ) -> Catalog:
        """The catalog a sys-catalog load describes."""
        catalog = Catalog()
        for table_pb in tables:
            catalog.commit_table(table_pb)
        for tablet_pb in tablets:
            catalog.commit_tablet(tablet_pb)
        return catalog

    def table(self, ident: master_pb2.TableIdentifierPB) -> TableInfo:
        """The live table a ``TableIdentifierPB`` names; ``NotFoundError`` otherwise."""
        info: TableInfo | None = None
        if ident.table_id:
            info = self.tables_by_id.get(ident.table_id)
        elif ident.table_name:
            info = self.tables_by_name.get(ident.table_name)
        if info is None or info.is_removed:
            what = ident.table_id or ident.table_name or "<no table named>"
            raise NotFoundError(f"table {what} does not exist")
        return info

    def commit_tablet(self, pb: master_pb2.SysTabletEntryPB) -> TabletInfo:
        """Swaps in a committed tablet record (tablets commit before their table)."""
        info = self.tablets_by_id.get(pb.tablet_id)
        if info is None:
            info = TabletInfo(pb)
            self.tablets_by_id[info.tablet_id] = info
        else:
            info.pb = pb
        table = self.tables_by_id.get(pb.table_id)
        if table is not None:
            table.tablets[info.tablet_id] = info
        return info

    def commit_table(self, pb: master_pb2.SysTableEntryPB) -> TableInfo:
        """Swaps in a committed table record and fixes the name map."""
        info = self.tables_by_id.get(pb.table_id)
        if info is None:
            info = TableInfo(pb)
            self.tables_by_id[info.table_id] = info
            for tablet in self.tablets_by_id.values():
                if tablet.pb.table_id == info.table_id:
                    info.tablets[tablet.tablet_id] = tablet
        else:
            old_name = info.name
            if self.tables_by_name.get(old_name) is info:
                del self.tables_by_name[old_name]
            info.pb = pb
        if not info.is_removed:
            self.tables_by_name[info.name] = info
        return info

    def live_tables(self) -> list[TableInfo]:
        """Tables not deleted, by name."""
        return sorted(self.tables_by_name.values(), key=lambda t: t.name)

    def replica_counts(self) -> dict[str, int]:
        """Live replicas per tserver UUID, from the tablet records (placement's load)."""
        counts: dict[str, int] = {}
        for tablet in self.tablets_by_id.values():
            if not tablet.is_live:
                continue
            for peer in tablet.pb.consensus_state.committed_config.peers:
                counts[peer.permanent_uuid] = counts.get(peer.permanent_uuid, 0) + 1
        return counts
