"""What every server process shares: tablet servers and masters both open an fs root, host
tablet replicas (a master hosts the sys catalog) whose Raft talks gRPC to their peers, serve
RPC and HTTP from one asyncio event loop, and shut down gracefully on SIGTERM or SIGINT.

``TabletServer`` and ``MasterServer`` extend ``ServerBase`` with their services, pages and
background work; start-up order and shutdown stay theirs to say.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from nyala import _native
from nyala.common.clock import HybridClock, RealClock
from nyala.common.metrics import MetricsRegistry
from nyala.common.process import gc_pauses, resident_bytes
from nyala.consensus.options import RaftOptions
from nyala.consensus.runtime.peer_channel import PeerChannelServer, ServeWrite, frame_bytes_max
from nyala.consensus.runtime.peer_streams import PeerStreams, PeerStreamsOptions
from nyala.consensus.runtime.transport import GrpcTransport
from nyala.consensus.runtime.wal_log import WalLogOptions
from nyala.errors import NyalaError
from nyala.rpc import HttpResponse, HttpServer, RpcMetrics, RpcServer
from nyala.rpc.credentials import channel_tls_config
from nyala.rpc.errors import join_host_port, split_host_port
from nyala.rpc.http import HttpRequest, Route
from nyala.rpc.settings import MIB
from nyala.server.fs_manager import FsManager, InstanceInfo
from nyala.server.server_heartbeats import ServerHeartbeats
from nyala.server.settings import ServerSettings
from nyala.server.tablet_copy import TabletCopy
from nyala.server.web_ui import (
    COMMON_NAV,
    Cell,
    LogRing,
    Markup,
    PageFrame,
    ServerIdentity,
    heading,
    home_section,
    human_bytes,
    link,
    log_page_lines_default,
    log_ring_records_max,
    logs_section,
    metrics_section,
    paragraph,
    settings_rows,
    table,
)
from nyala.storage import StorageEngine
from nyala.tablet import TabletDirs, TabletManager
from nyala.tablet.quarantine import Quarantine
from nyala.tablet.replica import TabletReplica

if TYPE_CHECKING:
    from nyala.server.consensus_service import ConsensusService

log = logging.getLogger(__name__)

#: How often a server purges quarantined replicas past their retention (or while the disk is
#: short of space).
QUARANTINE_CHECK_S = 60.0
# Merges of one replica per compaction round at most (each leaves fewer rowsets).
COMPACTIONS_PER_ROUND_MAX = 16


class ServerBase:
    """The fs root, metrics, replicas' Raft wiring, signals and the common HTTP pages."""

    #: Batches in flight to each follower (None: the Raft core's default).
    PEER_INFLIGHT_BATCHES_MAX: ClassVar[int | None] = None
    #: ``RaftOptions.commit_notice_delay_ms`` (0: followers are told a new commit index at
    #: once).
    COMMIT_NOTICE_DELAY_MS: ClassVar[int] = 0
    #: Whether a replica whose Raft or WAL fails ends the server (the master, which cannot
    #: serve without its sys catalog) or only goes FAILED (a tablet server's other replicas
    #: keep serving).
    REPLICA_FAILURE_STOPS_SERVER: ClassVar[bool] = False
    #: "master" or "tserver": the web UI's name for this server's role.
    ROLE: ClassVar[str] = "server"

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
        # Where peers send their consensus batches without gRPC (None: not served here).
        self.peer_channel: PeerChannelServer | None = None
        # The consensus service (built with the RPC server), which the peer channel serves.
        self._consensus: ConsensusService | None = None
        # Tasks of this base (streams, server heartbeats): cancelled once replicas stopped.
        self._base_tasks: list[asyncio.Task[None]] = []
        # The process's recent log records for /logs (installed while the fs root is open).
        self.log_ring = LogRing()
        # Tablet copy onto and from this server (built by the role once the fs root is open).
        self.copy: TabletCopy | None = None
        # Addresses actually bound (set once listening), for the web UI.
        self.rpc_address = ""
        self.http_address = ""

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
        logging.getLogger().addHandler(self.log_ring)
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
            dirs,
            options,
            flush_threshold_bytes=s.flush_threshold_mb * MIB,
            quarantine=quarantine,
            hybrid_clock=HybridClock(s.max_clock_error_us),
            history_max_age_s=s.tablet_history_max_age_s,
        )
        manager.open_all()
        return manager

    def _start_peer_streams(self, tasks: asyncio.TaskGroup) -> None:
        """Starts the consensus streams to peer servers (before any replica's Raft)."""
        s = self.server_settings
        self.peer_streams = PeerStreams(
            self.uuid,
            settings=s.rpc_settings(),
            options=PeerStreamsOptions(use_channel=s.consensus_peer_channel),
        )
        self._base_tasks.append(tasks.create_task(self.peer_streams.run(), name="peer-streams"))

    async def _start_peer_channel(
        self, consensus: ConsensusService, serve_write: ServeWrite | None = None
    ) -> None:
        """Serves the peer channel on the RPC host (mutual TLS on a secure server), unless it
        is off: peers then use ConsensusPeerStream. With ``serve_write`` it also takes clients'
        writes there (``peer_channel``)."""
        s = self.server_settings
        tls = s.rpc_settings().tls
        if not s.consensus_peer_channel or (tls is not None and not tls.cert_pem):
            return  # off, or a server not enrolled yet (no certificate to show)
        channel = PeerChannelServer(
            self.uuid,
            consensus.serve_peer_batches,
            frame_bytes_max=frame_bytes_max(s.rpc_message_bytes_max),
            tls=None if tls is None else channel_tls_config(tls, server=True),
            serve_write=serve_write,
        )
        host = split_host_port(s.rpc_bind)[0]
        port = await channel.start(host, s.consensus_peer_channel_port)
        self.peer_channel = channel
        log.info("consensus peer channel on %s", join_host_port(host, port))

    def _close_peer_channel(self) -> None:
        if self.peer_channel is not None:
            self.peer_channel.close()
            self.peer_channel = None

    def peer_channel_port(self) -> int:
        """The peer channel's port as peers should dial it (0: not served), for
        ``GetPeerChannel``."""
        if self.peer_channel is None or not self.peer_channel.port:
            return 0
        return self.server_settings.consensus_peer_channel_advertised_port or self.peer_channel.port

    def _cancel_base_tasks(self) -> None:
        """Ends the streams, the peer channel and server heartbeats (after every replica's
        Raft stopped)."""
        self._close_peer_channel()
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
        logging.getLogger().removeHandler(self.log_ring)

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
        if replica.runtime is not None:
            transport.on_append_lost = replica.runtime.append_lost
            replica.runtime.on_liveness_change = functools.partial(
                self._liveness_changed, replica.tablet_id
            )

    def _liveness_changed(self, tablet_id: str) -> None:
        """A replica quiesced, woke or stopped: the server heartbeats' caches are stale."""
        if self.server_heartbeats is not None:
            self.server_heartbeats.note_change()

    def _on_consensus_change(self, tablet_id: str) -> None:
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
            unanswered_resend_after_ms=s.consensus_rpc_timeout_ms,
        )
        options = dataclasses.replace(options, commit_notice_delay_ms=self.COMMIT_NOTICE_DELAY_MS)
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
        self.rpc_address, self.http_address = rpc.address, http.address
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
        self._close_peer_channel()  # inbound consensus ends with the RPC server's streams
        await http.stop()

    async def _flush_loop(self) -> None:
        """Flushes every running replica's MemRowSet every ``flush_interval_ms`` (bounding
        WAL replay, and letting WAL GC move on), until the server stops; after each round
        the compaction loop (a task of its own, so that a long compaction of one replica does
        not hold back the next replicas' flushes) looks for rowsets to merge."""
        assert self.tablets is not None
        flushed = asyncio.Event()
        compactions = asyncio.create_task(self._compaction_loop(flushed), name="compaction")
        try:
            while not self._stopping:
                await asyncio.sleep(self.server_settings.flush_interval_ms / 1000)
                for replica in self.tablets.replicas():
                    storage = replica.storage
                    if storage is None or self._stopping:
                        continue
                    if storage.stats()["mem_rows"]:
                        await self._flush(replica.tablet_id, storage)
                if compactions.done():
                    compactions.result()  # its failure is this loop's, as it was before
                flushed.set()
        finally:
            compactions.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await compactions

    async def _compaction_loop(self, flushed: asyncio.Event) -> None:
        """After each flush round, merges each replica's rowsets as the storage engine's
        policy picks (``StorageEngine.compact_some``: nothing below
        ``compaction_rowsets_min`` rowsets; docs/storage-format.md, "Which rowsets"), one
        replica and one merge at a time, until the policy picks nothing more there."""
        assert self.tablets is not None
        min_rowsets = self.server_settings.compaction_rowsets_min
        if not min_rowsets:
            return
        while not self._stopping:
            await flushed.wait()
            flushed.clear()
            for replica in self.tablets.replicas():
                storage = replica.storage
                # Each merge leaves fewer rowsets; the bound only guards against a loop.
                for _ in range(COMPACTIONS_PER_ROUND_MAX):
                    # Below the threshold the policy picks nothing: no thread hop for it (a
                    # server may hold thousands of replicas).
                    if storage is None or self._stopping:
                        break
                    if storage.stats()["rowsets"] < min_rowsets:
                        break
                    merged = await self._compact(
                        replica.tablet_id, storage, replica.ancient_history_mark(), min_rowsets
                    )
                    if not merged:
                        break

    async def _compact(
        self, tablet_id: str, storage: StorageEngine, history_mark: int, min_rowsets: int
    ) -> bool:
        """Merges the rowsets the policy picks off the event loop, dropping row versions
        older than the ancient history mark among them (all but the newest at or before it,
        docs/consistency.md). A failure is logged (the rowsets stay as they were): False."""
        try:
            return await asyncio.to_thread(storage.compact_some, history_mark, min_rowsets)
        except NyalaError as exc:
            log.warning("compaction of tablet %s failed: %s", tablet_id, exc)
            return False

    async def _flush(self, tablet_id: str, storage: StorageEngine) -> None:
        """Flushes one replica's MemRowSet off the event loop. A failure is logged: the rows
        stay in memory and in the WAL, and the next round tries again."""
        try:
            await asyncio.to_thread(storage.flush)
        except NyalaError as exc:
            log.warning("flush of tablet %s failed: %s", tablet_id, exc)

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

    def _register_server_metrics(self) -> None:
        """What every server exports: uptime, memory (RSS and tracked), tablet-copy bytes."""
        self.metrics.gauge(
            "nyala_server_uptime_seconds", "Seconds since the server started"
        ).set_callback(lambda: [({}, time.monotonic() - self._started_s)])
        self.metrics.gauge(
            "nyala_process_resident_memory_bytes", "Resident set size of this process"
        ).set_callback(lambda: [({}, float(resident_bytes()))])
        self.metrics.gauge(
            "nyala_memory_tracked_bytes",
            "Memory the server accounts for: MemRowSets and log caches of its replicas",
            ("kind",),
        ).set_callback(self._tracked_memory)
        pauses = gc_pauses()
        generations = range(pauses.GENERATIONS)
        self.metrics.observed_counter(
            "nyala_gc_collections_total",
            "Collections of Python's cyclic garbage collector, by generation",
            ("generation",),
            lambda: [({"generation": str(g)}, float(pauses.collections[g])) for g in generations],
        )
        self.metrics.observed_counter(
            "nyala_gc_pause_seconds_total",
            "Seconds Python's garbage collector held every thread of this process, by generation",
            ("generation",),
            lambda: [({"generation": str(g)}, pauses.pause_s[g]) for g in generations],
        )
        self.metrics.gauge(
            "nyala_gc_pause_seconds_max",
            "The longest collection of each generation since the process started",
            ("generation",),
        ).set_callback(lambda: [({"generation": str(g)}, pauses.longest_s[g]) for g in generations])
        self.metrics.observed_counter(
            "nyala_consensus_peer_batches_sent_total",
            "Consensus batches sent to peer servers, by transport: the peer channel or gRPC",
            ("transport",),
            lambda: self._by_transport(lambda streams: streams.batches_sent),
        )
        self.metrics.observed_counter(
            "nyala_consensus_peer_votes_sent_total",
            "Vote requests (pre-votes included) sent to peer servers in consensus batches, by "
            "transport",
            ("transport",),
            lambda: self._by_transport(lambda streams: streams.votes_sent),
        )
        self.metrics.gauge(
            "nyala_consensus_peer_connections",
            "Peer servers this server sends consensus to, by the transport it now uses",
            ("transport",),
        ).set_callback(lambda: self._by_transport(PeerStreams.connections))
        self.metrics.observed_counter(
            "nyala_tablet_copy_bytes_total",
            "Tablet copy bytes: fetched (onto this server) and served (as a source)",
            ("direction",),
            self._copy_bytes,
        )

    def _tracked_memory(self) -> list[tuple[dict[str, str], float]]:
        by_kind = {"MemRowSet": 0, "log cache": 0}
        for kind, _, n in self.memory_rows():
            by_kind[kind] = by_kind.get(kind, 0) + n
        return [({"kind": kind}, float(n)) for kind, n in sorted(by_kind.items())]

    def _by_transport(
        self, figures: Callable[[PeerStreams], dict[str, int]]
    ) -> list[tuple[dict[str, str], float]]:
        """One of the peer streams' figures by transport, as metric samples."""
        streams = self.peer_streams
        if streams is None:
            return []
        return [({"transport": name}, float(n)) for name, n in sorted(figures(streams).items())]

    def _copy_bytes(self) -> list[tuple[dict[str, str], float]]:
        copy = self.copy
        if copy is None:
            return []
        fetched = float(copy.jobs.bytes_fetched())
        return [({"direction": "fetched"}, fetched), ({"direction": "served"}, copy.bytes_served)]

    # --- HTTP: status endpoints and the web UI ------------------------------------------------

    def _http_routes(self) -> dict[str, Route]:
        """The pages every server serves (each role adds its own)."""
        return {
            "/": self._home_page,
            "/healthz": self._healthz,
            "/metrics": self._metrics_page,
            "/metrics-page": self._metrics_html_page,
            "/varz": self._varz_page,
            "/mem-trackers": self._memory_page,
            "/logs": self._logs_page,
            "/tablet-copies": self._copy_page,
        }

    def _role_nav(self) -> list[tuple[str, str]]:
        """The role's pages, first in the navigation bar."""
        return []

    def frame(self) -> PageFrame:
        """The page frame with this server's identity and navigation."""
        identity = ServerIdentity(
            self.ROLE,
            "" if self.instance is None else self.instance.uuid,
            self.rpc_address,
            self.http_address,
        )
        return PageFrame(identity, [("/", "Home"), *self._role_nav(), *COMMON_NAV])

    def _home_sections(self) -> list[Markup]:
        """What the role adds to its home page."""
        return []

    async def _home_page(self, _request: HttpRequest) -> HttpResponse:
        frame = self.frame()
        return frame.render(
            f"nyala {self.ROLE}",
            home_section(frame.identity, _native.__version__, time.monotonic() - self._started_s),
            *self._home_sections(),
            heading("Settings that differ from their default"),
            table(
                ("name", "value", "default"), settings_rows(self.server_settings, changed_only=True)
            ),
            paragraph("Every setting: ", link("/varz", "/varz"), "."),
        )

    async def _varz_page(self, _request: HttpRequest) -> HttpResponse:
        rows = settings_rows(self.server_settings, changed_only=False)
        return self.frame().render("Flags", table(("name", "value", "default"), rows))

    def memory_rows(self) -> list[tuple[str, str, int]]:
        """(what, tablet, bytes) of the memory this server tracks: each replica's MemRowSet
        and log cache (a role may add its own)."""
        rows = []
        for replica in self.tablets.replicas() if self.tablets is not None else []:
            storage, wal = replica.storage, replica.wal
            if storage is not None:
                rows.append(("MemRowSet", replica.tablet_id, storage.stats()["mem_bytes"]))
            if wal is not None:
                rows.append(("log cache", replica.tablet_id, wal.cache_stats().bytes))
        return rows

    async def _memory_page(self, _request: HttpRequest) -> HttpResponse:
        rows = self.memory_rows()
        tracked = sum(n for _, _, n in rows)
        totals: list[tuple[str, Cell, Cell]] = [
            ("process resident set (RSS)", resident_bytes(), human_bytes(resident_bytes())),
            ("tracked (sum below)", tracked, human_bytes(tracked)),
        ]
        by_kind: dict[str, int] = {}
        for kind, _, n in rows:
            by_kind[kind] = by_kind.get(kind, 0) + n
        totals += [(f"{kind} (all)", n, human_bytes(n)) for kind, n in sorted(by_kind.items())]
        detail = [(kind, self._tablet_link(tablet), n, human_bytes(n)) for kind, tablet, n in rows]
        return self.frame().render(
            "Memory",
            table(("what", "bytes", ""), totals),
            heading("By tablet"),
            table(("what", "tablet", "bytes", ""), detail),
        )

    def _tablet_link(self, tablet_id: str) -> Cell:
        """A tablet id as the role's page shows it (a link where the role has a tablet page)."""
        return tablet_id

    async def _logs_page(self, request: HttpRequest) -> HttpResponse:
        try:
            count = int(request.param("lines", str(log_page_lines_default)))
        except ValueError:
            count = log_page_lines_default
        count = max(0, min(count, log_ring_records_max))
        return self.frame().render(
            "Recent log lines",
            paragraph(f"The newest {count} records (kept in memory: {log_ring_records_max})."),
            logs_section(self.log_ring, count),
        )

    async def _copy_page(self, request: HttpRequest) -> HttpResponse:
        assert self.copy is not None, "the tablet copy is built before the HTTP server"
        return await self.copy.http_page(request, self.frame())

    async def _metrics_html_page(self, _request: HttpRequest) -> HttpResponse:
        return self.frame().render("Metrics", metrics_section(self.metrics.render()))

    async def _healthz(self, _request: HttpRequest) -> HttpResponse:
        if self._stopping:
            return HttpResponse(503, b"stopping\n")
        return HttpResponse(200, b"ok\n")

    async def _metrics_page(self, request: HttpRequest) -> HttpResponse:
        # ``?metrics=a,b`` (Kudu's /metrics filter; repeatable): only those families.
        wanted = [n for v in request.query.get("metrics", ()) for n in v.split(",") if n]
        body = self.metrics.render(wanted or None).encode()
        return HttpResponse(200, body, "text/plain; version=0.0.4; charset=utf-8")


def _peer_address(replica: TabletReplica, peer_uuid: str) -> str | None:
    """The address the replica's active config gives for ``peer_uuid``."""
    runtime = replica.runtime
    peer = None if runtime is None else runtime.core.active_config.peer(peer_uuid)
    return None if peer is None else peer.address
