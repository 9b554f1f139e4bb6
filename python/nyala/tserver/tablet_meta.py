"""What ListTablets, ``/tablets`` and the tablet reports to the master say about one replica,
built from the tablet manager; for a leader, the health of each follower (``peer_health``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from nyala._proto import metadata_pb2, tserver_admin_pb2
from nyala.consensus.progress import PeerHealth
from nyala.rpc.schema_pb import schema_to_pb
from nyala.server.convert import partition_to_pb
from nyala.tablet import TabletStatus
from nyala.tablet.replica import TabletReplica


@dataclass(frozen=True)
class PeerHealthReport:
    """One follower's health as its leader sees it."""

    health: PeerHealth
    reason: str = ""  # FAILED_UNRECOVERABLE: why


def peer_health(replica: TabletReplica | None, failed_after_ms: int) -> dict[str, PeerHealthReport]:
    """The followers' health if ``replica`` (a ``TabletReplica`` or None) leads its tablet;
    empty otherwise. A follower is FAILED after ``failed_after_ms`` without any answer."""
    runtime = None if replica is None else replica.runtime
    if runtime is None:
        return {}
    out = {}
    for uuid, health in runtime.peer_health(failed_after_ms).items():
        progress = runtime.core.peer_progress(uuid)
        reason = "" if progress is None else progress.unrecoverable or ""
        out[uuid] = PeerHealthReport(health, reason)
    return out


@dataclass(frozen=True)
class TabletReport:
    """One replica as listed by ListTablets and /tablets."""

    status: TabletStatus
    # Leader only: follower uuid -> its health.
    peers: dict[str, PeerHealthReport] = field(default_factory=dict)

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
            "peer_health": {
                uuid: {"health": p.health.value, "reason": p.reason}
                for uuid, p in self.peers.items()
            },
        }

    def to_pb(self) -> tserver_admin_pb2.TabletStatusPB:
        """The ``TabletStatusPB`` of this report."""
        s = self.status
        pb = tserver_admin_pb2.TabletStatusPB(
            tablet_id=s.tablet_id,
            table_id=s.table_id,
            table_name=s.table_name,
            state=metadata_pb2.TabletState.Value(s.state),
            data_state=metadata_pb2.TabletDataState.Value(f"TABLET_DATA_{s.data_state}"),
            state_reason=s.state_reason,
            estimated_on_disk_bytes=s.on_disk_bytes or 0,  # None (not measured): unset
        )
        if s.partition is not None:
            pb.partition.CopyFrom(partition_to_pb(s.partition))
        return pb

    def schema_pb(self) -> metadata_pb2.SchemaPB | None:
        """The replica's ``SchemaPB``, if its superblock was readable."""
        return None if self.status.schema is None else schema_to_pb(self.status.schema)
