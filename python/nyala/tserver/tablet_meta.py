"""What ListTablets and ``/tablets`` report about one replica, built from the tablet manager."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nyala._proto import metadata_pb2, tserver_admin_pb2
from nyala.rpc.schema_pb import schema_to_pb
from nyala.tablet import TabletStatus
from nyala.tserver.convert import partition_to_pb


@dataclass(frozen=True)
class TabletReport:
    """One replica as listed by ListTablets and /tablets."""

    status: TabletStatus

    @property
    def state(self) -> str:
        """A TabletState name: NOT_STARTED, RUNNING, FAILED, ..."""
        return self.status.state

    def to_json(self) -> dict[str, object]:
        """The report as the /tablets page shows it."""
        s = self.status
        return {
            "tablet_id": s.tablet_id,
            "table_id": s.table_id,
            "table_name": s.table_name,
            "state": s.state,
            "data_state": s.data_state,
            "state_reason": s.state_reason,
            "on_disk_bytes": s.on_disk_bytes,
        }

    def to_pb(self) -> Any:
        """The ``TabletStatusPB`` of this report."""
        s = self.status
        pb = tserver_admin_pb2.TabletStatusPB(
            tablet_id=s.tablet_id,
            table_id=s.table_id,
            table_name=s.table_name,
            state=metadata_pb2.TabletState.Value(s.state),
            data_state=metadata_pb2.TabletDataState.Value(f"TABLET_DATA_{s.data_state}"),
            state_reason=s.state_reason,
            estimated_on_disk_bytes=s.on_disk_bytes,
        )
        if s.partition is not None:
            pb.partition.CopyFrom(partition_to_pb(s.partition))
        return pb

    def schema_pb(self) -> Any | None:
        """The replica's ``SchemaPB``, if its superblock was readable."""
        return None if self.status.schema is None else schema_to_pb(self.status.schema)
