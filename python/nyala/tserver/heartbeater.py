"""Heartbeats from this tablet server to every master (seed 002, "Heartbeat to all masters").

Every master hears from every tserver each ``master_heartbeat_interval_ms``, followers
included, so any master that becomes leader already knows every live tserver (KUDU-1358).
Tablet reports go only to the master that answered as leader with a loaded catalog:

* a FULL report (every replica) on first contact with a leader, after this process started,
  when the master asks for one, and whenever a different master or a new term leads (a new
  leader may have missed what the old one was told: KUDU-1374);
* otherwise an INCREMENTAL report: only replicas whose reported state changed since the last
  report that master processed, and the ids of replicas that are gone (edge-triggered: a
  replica reported once is not reported again until it changes).

A replica whose role, term, leader or committed config changes calls ``trigger`` (Kudu's
``TriggerASAP``): the next heartbeat goes out at once instead of at the end of the interval,
so the leader master names a new tablet leader within one round trip of its election. Changes
that arrive while a heartbeat is in flight are coalesced into the next one.

A replica's reported state is compared as a signature (runtime and data state and reason,
Raft term, leader, committed config, schema version, and for a leader its followers' health and
its size). Signatures are recomputed by a sweep once per heartbeat interval, every replica's
within a few intervals (up to ``SWEEP_REPLICAS_MAX`` a time), so no hook in the replica code
is needed for a change to be reported; a heartbeat sent sooner by ``trigger`` recomputes only
the signatures of the replicas that triggered it (a failover of hundreds of leaders triggers
hundreds). A replica's report message is built only when its
signature changed (one costs about 36 us to build on the development machine: 70 ms of every
heartbeat at 2,000 replicas).

A leader's report also carries its size (``stats``: rows in its MemRowSet and rowsets, bytes
of its WAL and data files), from which the master answers ``GetTableStatistics`` without a
scan; a changed size is reported at the next heartbeat. The WAL's bytes are read again when the
rows changed, the data files' (at most once a heartbeat interval) when a flush or compaction
changed the rowsets, else every 30 s.

A leader's report carries the health of each follower (Kudu's per-peer health report:
HEALTHY, FAILED after ``follower_unavailable_considered_failed_sec`` without an answer,
FAILED_UNRECOVERABLE when the follower's replica is FAILED or it refused the copy it needs), so
the master replaces a replica that cannot serve even while its tserver heartbeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from nyala._proto import common_pb2, master_pb2, metadata_pb2
from nyala.consensus.progress import PeerHealth
from nyala.consensus.types import RaftConfig
from nyala.errors import NetworkError, NyalaError, WrongServerUuidError
from nyala.rpc import ServerProxy, split_host_port
from nyala.rpc.settings import RpcSettings
from nyala.server.convert import config_to_pb
from nyala.tablet import TabletManager, TabletStatus
from nyala.tablet.replica import DISK_USAGE_REFRESH_S, TabletReplica
from nyala.tserver.authz import SecurityUpdates
from nyala.tserver.tablet_meta import peer_health

log = logging.getLogger(__name__)

Signature = tuple[object, ...]
#: Every replica's signature and report, by tablet id.
_Snapshot = dict[str, tuple[Signature, master_pb2.ReportedTabletPB]]

_HEALTH_PB = {
    PeerHealth.UNKNOWN: master_pb2.HEALTH_UNKNOWN,
    PeerHealth.HEALTHY: master_pb2.HEALTH_HEALTHY,
    PeerHealth.FAILED: master_pb2.HEALTH_FAILED,
    PeerHealth.FAILED_UNRECOVERABLE: master_pb2.HEALTH_FAILED_UNRECOVERABLE,
}
#: A leader's followers' health as reported: (uuid, health, reason) each.
_Health: TypeAlias = tuple[tuple[str, master_pb2.PeerHealth.ValueType, str], ...]
#: A replica's Raft term, leader ("" if none) and committed config.
_Consensus: TypeAlias = tuple[int, str, RaftConfig]
#: Replicas a sweep looks at again beyond the new, deleted and triggered ones
#: (``Heartbeater._snapshot``).
SWEEP_REPLICAS_MAX = 250
#: Default of ``follower_unavailable_considered_failed_sec`` (Kudu's 300 s).
PEER_FAILED_AFTER_MS_DEFAULT = 300_000


@dataclass
class _MasterState:
    """What this tserver knows about one master."""

    addr: str
    uuid: str = ""
    is_leader: bool = False
    leader_term: int = -1
    needs_full_report: bool = True
    seqno: int = 0
    # Set by ``Heartbeater.trigger``: the next heartbeat is due now.
    due: asyncio.Event = field(default_factory=asyncio.Event)
    # tablet id -> signature, as of the last report this master processed.
    reported: dict[str, Signature] = field(default_factory=dict)


def _host_port(addr: str) -> common_pb2.HostPortPB:
    host, port = split_host_port(addr)
    return common_pb2.HostPortPB(host=host, port=port)


class Heartbeater:
    """One heartbeat loop per master; started by the tserver, ends by cancellation."""

    def __init__(
        self,
        server_uuid: str,
        rpc_addr: str,
        http_addr: str,
        masters: Sequence[str],
        interval_ms: int,
        tablets: TabletManager,
        rpc_settings: RpcSettings,
        *,
        peer_failed_after_ms: int = PEER_FAILED_AFTER_MS_DEFAULT,
        security: SecurityUpdates | None = None,
    ) -> None:
        self._uuid = server_uuid
        self._peer_failed_after_ms = peer_failed_after_ms
        self._security = security  # takes the leader's token-signing keys and revocations
        self._registration = master_pb2.TSRegistrationPB(
            rpc_addr=_host_port(rpc_addr), http_addr=_host_port(http_addr)
        )
        self._interval_s = interval_ms / 1000
        self._tablets = tablets
        self._rpc_settings = rpc_settings
        # A new number per process start: masters see a restart as a new instance.
        self._instance_seqno = time.time_ns() // 1000
        self._masters = [_MasterState(addr) for addr in masters]
        # tablet id -> (rows, (rowsets, rows on disk), WAL bytes) at the last size report
        self._files_seen: dict[str, tuple[int, tuple[int, int], int]] = {}
        self._built: _Snapshot = {}  # each replica's last signature and the report built for it
        # Replicas whose consensus state changed since the last snapshot (``trigger``), and
        # when every replica was last looked at: between two sweeps, a heartbeat looks only
        # at the replicas that changed (docs/consensus.md, "Tablet reports").
        self._dirty: set[str] = set()
        self._swept_at = -math.inf
        self._sweep_at = 0  # where in the list of replicas the next sweep's turn starts
        self._swept_version = -1  # the tablet manager's version at the last full walk

    @property
    def interval_ms(self) -> int:
        """Milliseconds between two heartbeats to a master (without triggers)."""
        return round(self._interval_s * 1000)

    def trigger(self, tablet_id: str | None = None) -> None:
        """Sends the next heartbeat to every master now (call on the event loop), with
        ``tablet_id``'s report looked at again."""
        if tablet_id is not None:
            self._dirty.add(tablet_id)
        for master in self._masters:
            master.due.set()

    async def run(self) -> None:
        """Heartbeats to every master until cancelled."""
        async with asyncio.TaskGroup() as group:
            for master in self._masters:
                group.create_task(self._loop(master), name=f"heartbeat-{master.addr}")

    async def _loop(self, master: _MasterState) -> None:
        proxy = ServerProxy(master.addr, self._rpc_settings)
        try:
            while True:
                again = failed = False
                master.due.clear()  # what changed until now goes into this heartbeat
                try:
                    again = await self._heartbeat(proxy, master)
                except WrongServerUuidError:
                    master.uuid = ""  # the master at this address was replaced
                except NyalaError as exc:
                    failed = True  # retried after the interval, whatever triggers came
                    log.debug("heartbeat to master %s failed: %s", master.addr, exc)
                    master.is_leader = False
                    if isinstance(exc, NetworkError):
                        # A fresh channel: gRPC's reconnect back-off would otherwise keep a
                        # restarted master unaware of this tserver for many seconds.
                        await proxy.close()
                        proxy = ServerProxy(master.addr, self._rpc_settings)
                if failed:
                    await asyncio.sleep(self._interval_s)
                elif not again:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self._interval_s):
                            await master.due.wait()
        finally:
            await proxy.close()

    def _snapshot(self) -> _Snapshot:
        """Every replica's report and signature, now (a report is built again only when its
        replica's signature changed).

        Once per heartbeat interval a sweep looks at new and deleted replicas, at those that
        triggered a heartbeat, and at up to ``SWEEP_REPLICAS_MAX`` others in turn: each
        replica's changes that trigger nothing (a leader's size and followers' health, a
        state change) are reported within ``ceil(replicas / SWEEP_REPLICAS_MAX)`` intervals
        (one up to 250 replicas, eight at 2,000). A heartbeat sent sooner, because replicas
        changed (``trigger``), looks only at those. During a failover hundreds of elections
        each trigger one, and a sweep of every replica per election took a fifth of the event
        loop of a server with 500; a sweep of all 2,000 replicas every second took a quarter
        of an idle server's."""
        now = time.monotonic()
        look, self._dirty = self._dirty, set()
        if now - self._swept_at < self._interval_s:
            return self._looked_at(look)
        self._swept_at = now
        version = self._tablets.version
        replicas = self._tablets.replicas()
        if len(replicas) <= SWEEP_REPLICAS_MAX:
            look = {r.tablet_id for r in replicas}
        else:
            start = self._sweep_at % len(replicas)
            self._sweep_at = start + SWEEP_REPLICAS_MAX
            turn = replicas[start : start + SWEEP_REPLICAS_MAX]
            turn += replicas[: max(0, start + SWEEP_REPLICAS_MAX - len(replicas))]
            look.update(r.tablet_id for r in turn)
            if version == self._swept_version:  # the same replicas: only those looked at
                return self._looked_at(look)
        self._swept_version = version
        built = self._built
        out: _Snapshot = {}
        for replica in replicas:
            tablet_id = replica.tablet_id
            cached = built.get(tablet_id)
            if cached is None or tablet_id in look:
                cached = self._entry(self._tablets.replica_status(replica))
            out[tablet_id] = cached
        for status in self._tablets.unreadable_statuses():
            out[status.tablet_id] = self._entry(status)
        for gone in built.keys() - out.keys():
            del built[gone]
            self._files_seen.pop(gone, None)
        return out

    def _looked_at(self, tablet_ids: set[str]) -> _Snapshot:
        """The last snapshot with ``tablet_ids``' reports looked at again (the set of replicas
        has not changed, save those deleted since, which are dropped)."""
        built = self._built
        for tablet_id in tablet_ids:
            status = self._tablets.status_of(tablet_id)
            if status is None:
                built.pop(tablet_id, None)  # deleted (the next full walk would see it too)
            else:
                self._entry(status)
        return dict(built)

    def _entry(self, status: TabletStatus) -> tuple[Signature, master_pb2.ReportedTabletPB]:
        """One replica's signature and report, built again only if the signature changed."""
        tablet_id = status.tablet_id
        replica = self._tablets.lookup(tablet_id)
        runtime = None if replica is None else replica.runtime
        consensus: _Consensus | None = None
        health: _Health = ()
        stats: tuple[int, int] | None = None
        if runtime is not None:
            core = runtime.core  # read directly: cheaper than a full status()
            consensus = (core.term, core.leader_uuid or "", core.committed_config)
            if consensus[1] == self._uuid:
                health = self._peer_health(replica)
                stats = self._stats(replica)
        signature = (
            status.state,
            status.data_state,
            status.state_reason,
            consensus,  # the committed config compared by value
            0 if status.schema is None else status.schema.version,
            health,
            stats,
        )
        cached = self._built.get(tablet_id)
        if cached is None or cached[0] != signature:
            report = self._report(status, consensus, health, stats)
            cached = self._built[tablet_id] = (signature, report)
        return cached

    @staticmethod
    def _report(
        status: TabletStatus,
        consensus: _Consensus | None,
        health: _Health,
        stats: tuple[int, int] | None,
    ) -> master_pb2.ReportedTabletPB:
        pb = master_pb2.ReportedTabletPB(
            tablet_id=status.tablet_id,
            state=metadata_pb2.TabletState.Value(status.state),
            state_reason=status.state_reason,
            schema_version=0 if status.schema is None else status.schema.version,
        )
        if status.data_state != "UNKNOWN":
            pb.data_state = metadata_pb2.TabletDataState.Value(f"TABLET_DATA_{status.data_state}")
        if consensus is not None:
            term, leader, config = consensus
            pb.consensus_state.current_term = term
            pb.consensus_state.leader_uuid = leader
            pb.consensus_state.committed_config.CopyFrom(config_to_pb(config))
        for uuid, peer_health_pb, reason in health:
            pb.peer_health.add(
                permanent_uuid=uuid,
                health=peer_health_pb,
                reason=reason,
            )
        if stats is not None:
            pb.stats.live_row_count, pb.stats.on_disk_bytes = stats
        return pb

    def _stats(self, replica: TabletReplica | None) -> tuple[int, int] | None:
        """A leader's rows and bytes on disk (WAL bytes read when its rows changed, data
        bytes when its rowsets changed, at most 30 s ago otherwise)."""
        storage = None if replica is None else replica.storage
        if replica is None or storage is None:
            return None
        counts = storage.stats()
        rows = counts["mem_rows"] + counts["frozen_rows"] + counts["disk_rows"]
        # The WAL's bytes (a stat of each of its few segments) are read again when the rows
        # changed; the data files' (every rowset file stat'd) only when a flush or compaction
        # changed the rowsets, else every 30 s. (Walking every file of every leader whose rows
        # changed, at every heartbeat, took a tenth of the event loop of a server with
        # hundreds of tablets being written.)
        tablet_id = replica.tablet_id
        seen = self._files_seen.get(tablet_id)
        data = (counts["rowsets"], counts["disk_rows"])
        wal = (replica.wal_bytes() or 0) if seen is None or seen[0] != rows else seen[2]
        data_changed = seen is None or seen[1] != data
        size = wal + replica.data_bytes(
            max_age_s=self._interval_s if data_changed else DISK_USAGE_REFRESH_S
        )
        self._files_seen[tablet_id] = (rows, data, wal)
        return rows, size

    def _peer_health(self, replica: TabletReplica | None) -> _Health:
        """A leader's followers' health: (uuid, health, reason) each."""
        return tuple(
            (uuid, _HEALTH_PB[report.health], report.reason)
            for uuid, report in peer_health(replica, self._peer_failed_after_ms).items()
        )

    async def _heartbeat(self, proxy: ServerProxy, master: _MasterState) -> bool:
        """One heartbeat; True to send the next one at once (a full report is wanted)."""
        request = master_pb2.TSHeartbeatRequestPB(
            dest_uuid=master.uuid,
            ts_uuid=self._uuid,
            ts_instance_seqno=self._instance_seqno,
            registration=self._registration,
            heartbeat_interval_ms=self.interval_ms,
        )
        snapshot = self._snapshot()
        # From the signatures (their first item is the state's name): cheaper than reading
        # each report's field, at thousands of replicas every heartbeat.
        request.num_live_tablets = sum(
            1 for signature, _ in snapshot.values() if signature[0] == "RUNNING"
        )
        full = master.needs_full_report
        if master.is_leader:
            self._fill_report(request.tablet_report, master, snapshot, full)
        response = await proxy.call(proxy.master.TSHeartbeat, request)
        master.uuid = response.master_uuid
        if response.tablet_report_processed and request.HasField("tablet_report"):
            self._mark_reported(master, request.tablet_report, snapshot, full)
        new_leader = response.leader_master and (
            not master.is_leader or response.leader_term != master.leader_term
        )
        if new_leader or response.needs_full_tablet_report:
            master.needs_full_report = True
        master.is_leader = response.leader_master
        master.leader_term = response.leader_term
        if response.leader_master and self._security is not None:
            self._security.update(response)
        return master.is_leader and master.needs_full_report

    def _fill_report(
        self,
        report: master_pb2.TabletReportPB,
        master: _MasterState,
        snapshot: _Snapshot,
        full: bool,
    ) -> None:
        master.seqno += 1
        report.sequence_number = master.seqno
        report.is_incremental = not full
        for tablet_id, (signature, pb) in snapshot.items():
            if full or master.reported.get(tablet_id) != signature:
                report.updated_tablets.append(pb)
        if not full:
            report.removed_tablet_ids.extend(t for t in master.reported if t not in snapshot)

    @staticmethod
    def _mark_reported(
        master: _MasterState,
        report: master_pb2.TabletReportPB,
        snapshot: _Snapshot,
        full: bool,
    ) -> None:
        if full:
            master.reported = {t: sig for t, (sig, _) in snapshot.items()}
            master.needs_full_report = False
            return
        for pb in report.updated_tablets:
            master.reported[pb.tablet_id] = snapshot[pb.tablet_id][0]
        for tablet_id in report.removed_tablet_ids:
            master.reported.pop(tablet_id, None)
