"""Tablet server heartbeats on every master, and the leader's processing of tablet reports.

Any master records a heartbeat for liveness (tservers heartbeat to all masters) and answers with
the masters it knows and who leads; only the leader with a loaded catalog processes the tablet
report. A report updates tablet records (a newer committed config from any replica; leadership
and schema version only from the leader itself), finishes alters, and queues tombstones for
replicas that were evicted or belong to deleted tablets, never for a tablet the catalog has no
record of (seed 002 Appendix A). Reports are soft state, rebuilt from full reports after a
leader change.
"""

from __future__ import annotations

import logging
import time

from nyala._proto import master_pb2, metadata_pb2
from nyala.master.catalog import Catalog, config_opid_index, copy_record
from nyala.master.catalog_manager import CatalogManager
from nyala.master.sys_catalog import CatalogRecord
from nyala.master.ts_manager import TSDescriptor

log = logging.getLogger(__name__)

_READY = metadata_pb2.TABLET_DATA_READY


class TabletReports:
    """The heartbeat handler; one per master service."""

    def __init__(self, manager: CatalogManager) -> None:
        self._m = manager

    async def heartbeat(
        self, request: master_pb2.TSHeartbeatRequestPB
    ) -> master_pb2.TSHeartbeatResponsePB:
        """Handles a tserver heartbeat on any master; reports count only on the leader."""
        ts = self._m.ts_manager.heartbeat(
            request.ts_uuid,
            request.ts_instance_seqno,
            request.registration,
            interval_ms=request.heartbeat_interval_ms,
        )
        response = master_pb2.TSHeartbeatResponsePB(master_uuid=self._m.uuid)
        status = self._m.status()
        response.masters.extend(self._m.master_entries())
        if status is None:
            return response
        response.leader_term = status.term
        response.leader_uuid = status.leader_uuid or ""
        if not self._m.is_ready_leader():
            return response
        response.leader_master = True
        if self._m.secure:
            now_ms = int(time.time() * 1000)
            response.tsk_public_keys.extend(self._m.token_keys.public_keys(now_ms))
            response.revoked_users.update(self._m.revoked_users())
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

    async def _process_report(self, ts: TSDescriptor, report: master_pb2.TabletReportPB) -> None:
        async with self._m.lock:
            catalog = self._m.require_leader()
            if not report.is_incremental:
                listed = {r.tablet_id for r in report.updated_tablets}
                for tablet_id, by_ts in self._m.reports.items():
                    if tablet_id not in listed:
                        by_ts.pop(ts.uuid, None)
            updates: dict[str, master_pb2.SysTabletEntryPB] = {}
            for reported in report.updated_tablets:
                self._m.reports.setdefault(reported.tablet_id, {})[ts.uuid] = reported
                record = self._process_reported_tablet(catalog, ts.uuid, reported)
                if record is not None:
                    updates[record.tablet_id] = record
            for tablet_id in report.removed_tablet_ids:
                self._m.reports.get(tablet_id, {}).pop(ts.uuid, None)
                self._m.pending_deletes.pop((ts.uuid, tablet_id), None)
            tables = self._finished_alters(catalog, updates)
            if not updates and not tables:
                return
            records = [CatalogRecord.tablet(r) for r in updates.values()]
            await self._m.replicate([*records, *(CatalogRecord.table(t) for t in tables)])
            for record in updates.values():
                catalog.commit_tablet(record)
            for table in tables:
                catalog.commit_table(table)
                log.info("table %s: alter to version %d done", table.name, table.schema.version)

    def _process_reported_tablet(
        self, catalog: Catalog, ts_uuid: str, reported: master_pb2.ReportedTabletPB
    ) -> master_pb2.SysTabletEntryPB | None:
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
                self._m.pending_deletes[(ts_uuid, tablet.tablet_id)] = None
                self._m.wake.set()
            return None
        record = _merge_report(tablet.pb, ts_uuid, reported)
        current = record if record is not None else tablet.pb
        config = current.consensus_state.committed_config
        stored_index = config_opid_index(config)
        in_config = any(p.permanent_uuid == ts_uuid for p in config.peers)
        evicted = (
            ready
            and not in_config
            and stored_index >= 0
            and reported.HasField("consensus_state")
            and config_opid_index(reported.consensus_state.committed_config) <= stored_index
        )
        if evicted:
            # Evicted from the config: tombstone, fenced by a CAS on the config's op index.
            self._m.pending_deletes[(ts_uuid, tablet.tablet_id)] = stored_index
            self._m.wake.set()
        if current.reported_schema_version < table.pb.schema.version:
            self._m.wake.set()  # the alter task has work
        return record

    @staticmethod
    def _finished_alters(
        catalog: Catalog, updates: dict[str, master_pb2.SysTabletEntryPB]
    ) -> list[master_pb2.SysTableEntryPB]:
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
                record = copy_record(table.pb)
                record.state = master_pb2.SYS_TABLE_RUNNING
                out.append(record)
        return out


def _merge_report(
    stored: master_pb2.SysTabletEntryPB, ts_uuid: str, reported: master_pb2.ReportedTabletPB
) -> master_pb2.SysTabletEntryPB | None:
    """The tablet record updated with what one replica reported, or None if unchanged.

    A newer committed config (by op index) is taken from any replica; leadership and the
    schema version only from the leader itself, and never from an older term.
    """
    if not reported.HasField("consensus_state"):
        return None
    rc, sc = reported.consensus_state, stored.consensus_state
    new: master_pb2.SysTabletEntryPB | None = None

    def copy() -> master_pb2.SysTabletEntryPB:
        nonlocal new
        if new is None:
            new = copy_record(stored)
        return new

    if config_opid_index(rc.committed_config) > config_opid_index(sc.committed_config):
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
