"""Reads of the leader master's catalog: table schemas, tablet locations, the table list.

Replica locations come from each tablet's committed record (its consensus state, as merged from
tablet reports), never from a separate cache (KUDU-1353); addresses come from the tserver
manager when the server is registered, else from the record's last known address.
"""

from __future__ import annotations

from nyala._proto import master_pb2, metadata_pb2
from nyala.master.catalog import TableInfo, TabletInfo
from nyala.master.catalog_manager import CatalogManager


class Locations:
    """The catalog reads; one per master service, answering only while this master leads."""

    def __init__(self, manager: CatalogManager) -> None:
        self._m = manager

    def table_schema(
        self, request: master_pb2.GetTableSchemaRequestPB
    ) -> master_pb2.GetTableSchemaResponsePB:
        """The ``GetTableSchemaResponsePB`` of a table."""
        table = self._m.require_leader().table(request.table)
        done = all(t.pb.state == master_pb2.SYS_TABLET_RUNNING for t in table.live_tablets())
        return master_pb2.GetTableSchemaResponsePB(
            table_id=table.table_id,
            table_name=table.name,
            schema=table.pb.schema,
            partition_schema=table.pb.partition_schema,
            num_replicas=table.pb.num_replicas,
            create_table_done=done,
        )

    def table_locations(
        self, request: master_pb2.GetTableLocationsRequestPB
    ) -> master_pb2.GetTableLocationsResponsePB:
        """The ``GetTableLocationsResponsePB``: replicas from the tablet records (KUDU-1353)."""
        table = self._m.require_leader().table(request.table)
        start, end = request.partition_key_start, request.partition_key_end
        response = master_pb2.GetTableLocationsResponsePB(
            ttl_ms=self._m.settings.table_locations_ttl_ms,
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

    def tablet_locations(self, tablet: TabletInfo) -> master_pb2.TabletLocationsPB:
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
            ts = self._m.ts_manager.get(peer.permanent_uuid)
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

    def table_statistics(
        self, request: master_pb2.GetTableStatisticsRequestPB
    ) -> master_pb2.GetTableStatisticsResponsePB:
        """A table's rows and bytes, summed over the latest size each tablet's leader reported
        (a tablet no leader has reported yet counts as 0 and says so)."""
        table = self._m.require_leader().table(request.table)
        response = master_pb2.GetTableStatisticsResponsePB()
        for tablet in table.live_tablets():
            leader = tablet.pb.consensus_state.leader_uuid
            report = self._m.reports.get(tablet.tablet_id, {}).get(leader)
            entry = response.tablets.add(tablet_id=tablet.tablet_id)
            if report is not None and report.HasField("stats"):
                entry.reported = True
                entry.stats.CopyFrom(report.stats)
                response.live_row_count += report.stats.live_row_count
                response.on_disk_bytes += report.stats.on_disk_bytes
        return response

    def list_tables(self, name_filter: str) -> list[TableInfo]:
        """Live tables whose name contains ``name_filter``, by name."""
        catalog = self._m.require_leader()
        return [t for t in catalog.live_tables() if name_filter in t.name]
