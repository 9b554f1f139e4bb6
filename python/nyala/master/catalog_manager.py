"""The catalog manager: leadership of the catalog, DDL, reads of the catalog, tablet reports.

Leadership. The in-memory catalog is valid only for the Raft term it was loaded in: each time
this master's sys-catalog replica becomes leader of a new term, ``run`` reloads every record
(at a ReadIndex point, so everything committed before is applied) before the master serves.
Until then clients get ``CATALOG_MANAGER_NOT_INITIALIZED`` (a ``ServiceUnavailableError``);
followers refuse with ``NotLeaderError`` carrying the leader hint.

Every mutation follows seed 002's contract: take the catalog lock; build new records as copies
(copy-on-write); replicate the whole logical operation as ONE sys-catalog batch; only when it
committed, commit the records in memory (tablets before their table); only then send RPCs to
tservers (the background tasks do, woken by ``wake``). A replication failure fails the
operation and discards the copies; since its outcome is unknown (the batch may still commit
under a later leader), the catalog of this term is no longer trusted: it is dropped, and the
master steps down if it still leads, so it reloads in a new term (KUDU-495: never a crash).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid as uuid_lib
from collections.abc import Collection
from typing import Any

from nyala._proto import master_pb2, metadata_pb2
from nyala.consensus.core import ReplicaStatus
from nyala.consensus.types import Role
from nyala.errors import (
    AlreadyPresentError,
    IllegalStateError,
    InvalidArgumentError,
    NotLeaderError,
    NyalaError,
    ServiceUnavailableError,
)
from nyala.master.catalog import Catalog, TableInfo, TabletInfo
from nyala.master.partitions import table_partitions
from nyala.master.placement import choose_replicas
from nyala.master.settings import MasterSettings
from nyala.master.sys_catalog import CatalogRecord, SysCatalog
from nyala.master.ts_manager import TSDescriptor, TSManager
from nyala.rpc import split_host_port
from nyala.rpc.schema_pb import schema_from_pb, schema_to_pb
from nyala.schema import Column, Schema

log = logging.getLogger(__name__)

NOT_INITIALIZED = "CATALOG_MANAGER_NOT_INITIALIZED"
TABLE_NAME_BYTES_MAX = 256
_LEADER_POLL_S = 0.05
_ROLES = {
    Role.LEADER: master_pb2.ROLE_LEADER,
    Role.FOLLOWER: master_pb2.ROLE_FOLLOWER,
    Role.CANDIDATE: master_pb2.ROLE_CANDIDATE,
    Role.LEARNER: master_pb2.ROLE_LEARNER,
    Role.NON_PARTICIPANT: master_pb2.ROLE_NON_PARTICIPANT,
}
_READY = metadata_pb2.TABLET_DATA_READY


def _now_us() -> int:
    return time.time_ns() // 1000


def _opid_index(config: Any) -> int:
    return int(config.opid_index) if config.HasField("opid_index") else -1


def _copy(pb: Any) -> Any:
    new = type(pb)()
    new.CopyFrom(pb)
    return new


def role_pb(role: Role) -> int:
    """The ``RaftRole`` of a consensus role."""
    return int(_ROLES.get(role, master_pb2.ROLE_UNKNOWN))


class CatalogManager:
    """The leader master's catalog (see the module docstring)."""

    def __init__(
        self,
        uuid: str,
        sys_catalog: SysCatalog,
        ts_manager: TSManager,
        settings: MasterSettings,
        rng: random.Random | None = None,
    ) -> None:
        self.uuid = uuid
        self.sys_catalog = sys_catalog
        self.ts_manager = ts_manager
        self.settings = settings
        self._rng = rng or random.Random()
        self._lock = asyncio.Lock()
        self.catalog = Catalog()
        # The term the catalog was loaded in; None: not loaded (or no longer trusted).
        self._loaded_term: int | None = None
        self.wake = asyncio.Event()  # set when there is work for the background tasks
        # Soft state of the leader, rebuilt from (full) tablet reports after a failover:
        # tablet id -> tserver uuid -> its last ReportedTabletPB.
        self.reports: dict[str, dict[str, Any]] = {}
        # (tserver uuid, tablet id) -> CAS op index (None: no CAS) of a tombstone to send.
        self.pending_deletes: dict[tuple[str, str], int | None] = {}
        # Tablet servers retired (RetireTabletServer): placement keeps new replicas off them.
        # Each is a sys-catalog record (loaded with the catalog), so a new leader honours it.
        self.retired_tservers: set[str] = set()

    # --- leadership -------------------------------------------------------------------------

    def status(self) -> ReplicaStatus | None:
        """The sys-catalog replica's consensus status, while it runs."""
        runtime = self.sys_catalog.runtime
        return None if runtime is None else runtime.status()

    def is_ready_leader(self) -> bool:
        """Leader of the sys catalog with the catalog loaded in the current term."""
        status = self.status()
        return (
            status is not None and status.role is Role.LEADER and status.term == self._loaded_term
        )

    def require_leader(self) -> Catalog:
        """The catalog, if this master serves clients now; the refusal otherwise."""
        status = self.status()
        if status is None:
            raise ServiceUnavailableError(f"{NOT_INITIALIZED}: the sys catalog is not running")
        if status.role is not Role.LEADER:
            leader = status.leader_uuid
            peer = None if leader is None else status.committed_config.peer(leader)
            raise NotLeaderError(
                f"master {self.uuid} is not the leader ({status.role.value})",
                leader_uuid=leader,
                leader_addr=None if peer is None else peer.address,
            )
        if status.term != self._loaded_term:
            raise ServiceUnavailableError(
                f"{NOT_INITIALIZED}: the leader is loading the catalog of term {status.term}"
            )
        return self.catalog

    async def run(self) -> None:
        """Watches leadership, reloading the catalog on every new term; runs forever."""
        while True:
            status = self.status()
            if (
                status is not None
                and status.role is Role.LEADER
                and status.term != self._loaded_term
            ):
                await self._load(status.term)
            await asyncio.sleep(_LEADER_POLL_S)

    async def _load(self, term: int) -> None:
        async with self._lock:
            try:
                contents = await self.sys_catalog.load()
            except NyalaError as exc:
                log.warning("catalog load in term %d failed: %s", term, exc)
                return
            status = self.status()
            if status is None or status.role is not Role.LEADER or status.term != term:
                return
            self.catalog = Catalog.from_records(contents.tables, contents.tablets)
            self.retired_tservers = {pb.ts_uuid for pb in contents.tservers if pb.retired}
            self.reports.clear()
            self.pending_deletes.clear()
            self._loaded_term = term
        log.info(
            "master %s leads term %d: catalog loaded (%d tables, %d tablets)",
            self.uuid,
            term,
            len(contents.tables),
            len(contents.tablets),
        )
        self.wake.set()

    async def replicate(self, records: list[CatalogRecord]) -> None:
        """Writes ``records`` as one batch; on failure drops the catalog (module docstring)."""
        try:
            await self.sys_catalog.write(records)
        except NyalaError:
            self._loaded_term = None
            runtime = self.sys_catalog.runtime
            if runtime is not None and runtime.role is Role.LEADER:
                with contextlib.suppress(NyalaError):
                    runtime.step_down()
            raise

    # --- DDL --------------------------------------------------------------------------------

    async def create_table(self, request: Any) -> str:
        """CreateTable; returns the new table's id once its records committed."""
        self.require_leader()
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
        async with self._lock:
            catalog = self.require_leader()
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
            )
            load = catalog.replica_counts()
            tablets = [
                self.new_tablet_record(table.table_id, p, live, load, num_replicas, now_us)
                for p in partitions
            ]
            records = [CatalogRecord.tablet(t) for t in tablets]
            await self.replicate([*records, CatalogRecord.table(table)])
            for tablet in tablets:
                catalog.commit_tablet(tablet)
            catalog.commit_table(table)
        log.info("created table %s (%s) with %d tablets", name, table.table_id, len(tablets))
        self.wake.set()
        return str(table.table_id)

    async def _live_tservers(self, wanted: int) -> dict[str, TSDescriptor]:
        """The live tservers; a young master waits for up to ``wanted`` of them to register
        (every tserver heartbeats to every master, but a just-started master may have won its
        election before the first heartbeats arrived)."""
        while True:
            live = {
                ts.uuid: ts for ts in self.ts_manager.live() if ts.uuid not in self.retired_tservers
            }
            young = self.ts_manager.age_ms() < self.settings.tserver_registration_wait_ms
            if len(live) >= wanted or not young:
                return live
            await asyncio.sleep(_LEADER_POLL_S)

    def new_tablet_record(
        self,
        table_id: str,
        partition: Any,
        live: dict[str, TSDescriptor],
        load: dict[str, int],
        num_replicas: int,
        now_us: int,
        *,
        avoid: Collection[str] = (),
    ) -> Any:
        """A CREATING tablet record with replicas placed on ``live`` servers (those in
        ``avoid`` only when there are not enough others)."""
        chosen = choose_replicas(sorted(live), load, num_replicas, self._rng, avoid=avoid)
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

    async def alter_table(self, request: Any) -> tuple[str, int]:
        """AlterTable; returns (table id, new schema version) once committed."""
        async with self._lock:
            catalog = self.require_leader()
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
            altered = _apply_steps(old, request.steps)
            # One AlterTable is one schema version, whatever its number of steps; a rename
            # is a version too, so that every tablet learns the new name.
            schema = Schema(
                altered.columns,
                altered.key,
                version=old.version + 1,
                next_column_id=altered.next_column_id,
            )
            record = _copy(table.pb)
            record.schema.CopyFrom(schema_to_pb(schema))
            record.next_column_id = schema.next_column_id
            record.state = master_pb2.SYS_TABLE_ALTERING
            record.last_alter_request_id = request.request_id
            if new_name:
                record.name = new_name
            await self.replicate([CatalogRecord.table(record)])
            catalog.commit_table(record)
        log.info("altered table %s to schema version %d", record.name, schema.version)
        self.wake.set()
        return table.table_id, schema.version

    async def delete_table(self, request: Any) -> None:
        """DeleteTable: table REMOVED and its tablets DELETED in one batch, then tombstones."""
        async with self._lock:
            catalog = self.require_leader()
            if _done_by(catalog, "delete_request_id", request.request_id) is not None:
                return
            table = catalog.table(request.table)
            tablets = []
            for info in table.tablets.values():
                if info.pb.state == master_pb2.SYS_TABLET_DELETED:
                    continue
                record = _copy(info.pb)
                record.state = master_pb2.SYS_TABLET_DELETED
                record.state_msg = "table deleted"
                tablets.append(record)
            table_record = _copy(table.pb)
            table_record.state = master_pb2.SYS_TABLE_REMOVED
            table_record.delete_request_id = request.request_id
            records = [CatalogRecord.tablet(t) for t in tablets]
            await self.replicate([*records, CatalogRecord.table(table_record)])
            for record in tablets:
                catalog.commit_tablet(record)
            catalog.commit_table(table_record)
            for record in tablets:
                self.schedule_tombstones(record)
        log.info("deleted table %s (%s)", table.name, table.table_id)
        self.wake.set()

    def schedule_tombstones(self, tablet: Any) -> None:
        """Queues a tombstone for every replica of ``tablet``'s config (no CAS: the tablet is
        gone for good, seed 002 Appendix A case 2)."""
        for peer in tablet.consensus_state.committed_config.peers:
            self.pending_deletes[(peer.permanent_uuid, tablet.tablet_id)] = None

    async def replace_tablet(self, tablet_id: str) -> None:
        """Replaces a CREATING tablet that timed out: the old one REPLACED and the new one
        CREATING in one batch, both visible only once replicated."""
        async with self._lock:
            catalog = self.require_leader()
            old = catalog.tablets_by_id.get(tablet_id)
            if old is None or old.pb.state != master_pb2.SYS_TABLET_CREATING:
                return
            table = catalog.tables_by_id[old.pb.table_id]
            live = {
                ts.uuid: ts for ts in self.ts_manager.live() if ts.uuid not in self.retired_tservers
            }
            num_replicas = table.pb.num_replicas
            if num_replicas > len(live):
                return  # not enough servers to place a replacement; try again later
            # The servers that never reported a working replica are why creation timed out
            # (down, paused, or failing CreateTablet): the replacement goes elsewhere if it can.
            reported = self.reports.get(tablet_id, {})
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
            replaced = _copy(old.pb)
            replaced.state = master_pb2.SYS_TABLET_REPLACED
            replaced.replaced_by = new.tablet_id
            replaced.state_msg = "creation timed out"
            await self.replicate([CatalogRecord.tablet(replaced), CatalogRecord.tablet(new)])
            catalog.commit_tablet(replaced)
            catalog.commit_tablet(new)
            self.schedule_tombstones(replaced)
        log.info("replaced tablet %s (creation timed out) by %s", tablet_id, new.tablet_id)
        self.wake.set()

    # --- reads ------------------------------------------------------------------------------

    def is_create_done(self, request: Any) -> bool:
        """Every tablet of the table has reported a leader."""
        table = self.require_leader().table(request.table)
        return all(t.pb.state == master_pb2.SYS_TABLET_RUNNING for t in table.live_tablets())

    def is_alter_done(self, request: Any) -> tuple[bool, int]:
        """(every tablet reported the current schema version, that version)."""
        table = self.require_leader().table(request.table)
        return table.pb.state != master_pb2.SYS_TABLE_ALTERING, int(table.pb.schema.version)

    def table_schema(self, request: Any) -> Any:
        """The ``GetTableSchemaResponsePB`` of a table."""
        table = self.require_leader().table(request.table)
        done = all(t.pb.state == master_pb2.SYS_TABLET_RUNNING for t in table.live_tablets())
        return master_pb2.GetTableSchemaResponsePB(
            table_id=table.table_id,
            table_name=table.name,
            schema=table.pb.schema,
            partition_schema=table.pb.partition_schema,
            num_replicas=table.pb.num_replicas,
            create_table_done=done,
        )

    def table_locations(self, request: Any) -> Any:
        """The ``GetTableLocationsResponsePB``: replicas from the tablet records (KUDU-1353)."""
        table = self.require_leader().table(request.table)
        start, end = request.partition_key_start, request.partition_key_end
        response = master_pb2.GetTableLocationsResponsePB(
            ttl_ms=self.settings.table_locations_ttl_ms,
            schema_version=table.pb.schema.version,
        )
        for tablet in table.live_tablets():
            p = tablet.pb.partition
            if end and p.partition_key_start >= end:
                continue
            if p.partition_key_end and p.partition_key_end <= start:
                continue
            response.tablet_locations.append(self.tablet_locations(tablet))
            if len(response.tablet_locations) == request.max_returned_locations:
                break
        return response

    def tablet_locations(self, tablet: TabletInfo) -> Any:
        """The ``TabletLocationsPB`` of one tablet."""
        cstate = tablet.pb.consensus_state
        pb = master_pb2.TabletLocationsPB(
            tablet_id=tablet.tablet_id,
            partition=tablet.pb.partition,
            leader_uuid=cstate.leader_uuid,
            term=cstate.current_term,
        )
        for peer in cstate.committed_config.peers:
            replica = pb.replicas.add(member_type=peer.member_type)
            ts = self.ts_manager.get(peer.permanent_uuid)
            if ts is not None:
                replica.ts_info.CopyFrom(ts.to_pb())
            else:
                replica.ts_info.permanent_uuid = peer.permanent_uuid
                replica.ts_info.rpc_addr.CopyFrom(peer.last_known_addr)
            if peer.permanent_uuid == cstate.leader_uuid:
                replica.role = master_pb2.ROLE_LEADER
            elif peer.member_type == metadata_pb2.NON_VOTER:
                replica.role = master_pb2.ROLE_LEARNER
            else:
                replica.role = master_pb2.ROLE_FOLLOWER
        return pb

    def list_tables(self, name_filter: str) -> list[TableInfo]:
        """Live tables whose name contains ``name_filter``, by name."""
        catalog = self.require_leader()
        return [t for t in catalog.live_tables() if name_filter in t.name]

    # --- tablet reports ---------------------------------------------------------------------

    async def heartbeat(self, request: Any) -> Any:
        """Handles a tserver heartbeat on any master; reports count only on the leader."""
        ts = self.ts_manager.heartbeat(
            request.ts_uuid, request.ts_instance_seqno, request.registration
        )
        response = master_pb2.TSHeartbeatResponsePB(master_uuid=self.uuid)
        status = self.status()
        response.masters.extend(self.master_entries())
        if status is None:
            return response
        response.leader_term = status.term
        response.leader_uuid = status.leader_uuid or ""
        if not self.is_ready_leader():
            return response
        response.leader_master = True
        seen_key = (int(request.ts_instance_seqno), status.term)
        if not request.HasField("tablet_report"):
            response.needs_full_tablet_report = ts.full_report_seen != seen_key
            return response
        report = request.tablet_report
        if report.is_incremental and ts.full_report_seen != seen_key:
            response.needs_full_tablet_report = True
            return response
        await self._process_report(ts, report)
        if not report.is_incremental:
            ts.full_report_seen = seen_key
        response.tablet_report_processed = True
        return response

    async def _process_report(self, ts: TSDescriptor, report: Any) -> None:
        async with self._lock:
            catalog = self.require_leader()
            if not report.is_incremental:
                listed = {r.tablet_id for r in report.updated_tablets}
                for tablet_id, by_ts in self.reports.items():
                    if tablet_id not in listed:
                        by_ts.pop(ts.uuid, None)
            updates: dict[str, Any] = {}
            for reported in report.updated_tablets:
                self.reports.setdefault(reported.tablet_id, {})[ts.uuid] = reported
                record = self._process_reported_tablet(catalog, ts.uuid, reported)
                if record is not None:
                    updates[record.tablet_id] = record
            for tablet_id in report.removed_tablet_ids:
                self.reports.get(tablet_id, {}).pop(ts.uuid, None)
                self.pending_deletes.pop((ts.uuid, tablet_id), None)
            tables = self._finished_alters(catalog, updates)
            if not updates and not tables:
                return
            records = [CatalogRecord.tablet(r) for r in updates.values()]
            await self.replicate([*records, *(CatalogRecord.table(t) for t in tables)])
            for record in updates.values():
                catalog.commit_tablet(record)
            for table in tables:
                catalog.commit_table(table)
                log.info("table %s: alter to version %d done", table.name, table.schema.version)

    def _process_reported_tablet(self, catalog: Catalog, ts_uuid: str, reported: Any) -> Any:
        """The new record of the reported tablet (None: unchanged); queues tombstones."""
        tablet = catalog.tablets_by_id.get(reported.tablet_id)
        if tablet is None:
            # Never delete a replica of a tablet without a record (seed 002 Appendix A).
            log.warning("tserver %s reports unknown tablet %s", ts_uuid, reported.tablet_id)
            return None
        table = catalog.tables_by_id.get(tablet.pb.table_id)
        ready = reported.data_state == _READY
        if not tablet.is_live or table is None or table.is_removed:
            if ready:
                self.pending_deletes[(ts_uuid, tablet.tablet_id)] = None
                self.wake.set()
            return None
        record = _merge_report(tablet.pb, ts_uuid, reported)
        current = record if record is not None else tablet.pb
        config = current.consensus_state.committed_config
        stored_index = _opid_index(config)
        in_config = any(p.permanent_uuid == ts_uuid for p in config.peers)
        evicted = (
            ready
            and not in_config
            and stored_index >= 0
            and reported.HasField("consensus_state")
            and _opid_index(reported.consensus_state.committed_config) <= stored_index
        )
        if evicted:
            # Evicted from the config: tombstone, fenced by a CAS on the config's op index.
            self.pending_deletes[(ts_uuid, tablet.tablet_id)] = stored_index
            self.wake.set()
        if current.reported_schema_version < table.pb.schema.version:
            self.wake.set()  # the alter task has work
        return record

    @staticmethod
    def _finished_alters(catalog: Catalog, updates: dict[str, Any]) -> list[Any]:
        """Table records to move from ALTERING to RUNNING given the tablet ``updates``."""
        out = []
        touched = {catalog.tablets_by_id[t].pb.table_id for t in updates}
        for table_id in touched:
            table = catalog.tables_by_id.get(table_id)
            if table is None or table.pb.state != master_pb2.SYS_TABLE_ALTERING:
                continue
            version = table.pb.schema.version
            tablets = [updates.get(t.tablet_id, t.pb) for t in table.live_tablets()]
            if all(t.reported_schema_version >= version for t in tablets):
                record = _copy(table.pb)
                record.state = master_pb2.SYS_TABLE_RUNNING
                out.append(record)
        return out

    # --- masters ----------------------------------------------------------------------------

    def master_entries(self) -> list[Any]:
        """Every master of the sys catalog's config (active config while a change pends)."""
        status = self.status()
        config = None
        if status is not None:
            config = status.pending_config or status.committed_config
        else:
            with contextlib.suppress(NyalaError):
                config = self.sys_catalog.committed_config()
        if config is None:
            return []
        out = []
        for peer in config.peers:
            host, port = split_host_port(peer.address)
            entry = master_pb2.MasterEntryPB(
                permanent_uuid=peer.uuid,
                member_type=metadata_pb2.VOTER if peer.is_voter else metadata_pb2.NON_VOTER,
            )
            entry.rpc_addr.host, entry.rpc_addr.port = host, port
            if status is not None and peer.uuid == self.uuid:
                entry.role = role_pb(status.role)
            elif status is not None and peer.uuid == status.leader_uuid:
                entry.role = master_pb2.ROLE_LEADER
            else:
                entry.role = master_pb2.ROLE_FOLLOWER if peer.is_voter else master_pb2.ROLE_LEARNER
            out.append(entry)
        return out

    def require_sys_catalog_leader(self) -> ReplicaStatus:
        """The status, if this master leads the sys catalog (membership changes)."""
        self.require_leader()
        status = self.status()
        if status is None:
            raise IllegalStateError("the sys catalog stopped")
        return status


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


def _apply_steps(schema: Schema, steps: Any) -> Schema:
    for step in steps:
        kind = step.WhichOneof("step")
        if kind == "add_column":
            c = step.add_column.column
            schema = schema.add_column(Column(c.name, c.type, nullable=c.nullable))
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


def _merge_report(stored: Any, ts_uuid: str, reported: Any) -> Any | None:
    """The tablet record updated with what one replica reported, or None if unchanged.

    A newer committed config (by op index) is taken from any replica; leadership and the
    schema version only from the leader itself, and never from an older term.
    """
    if not reported.HasField("consensus_state"):
        return None
    rc, sc = reported.consensus_state, stored.consensus_state
    new: Any = None

    def copy() -> Any:
        nonlocal new
        if new is None:
            new = _copy(stored)
        return new

    if _opid_index(rc.committed_config) > _opid_index(sc.committed_config):
        copy().consensus_state.committed_config.CopyFrom(rc.committed_config)
    leads = rc.leader_uuid == ts_uuid and rc.current_term >= sc.current_term
    if leads and (rc.current_term > sc.current_term or sc.leader_uuid != ts_uuid):
        record = copy()
        record.consensus_state.current_term = rc.current_term
        record.consensus_state.leader_uuid = ts_uuid
    if leads and stored.state == master_pb2.SYS_TABLET_CREATING:
        copy().state = master_pb2.SYS_TABLET_RUNNING
    if leads and reported.schema_version > stored.reported_schema_version:
        copy().reported_schema_version = reported.schema_version
    return new
