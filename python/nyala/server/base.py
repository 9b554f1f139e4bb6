"""What every server process shares: tablet servers and masters both open an fs root, host
tablet replicas (a master hosts the sys catalog) whose Raft talks gRPC to their peers, serve
RPC and HTTP from one asyncio event loop, and shut down gracefully on SIGTERM or SIGINT.

``TabletServer`` and ``MasterServer`` extend ``ServerBase`` with their services, pages and
background work; start-up order and shutdown stay theirs to say.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import time
from typing import ClassVar

from nyala.common.clock import RealClock
from nyala.common.metrics import MetricsRegistry
from nyala.consensus.options import RaftOptions
from nyala.consensus.runtime.peer_streams import PeerStreams
from nyala.consensus.runtime.transport import GrpcTransport
from nyala.consensus.runtime.wal_log import WalLogOptions
from nyala.errors import NyalaError
from nyala.rpc import HttpResponse, HttpServer, RpcMetrics, RpcServer
from nyala.rpc.settings import MIB
from nyala.server.fs_manager import FsManager, InstanceInfo
from nyala.server.server_heartbeats import ServerHeartbeats
from nyala.server.settings import ServerSettings
from nyala.storage import StorageEngine
from nyala.tablet import TabletDirs, TabletManager
from nyala.tablet.quarantine import Quarantine
from nyala.tablet.replica import TabletReplica

log = logging.getLogger(__name__)

#: How often a server purges quarantined replicas past their retention (or while the disk is
#: short of space).
QUARANTINE_CHECK_S = 60.0


class ServerBase:
    """The fs root, metrics, replicas' Raft wiring, signals and the common HTTP pages."""

    #: Batches in flight to each follower (None: the Raft core's default).
    PEER_INFLIGHT_BATCHES_MAX: ClassVar[int | None] = None
    #: Whether a replica whose Raft or WAL fails ends the server (the master, which cannot
    #: serve without its sys catalog) or only goes FAILED (a tablet server's other replicas
    #: keep serving).
    REPLICA_FAILURE_STOPS_SERVER: ClassVar[bool] = False

    def __init__(self, settings: ServerSettings) -> None:
        self.server_settings = settings
        self.fs = FsManager(settings.fs_root)
        self.metrics = MetricsRegistry()
        self._rpc_metrics = RpcMetrics(self.metrics)
        self._stop = asyncio.Event()
        self._stopping = False
        self._started_s = time.monotonic()
        self.instance: InstanceInfo | None = None
        self.tablets: TabletManager | None = None
        # Liveness of quiesced replicas (None: quiescence is off).
        self.server_heartbeats: ServerHeartbeats | None = None
        # The one consensus stream to each peer server, shared by every replica.
        self.peer_streams: PeerStreams | None = None
        # Tasks of this base (streams, server heartbeats): cancelled once replicas stopped.
        self._base_tasks: list[asyncio.Task[None]] = []

    @property
    def uuid(self) -> str:
        """This server's UUID (from the instance file)."""
        assert self.instance is not None, "the fs root is opened by run()"
        return self.instance.uuid

    def request_stop(self) -> None:
        """Starts a graceful shutdown; safe to call more than once."""
        self._stop.set()

    def _open_fs_and_tablets(self) -> TabletManager:
        """Opens the fs root (refusing a foreign or damaged one) and every replica on it; a
        replica that cannot open is marked FAILED, one bad tablet never stops the server."""
        s = self.server_settings
        self.instance = self.fs.open(s.uuid)
        dirs = TabletDirs(
            tablet_meta=self.fs.dir("tablet-meta"),
            consensus_meta=self.fs.dir("consensus-meta"),
            wals=self.fs.dir("wals"),
            data=self.fs.dir("data"),
            quarantine=self.fs.dir("quarantine"),
        )
        quarantine = Quarantine(
            self.fs.dir("quarantine"),
            retention_s=s.quarantine_retention_s,
            disk_free_bytes_min=s.quarantine_disk_free_bytes_min,
        )
        options = WalLogOptions(
            segment_size_bytes=s.wal_segment_bytes,
            sync="group" if s.wal_sync else "none",
            min_segments_to_retain=s.wal_min_segments_to_retain,
        )
        manager = self.tablets = TabletManager(
            dirs, options, flush_threshold_bytes=s.flush_threshold_mb * MIB, quarantine=quarantine
        )
        manager.open_all()
        return manager

    def _start_peer_streams(self, tasks: asyncio.TaskGroup) -> None:
        """Starts the consensus streams to peer servers (before any replica's Raft)."""
        self.peer_streams = PeerStreams(self.uuid, settings=self.server_settings.rpc_settings())
        self._base_tasks.append(tasks.create_task(self.peer_streams.run(), name="peer-streams"))

    def _cancel_base_tasks(self) -> None:
        """Ends the streams and server heartbeats (after every replica's Raft stopped)."""
        for task in self._base_tasks:
            task.cancel()
        self._base_tasks = []

    def _start_server_heartbeats(self, tasks: asyncio.TaskGroup) -> None:
        """Starts the server heartbeats, if replicas may quiesce (``ServerHeartbeats``)."""
        s = self.server_settings
        if s.raft_quiesce_after_idle_heartbeats == 0:
            return
        options = self._raft_options()
        self.server_heartbeats = ServerHeartbeats(
            self.uuid,
            lambda: self.tablets,
            RealClock(),
            interval_ms=s.heartbeat_interval_ms,
            silent_after_ms=options.election_timeout_min_ms,
            rpc_settings=s.rpc_settings(),
        )
        self._base_tasks.append(
            tasks.create_task(self.server_heartbeats.run(), name="server-heartbeats")
        )

    def _close_fs_and_tablets(self) -> None:
        if self.tablets is not None:
            self.tablets.shutdown()
        self.fs.unlock()

    def _start_consensus(self, replica: TabletReplica, tasks: asyncio.TaskGroup) -> None:
        """Runs ``replica``'s Raft in ``tasks``, talking gRPC to the peers of its config."""
        transport = GrpcTransport(
            self.uuid,
            replica.tablet_id,
            lambda peer: _peer_address(replica, peer),
            settings=self.server_settings.rpc_settings(),
            peer_streams=self.peer_streams,
        )
        replica.start_consensus(
            self.uuid,
            tasks,
            transport,
            RealClock(),
            raft_options=self._raft_options(),
            isolate_failure=not self.REPLICA_FAILURE_STOPS_SERVER,
            on_consensus_change=self._on_consensus_change,
        )

    def _on_consensus_change(self) -> None:
        """A replica's role, term, leader or committed config changed (on the event loop); a
        tablet server reports it to the masters at once."""

    def _raft_options(self) -> RaftOptions:
        s = self.server_settings
        options = RaftOptions(
            heartbeat_interval_ms=s.heartbeat_interval_ms,
            missed_heartbeats_before_election=s.leader_failure_max_missed_heartbeat_periods,
            election_jitter_fraction=s.election_timeout_jitter_pct / 100,
            election_backoff_max_ms=s.election_backoff_max_ms,
            batch_bytes_max=s.consensus_batch_bytes_max,
            peer_inflight_bytes_max=max(4 * s.consensus_batch_bytes_max, 4 << 20),
            quiesce_after_idle_heartbeats=s.raft_quiesce_after_idle_heartbeats,
        )
        if self.PEER_INFLIGHT_BATCHES_MAX is None:
            return options
        return dataclasses.replace(
            options, peer_inflight_batches_max=self.PEER_INFLIGHT_BATCHES_MAX
        )

    async def _start_listening(self, rpc: RpcServer, http: HttpServer) -> None:
        """Binds RPC then HTTP (unbinding RPC if HTTP fails) and installs the signal handlers."""
        await rpc.start()
        try:
            await http.start()
        except BaseException:
            await rpc.stop(0)
            raise
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_signal, signum)

    def _on_signal(self, signum: int) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        self.request_stop()

    async def _stop_listening(self, rpc: RpcServer, http: HttpServer) -> None:
        """Waits for a stop request, then turns health to 503 and stops RPC (running calls get
        ``shutdown_grace_ms``) and HTTP."""
        await self._stop.wait()
        self._stopping = True
        await rpc.stop(self.server_settings.shutdown_grace_ms / 1000)
        await http.stop()

    async def _flush_loop(self) -> None:
        """Flushes every running replica's MemRowSet every ``flush_interval_ms`` (bounding
        WAL replay, and letting WAL GC move on), until the server stops."""
        assert self.tablets is not None
        while not self._stopping:
            await asyncio.sleep(self.server_settings.flush_interval_ms / 1000)
            for replica in self.tablets.replicas():
                storage = replica.storage
                if storage is None or self._stopping or not storage.stats()["mem_rows"]:
                    continue
                await self._flush(replica.tablet_id, storage)

    async def _flush(self, tablet_id: str, storage: StorageEngine) -> None:
        """Flushes one replica's MemRowSet off the event loop. A failure is logged: the rows
        stay in memory and in the WAL, and the next round tries again."""
        try:
            rowset = await asyncio.to_thread(storage.flush)
        except NyalaError as exc:
            log.warning("flush of tablet %s failed: %s", tablet_id, exc)
            return
        replica = None if self.tablets is None else self.tablets.lookup(tablet_id)
        if rowset is not None and replica is not None:
            replica.flushes += 1

    async def _quarantine_loop(self) -> None:
        """Purges quarantined replicas past ``quarantine_retention_s``, and the oldest while
        the disk is short (``nyala.tablet.quarantine``), until cancelled."""
        while True:
            await asyncio.sleep(QUARANTINE_CHECK_S)
            quarantine = None if self.tablets is None else self.tablets.quarantine
            if quarantine is None:
                continue
            try:
                await asyncio.to_thread(quarantine.enforce)
            except OSError as exc:
                log.warning("purging the quarantine failed: %s", exc)

    def _register_uptime(self) -> None:
        self.metrics.gauge(
            "nyala_server_uptime_seconds", "Seconds since the server started"
        ).set_callback(lambda: [({}, time.monotonic() - self._started_s)])

    async def _healthz(self) -> HttpResponse:
        if self._stopping:
            return HttpResponse(503, b"stopping\n")
        return HttpResponse(200, b"ok\n")

    async def _metrics_page(self) -> HttpResponse:
        body = self.metrics.render().encode()
        return HttpResponse(200, body, "text/plain; version=0.0.4; charset=utf-8")


def _peer_address(replica: TabletReplica, peer_uuid: str) -> str | None:
    """The address the replica's active config gives for ``peer_uuid``."""
    runtime = replica.runtime
    peer = None if runtime is None else runtime.core.active_config.peer(peer_uuid)
    return None if peer is None else peer.address
