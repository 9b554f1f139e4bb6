"""DDL on the leader master's catalog: CreateTable, AlterTable, DeleteTable, and replacing a
tablet whose creation timed out.

Every operation follows seed 002's ordering contract (``nyala.master.catalog_manager``): under
the catalog lock, build the new records as copies, replicate the whole operation as one
sys-catalog batch, commit the records in memory only once that batch committed (tablets before
their table), and only then wake the background tasks that send RPCs to tablet servers. A
request id recorded on the table makes a retried request answer instead of repeating itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid as uuid_lib
from collections.abc import Collection, Iterable

from nyala._proto import master_pb2, metadata_pb2
from nyala.errors import AlreadyPresentError, InvalidArgumentError
from nyala.master.catalog import Catalog, TableInfo, copy_record
from nyala.master.catalog_manager import LEADER_POLL_S, CatalogManager
from nyala.master.partitions import TABLETS_PER_TABLE_MAX, table_partitions
from nyala.master.placement import choose_replicas
from nyala.master.privileges import owner_of_new_table
from nyala.master.sys_catalog import CatalogRecord
from nyala.master.ts_manager import TSDescriptor
from nyala.partition import (
    Partition,
    PartitionSchema,
    RangeSpec,
    create_partitions,
    describe_range,
    range_bounds_from_pb,
)
from nyala.rpc.auth import current_caller
from nyala.rpc.schema_pb import column_from_pb, schema_from_pb, schema_to_pb
from nyala.schema import Column, Schema

log = logging.getLogger(__name__)

TABLE_NAME_BYTES_MAX = 256


class TableDdl:
    """The DDL operations; one per master service, acting only while this master leads."""

    def __init__(self, manager: CatalogManager) -> None:
        self._m = manager

    async def create_table(self, request: master_pb2.CreateTableRequestPB) -> str:
        """CreateTable; returns the new table's id once its records committed."""
        self._m.require_leader()
        name = request.name
        _check_table_name(name)
        if not request.HasField("schema"):
            raise InvalidArgumentError("CreateTable needs a schema")
        schema = _new_table_schema(schema_from_pb(request.schema))
        num_replicas = request.num_replicas or 3
        if num_replicas % 2 == 0:
            raise InvalidArgumentError(f"replication factor {num_replicas} must be odd")
        partitions = table_partitions(schema, request)
        live = await self._live_tservers(num_replicas)
        if num_replicas > len(live):
            raise InvalidArgumentError(
                f"replication factor {num_replicas} is more than the {len(live)} live "
                "tablet servers"
            )
        async with self._m.lock:
            catalog = self._m.require_leader()
            existing = catalog.tables_by_name.get(name)
            if existing is not None:
                if request.request_id and existing.pb.create_request_id == request.request_id:
                    # A retry of this very request, which already took effect.
                    return str(existing.table_id)
                raise AlreadyPresentError(f"table {name!r} already exists")
            now_us = _now_us()
            table = master_pb2.SysTableEntryPB(
                table_id=uuid_lib.uuid4().hex,
                name=name,
                schema=schema_to_pb(schema),
                next_column_id=schema.next_column_id,
                partition_schema=request.partition_schema,
                num_replicas=num_replicas,
                state=master_pb2.SYS_TABLE_RUNNING,
                create_time_us=now_us,
                create_request_id=request.request_id,
                owner=owner_of_new_table(current_caller()),
            )
            load = catalog.replica_counts()
            tablets = [
                self.new_tablet_record(table.table_id, p, live, load, num_replicas, now_us)
                for p in partitions
            ]
            records = [CatalogRecord.tablet(t) for t in tablets]
            await self._m.replicate([*records, CatalogRecord.table(table)])
            for tablet in tablets:
                catalog.commit_tablet(tablet)
            catalog.commit_table(table)
        log.info("created table %s (%s) with %d tablets", name, table.table_id, len(tablets))
        self._m.wake.set()
        return str(table.table_id)

    async def _live_tservers(self, wanted: int) -> dict[str, TSDescriptor]:
        """The live tservers; a young master waits for up to ``wanted`` of them to register
        (every tserver heartbeats to every master, but a just-started master may have won its
        election before the first heartbeats arrived)."""
        while True:
            live = self._placeable_tservers()
            young = self._m.ts_manager.age_ms() < self._m.settings.tserver_registration_wait_ms
            if len(live) >= wanted or not young:
                return live
            await asyncio.sleep(LEADER_POLL_S)

    def _placeable_tservers(self) -> dict[str, TSDescriptor]:
        """The live tablet servers that are not retired, by uuid."""
        retired = self._m.retired_tservers
        return {ts.uuid: ts for ts in self._m.ts_manager.live() if ts.uuid not in retired}

    def new_tablet_record(
        self,
        table_id: str,
        partition: metadata_pb2.PartitionPB,
        live: dict[str, TSDescriptor],
        load: dict[str, int],
        num_replicas: int,
        now_us: int,
        *,
        avoid: Collection[str] = (),
    ) -> master_pb2.SysTabletEntryPB:
        """A CREATING tablet record with replicas placed on ``live`` servers (those in
        ``avoid`` only when there are not enough others)."""
        chosen = choose_replicas(sorted(live), load, num_replicas, self._m.rng, avoid=avoid)
        record = master_pb2.SysTabletEntryPB(
            tablet_id=uuid_lib.uuid4().hex,
            table_id=table_id,
            partition=partition,
            state=master_pb2.SYS_TABLET_CREATING,
            create_time_us=now_us,
        )
        config = record.consensus_state.committed_config
        for ts_uuid in chosen:
            peer = config.peers.add(permanent_uuid=ts_uuid, member_type=metadata_pb2.VOTER)
            peer.last_known_addr.CopyFrom(live[ts_uuid].registration.rpc_addr)
        return record

    async def alter_table(self, request: master_pb2.AlterTableRequestPB) -> tuple[str, int]:
        """AlterTable; returns (table id, new schema version) once committed."""
        async with self._m.lock:
            catalog = self._m.require_leader()
            done = _done_by(catalog, "last_alter_request_id", request.request_id)
            if done is not None:
                return done.table_id, done.schema().version
            table = catalog.table(request.table)
            if not request.steps and not request.new_table_name:
                raise InvalidArgumentError("AlterTable needs at least one step or a new name")
            new_name = request.new_table_name
            if new_name and new_name != table.name:
                _check_table_name(new_name)
                if new_name in catalog.tables_by_name:
                    raise AlreadyPresentError(f"table {new_name!r} already exists")
            old = table.schema()
            column_steps = [s for s in request.steps if s.WhichOneof("step") not in _RANGE_STEPS]
            altered = _apply_steps(old, column_steps)
            added, dropped = self._range_changes(catalog, table, old, request.steps)
            record = copy_record(table.pb)
            record.last_alter_request_id = request.request_id
            # Adding or dropping ranges alone changes no schema: the tablets that stay keep
            # theirs and need no AlterSchema (with hundreds of tablets, a retention job must
            # not wait for all of them), and the new ones are created with the current one.
            range_only = not column_steps and (not new_name or new_name == table.name)
            schema = old
            if not range_only:
                # One AlterTable is one schema version, whatever its number of steps; a
                # rename is a version too, so that every tablet learns the new name.
                schema = Schema(
                    altered.columns,
                    altered.key,
                    version=old.version + 1,
                    next_column_id=altered.next_column_id,
                )
                record.schema.CopyFrom(schema_to_pb(schema))
                record.next_column_id = schema.next_column_id
                record.state = master_pb2.SYS_TABLE_ALTERING
            if new_name:
                record.name = new_name
            tablets = [*added, *dropped]
            await self._m.replicate(
                [*(CatalogRecord.tablet(t) for t in tablets), CatalogRecord.table(record)]
            )
            for tablet in tablets:
                catalog.commit_tablet(tablet)
            catalog.commit_table(record)
            for tablet in dropped:
                self.schedule_tombstones(tablet)
        log.info(
            "altered table %s to schema version %d (%d tablets added, %d dropped)",
            record.name,
            schema.version,
            len(added),
            len(dropped),
        )
        self._m.wake.set()
        return table.table_id, schema.version

    def _range_changes(
        self,
        catalog: Catalog,
        table: TableInfo,
        schema: Schema,
        steps: Iterable[master_pb2.AlterTableStepPB],
    ) -> tuple[list[master_pb2.SysTabletEntryPB], list[master_pb2.SysTabletEntryPB]]:
        """The new CREATING tablet records of the ranges ``steps`` add (in every hash bucket)
        and the DELETED records of the tablets of the ranges they drop, checked in order:
        an added range overlaps no range of the table, a dropped one is exactly one of them."""
        steps = [s for s in steps if s.WhichOneof("step") in _RANGE_STEPS]
        if not steps:
            return [], []
        partition_schema = PartitionSchema.from_pb(table.pb.partition_schema)
        if not partition_schema.range_columns:
            raise InvalidArgumentError(
                f"table {table.name!r} has no range partitioning: no range to add or drop"
            )
        live = table.live_tablets()
        ranges = {Partition.from_pb(t.pb.partition).range_bounds() for t in live}
        to_add: list[tuple[bytes, bytes]] = []
        to_drop: set[tuple[bytes, bytes]] = set()
        for step in steps:
            kind = step.WhichOneof("step")
            bounds = (
                step.add_range_partition.bounds
                if kind == "add_range_partition"
                else step.drop_range_partition.bounds
            )
            low, high = range_bounds_from_pb(schema, partition_schema, bounds)
            shown = describe_range(schema, partition_schema.range_columns, low, high)
            if kind == "add_range_partition":
                if low and high and low >= high:
                    raise InvalidArgumentError(f"range {shown}: lower bound not below upper")
                clash = next((r for r in ranges if _overlap(r, (low, high))), None)
                if clash is not None:
                    other = describe_range(schema, partition_schema.range_columns, *clash)
                    raise InvalidArgumentError(f"range {shown} overlaps range {other}")
                ranges.add((low, high))
                to_add.append((low, high))
            else:
                if (low, high) not in ranges:
                    raise InvalidArgumentError(
                        f"table {table.name!r} has no range partition {shown} (a dropped "
                        "range must be exactly one of the table's ranges)"
                    )
                ranges.discard((low, high))
                if (low, high) in to_add:
                    to_add.remove((low, high))
                else:
                    to_drop.add((low, high))
        # No bounds would mean one range over everything: only ask for partitions of added ones.
        partitions = (
            create_partitions(partition_schema, RangeSpec(bounds=tuple(to_add))) if to_add else []
        )
        if partitions and len(live) + len(partitions) > TABLETS_PER_TABLE_MAX:
            raise InvalidArgumentError(
                f"{len(live) + len(partitions)} tablets; at most {TABLETS_PER_TABLE_MAX} a table"
            )
        placeable = self._placeable_tservers()
        num_replicas = table.pb.num_replicas
        if partitions and num_replicas > len(placeable):
            raise InvalidArgumentError(
                f"replication factor {num_replicas} is more than the {len(placeable)} live "
                "tablet servers"
            )
        now_us = _now_us()
        load = catalog.replica_counts()
        added = [
            self.new_tablet_record(table.table_id, p.to_pb(), placeable, load, num_replicas, now_us)
            for p in partitions
        ]
        dropped = []
        for tablet in live:
            if Partition.from_pb(tablet.pb.partition).range_bounds() in to_drop:
                record = copy_record(tablet.pb)
                record.state = master_pb2.SYS_TABLET_DELETED
                record.state_msg = "range partition dropped"
                dropped.append(record)
        return added, dropped

    async def delete_table(self, request: master_pb2.DeleteTableRequestPB) -> None:
        """DeleteTable: table REMOVED and its tablets DELETED in one batch, then tombstones."""
        async with self._m.lock:
            catalog = self._m.require_leader()
            if _done_by(catalog, "delete_request_id", request.request_id) is not None:
                return
            table = catalog.table(request.table)
            tablets = []
            for info in table.tablets.values():
                if info.pb.state == master_pb2.SYS_TABLET_DELETED:
                    continue
                record = copy_record(info.pb)
                record.state = master_pb2.SYS_TABLET_DELETED
                record.state_msg = "table deleted"
                tablets.append(record)
            table_record = copy_record(table.pb)
            table_record.state = master_pb2.SYS_TABLE_REMOVED
            table_record.delete_request_id = request.request_id
            records = [CatalogRecord.tablet(t) for t in tablets]
            await self._m.replicate([*records, CatalogRecord.table(table_record)])
            for record in tablets:
                catalog.commit_tablet(record)
            catalog.commit_table(table_record)
            for record in tablets:
                self.schedule_tombstones(record)
        log.info("deleted table %s (%s)", table.name, table.table_id)
        self._m.wake.set()

    def schedule_tombstones(self, tablet: master_pb2.SysTabletEntryPB) -> None:
        """Queues a tombstone for every replica of ``tablet``'s config (no CAS: the tablet is
        gone for good, seed 002 Appendix A case 2)."""
        for peer in tablet.consensus_state.committed_config.peers:
            self._m.pending_deletes[(peer.permanent_uuid, tablet.tablet_id)] = None

    async def replace_tablet(self, tablet_id: str) -> None:
        """Replaces a CREATING tablet that timed out: the old one REPLACED and the new one
        CREATING in one batch, both visible only once replicated."""
        async with self._m.lock:
            catalog = self._m.require_leader()
            old = catalog.tablets_by_id.get(tablet_id)
            if old is None or old.pb.state != master_pb2.SYS_TABLET_CREATING:
                return
            table = catalog.tables_by_id[old.pb.table_id]
            live = self._placeable_tservers()
            num_replicas = table.pb.num_replicas
            if num_replicas > len(live):
                return  # not enough servers to place a replacement; try again later
            # The servers that never reported a working replica are why creation timed out
            # (down, paused, or failing CreateTablet): the replacement goes elsewhere if it can.
            reported = self._m.reports.get(tablet_id, {})
            silent = {
                peer.permanent_uuid
                for peer in old.pb.consensus_state.committed_config.peers
                if peer.permanent_uuid not in reported
                or reported[peer.permanent_uuid].state == metadata_pb2.FAILED
            }
            new = self.new_tablet_record(
                table.table_id,
                old.pb.partition,
                live,
                catalog.replica_counts(),
                num_replicas,
                _now_us(),
                avoid=silent,
            )
            replaced = copy_record(old.pb)
            replaced.state = master_pb2.SYS_TABLET_REPLACED
            replaced.replaced_by = new.tablet_id
            replaced.state_msg = "creation timed out"
            await self._m.replicate([CatalogRecord.tablet(replaced), CatalogRecord.tablet(new)])
            catalog.commit_tablet(replaced)
            catalog.commit_tablet(new)
            self.schedule_tombstones(replaced)
        log.info("replaced tablet %s (creation timed out) by %s", tablet_id, new.tablet_id)
        self._m.wake.set()

    # --- progress of DDL ---------------------------------------------------------------

    def is_create_done(self, request: master_pb2.IsCreateTableDoneRequestPB) -> bool:
        """Every tablet of the table has reported a leader."""
        table = self._m.require_leader().table(request.table)
        return all(t.pb.state == master_pb2.SYS_TABLET_RUNNING for t in table.live_tablets())

    def is_alter_done(self, request: master_pb2.IsAlterTableDoneRequestPB) -> tuple[bool, int]:
        """(every tablet reported the current schema version, that version)."""
        table = self._m.require_leader().table(request.table)
        return table.pb.state != master_pb2.SYS_TABLE_ALTERING, int(table.pb.schema.version)


_RANGE_STEPS = ("add_range_partition", "drop_range_partition")


def _overlap(a: tuple[bytes, bytes], b: tuple[bytes, bytes]) -> bool:
    """True if the encoded ranges ``a`` and ``b`` (empty bound: unbounded) share a key."""
    return (not a[1] or b[0] < a[1]) and (not b[1] or a[0] < b[1])


def _now_us() -> int:
    return time.time_ns() // 1000


def _done_by(catalog: Catalog, field: str, request_id: str) -> TableInfo | None:
    """The table (live or removed) whose record says the DDL request ``request_id`` already
    took effect on it, so that a retry answers instead of failing or repeating the change."""
    if not request_id:
        return None
    for info in catalog.tables_by_id.values():
        if getattr(info.pb, field) == request_id:
            return info
    return None


def _check_table_name(name: str) -> None:
    if not name or not name.strip():
        raise InvalidArgumentError("a table needs a name")
    if len(name.encode()) > TABLE_NAME_BYTES_MAX:
        raise InvalidArgumentError(f"table name is longer than {TABLE_NAME_BYTES_MAX} bytes")


def _new_table_schema(given: Schema) -> Schema:
    """``given`` with column ids assigned by the master and version 0."""
    columns = [
        Column(c.name, c.type, nullable=c.nullable, default=c.default) for c in given.columns
    ]
    return Schema(columns, given.key, version=0)


def _apply_steps(schema: Schema, steps: Iterable[master_pb2.AlterTableStepPB]) -> Schema:
    for step in steps:
        kind = step.WhichOneof("step")
        if kind == "add_column":
            schema = schema.add_column(column_from_pb(step.add_column.column))
        elif kind == "drop_column":
            schema = schema.drop_column(step.drop_column.name)
        elif kind == "rename_column":
            rename = step.rename_column
            if not rename.new_name:
                raise InvalidArgumentError("rename_column needs a new name")
            schema = schema.rename_column(rename.old_name, rename.new_name)
        else:
            raise InvalidArgumentError("an AlterTable step is empty")
    return schema
