"""The tablet server process: one asyncio event loop, one TaskGroup, RPC and HTTP servers.

Start-up order: open the fs root (refusing a foreign or damaged one), bind RPC and HTTP, then
announce readiness. SIGTERM or SIGINT starts a graceful shutdown: health turns 503, the RPC
server stops accepting and gives running calls ``shutdown_grace_ms`` to finish, and ``run``
returns normally (exit code 0).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable

from nyala import _native
from nyala._proto import tserver_admin_pb2_grpc, tserver_pb2_grpc
from nyala.common.process import resident_bytes, trim_heap
from nyala.consensus.core import ReplicaStatus
from nyala.consensus.types import Role
from nyala.errors import ServiceUnavailableError
from nyala.rpc import HttpResponse, HttpServer, RpcServer
from nyala.rpc.auth import Revocations
from nyala.rpc.http import HttpRequest, Route
from nyala.rpc.settings import MIB
from nyala.security.tokens import TokenVerifier
from nyala.server.base import ServerBase
from nyala.server.consensus_service import ConsensusService, add_consensus_service
from nyala.server.security import enroll, http_authorizer, http_tls
from nyala.server.tablet_copy import TabletCopy, add_tablet_copy_service
from nyala.server.web_ui import Cell, Markup, wants_json
from nyala.storage import StorageEngine
from nyala.tablet.replica import TabletReplica
from nyala.tserver.authz import SecurityUpdates, TabletAuthorizer
from nyala.tserver.heartbeater import Heartbeater
from nyala.tserver.memory import MemoryTracker, MemoryUsage, ReplicaBytes, ReplicaMemory
from nyala.tserver.scanners import ScannerRegistry
from nyala.tserver.services import AdminService, TabletService
from nyala.tserver.settings import TabletServerSettings
from nyala.tserver.tablet_meta import TabletReport, peer_health
from nyala.tserver.web_ui import TSERVER_NAV, TabletServerPages, tablet_link

log = logging.getLogger(__name__)

#: Longest pause between two sweeps for idle scanners, in ms (a quarter of the TTL if shorter).
SCANNER_EXPIRY_INTERVAL_MS_MAX = 1_000


def memrowsets_to_flush(mem_bytes: dict[str, int], limit_bytes: int) -> list[str]:
    """The tablets whose MemRowSets to flush, largest first, until the rest fit in
    ``limit_bytes`` (none if they fit already)."""
    total = sum(mem_bytes.values())
    if total <= limit_bytes:
        return []  # the common case, checked twice a second over every replica: no sort
    chosen: list[str] = []
    for tablet_id, size in sorted(mem_bytes.items(), key=lambda item: (-item[1], item[0])):
        if total <= limit_bytes or size == 0:
            break
        chosen.append(tablet_id)
        total -= size
    return chosen


def _is_leader(status: ReplicaStatus) -> float:
    return 1.0 if status.role is Role.LEADER else 0.0


def _leader_for_seconds(status: ReplicaStatus) -> float:
    # The core's clock in a server is ``RealClock``: ``time.monotonic_ns`` in milliseconds.
    since = status.leader_since_ms
    return 0.0 if since is None else (time.monotonic_ns() // 1_000_000 - since) / 1000


# Per-tablet consensus gauges on /metrics: name -> (help, how to read it from the status).
def _storage_stat(key: str, scale: float = 1.0) -> Callable[[TabletReplica], float | None]:
    def read(replica: TabletReplica) -> float | None:
        storage = replica.storage
        return None if storage is None else storage.stats()[key] * scale

    return read


def _wal_stat(*, bytes_: bool) -> Callable[[TabletReplica], float | None]:
    """The replica's WAL segments on disk: their bytes, or how many there are."""

    def read(replica: TabletReplica) -> float | None:
        if bytes_:
            size = replica.wal_bytes()
            return None if size is None else float(size)
        wal = replica.wal
        return None if wal is None else float(len(wal.segment_paths()))

    return read


def _applier_stat(attr: str) -> Callable[[TabletReplica], float | None]:
    def read(replica: TabletReplica) -> float | None:
        applier = replica.applier
        return None if applier is None else float(getattr(applier, attr))

    return read


#: Counters of each replica (labels table, tablet_id), read at scrape time.
_PER_REPLICA_COUNTERS: dict[str, tuple[str, Callable[[TabletReplica], float | None]]] = {
    "nyala_rows_written_total": (
        "Rows of applied writes that ended OK (on every replica)",
        _applier_stat("rows_written"),
    ),
    "nyala_bytes_written_total": (
        "Bytes of applied write batches (Arrow IPC, on every replica)",
        _applier_stat("bytes_written"),
    ),
    "nyala_rows_scanned_total": (
        "Rows returned by scans served by this replica",
        lambda r: float(r.rows_scanned),
    ),
    "nyala_bytes_scanned_total": (
        "Bytes of scan results served by this replica (Arrow IPC)",
        lambda r: float(r.bytes_scanned),
    ),
    "nyala_flushes_total": (
        "MemRowSet flushes that wrote a rowset (periodic, memory pressure and size-triggered)",
        _storage_stat("flushes"),
    ),
    "nyala_flush_duration_seconds_total": (
        "Seconds spent in those flushes",
        _storage_stat("flush_duration_us", scale=1e-6),
    ),
    "nyala_compactions_total": (
        "Compactions that merged rowsets",
        _storage_stat("compactions"),
    ),
    "nyala_compaction_duration_seconds_total": (
        "Seconds spent in those compactions",
        _storage_stat("compaction_duration_us", scale=1e-6),
    ),
    "nyala_compaction_written_bytes_total": (
        "Bytes of the rowsets those compactions wrote (write amplification, next to the data)",
        _storage_stat("compaction_bytes_written"),
    ),
}
#: Gauges of each replica (labels table, tablet_id).
_PER_REPLICA_GAUGES: dict[str, tuple[str, Callable[[TabletReplica], float | None]]] = {
    "nyala_memrowset_bytes": ("Bytes held by the MemRowSet", _storage_stat("mem_bytes")),
    "nyala_memrowset_rows": ("Rows held by the MemRowSet", _storage_stat("mem_rows")),
    "nyala_data_rows": ("Rows in flushed rowsets", _storage_stat("disk_rows")),
    "nyala_data_rowsets": ("Flushed rowsets", _storage_stat("rowsets")),
    "nyala_data_bytes": ("Bytes of the flushed rowsets' files", _storage_stat("data_bytes")),
    "nyala_wal_bytes": ("Bytes of the replica's WAL segments on disk", _wal_stat(bytes_=True)),
    "nyala_wal_segments": ("WAL segments on disk", _wal_stat(bytes_=False)),
    "nyala_on_disk_bytes": (
        "Bytes of the replica's WAL and data files (counted at most 30 s ago)",
        lambda r: float(r.on_disk_bytes()),
    ),
}

_PER_TABLET_GAUGES: dict[str, tuple[str, Callable[[ReplicaStatus], float]]] = {
    "nyala_tablet_raft_term": ("Current Raft term, per tablet", lambda st: st.term),
    "nyala_tablet_commit_index": ("Raft commit index, per tablet", lambda st: st.commit_index),
    "nyala_tablet_last_applied_index": ("Last applied op index", lambda st: st.last_applied),
    "nyala_tablet_is_leader": ("1 if this replica leads its tablet", _is_leader),
    "nyala_tablet_leader_for_seconds": (
        "Seconds since this replica became its tablet's leader (0 unless it leads)",
        _leader_for_seconds,
    ),
    "nyala_tablet_quiesced": (
        "1 if this replica is quiesced (no per-tablet heartbeats or election timer)",
        lambda st: float(st.quiesced),
    ),
}


#: How long one snapshot of the replicas' statuses serves the per-tablet gauges (seconds).
_STATUS_SNAPSHOT_S = 0.2
#: The memory-pressure check measures every replica at every this many checks (10 s at the
#: default interval); in between only those that can have changed (``ReplicaMemory``).
MEMORY_FULL_SWEEP_EVERY = 20


class TabletServer(ServerBase):
    """One tablet server. ``run`` serves until ``request_stop`` (or a signal)."""

    # One batch out per follower: what is proposed meanwhile rides in the next one (measured:
    # about 40 % less server CPU per single-row write, docs/performance.md).
    PEER_INFLIGHT_BATCHES_MAX = 1
    # A follower learns a new commit index from the next batch, or within this long: a lone
    # writer's every write cost each follower, and the leader, one more exchange (issue 28,
    # docs/performance.md). Bounds how far an idle follower's applied state lags.
    COMMIT_NOTICE_DELAY_MS = 5
    ROLE = "tserver"

    def __init__(self, settings: TabletServerSettings) -> None:
        super().__init__(settings)
        self.settings = settings
        self.rpc: RpcServer | None = None
        self.http: HttpServer | None = None
        # The group every replica's Raft runs in; set while serving.
        self._replica_tasks: asyncio.TaskGroup | None = None
        self._flush_task: asyncio.Task[None] | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._heartbeater: Heartbeater | None = None
        self._security: SecurityUpdates | None = None  # a secure server's keys and revocations
        self._tablet_service: TabletService | None = None  # built with the RPC server
        self._quarantine_task: asyncio.Task[None] | None = None
        self._copy_tasks: list[asyncio.Task[None]] = []
        self.scanners = ScannerRegistry(settings.scanner_ttl_ms)
        self.memory = MemoryTracker(
            settings.memory_limit_bytes,
            settings.memory_pressure_percentage,
            settings.memory_limit_soft_percentage,
        )
        configured = settings.key_block_cache_mb * 1024 * 1024
        #: The key block cache's budget (``MemoryTracker.key_block_cache_bytes``).
        self.key_block_cache_bytes = self.memory.key_block_cache_bytes(configured)
        if self.key_block_cache_bytes < configured:
            log.warning(
                "key_block_cache_mb %d is more than a quarter of the memory pressure threshold "
                "(%d MiB of memory_limit_bytes %d MiB): the cache holds at most %d MiB",
                settings.key_block_cache_mb,
                self.memory.pressure_bytes >> 20,
                self.memory.limit_bytes >> 20,
                self.key_block_cache_bytes >> 20,
            )
        _native.set_key_block_cache_bytes(self.key_block_cache_bytes)
        self._replica_memory = ReplicaMemory()  # each replica's last measured memory
        self._memory_checks = 0
        # Quiesced replicas whose WAL files may still be open (``_release_idle_files``).
        self._files_to_release: set[str] = set()
        # (when, statuses) of the last ``_statuses`` call.
        self._status_snapshot: tuple[float, list[tuple[str, ReplicaStatus]]] | None = None

    async def run(self) -> None:
        """Opens the fs root, serves until stopped, shuts down gracefully."""
        tablets = self._open_fs_and_tablets()
        await enroll(self.settings, self.uuid, self.settings.enroll_timeout_ms)
        self._register_metrics()
        self.copy = TabletCopy(
            self.uuid,
            self.settings,
            tablets,
            start_replica=self.start_replica,
            stop_replica=self.stop_replica,
        )
        self.rpc = self._build_rpc_server()
        security = self._security  # set by _build_rpc_server on a secure server
        self.http = HttpServer(
            self.settings.http_bind,
            self._http_routes(),
            self.copy.http_post_routes(self.frame),
            tls=http_tls(self.settings),
            authorize=None if security is None else http_authorizer(security.revocations),
        )
        try:
            await self._serve()
        finally:
            self._close_fs_and_tablets()
        log.info("tserver %s stopped", self.uuid)

    async def _serve(self) -> None:
        assert self.rpc is not None
        assert self.http is not None
        # The peer channel first: a peer that asks GetPeerChannel as soon as the RPC port
        # answers learns its port, not that there is none (it would then keep to the gRPC
        # stream for that stream's whole life).
        assert self._consensus is not None
        assert self._tablet_service is not None
        await self._start_peer_channel(self._consensus, self._tablet_service.serve_write_frame)
        try:
            await self._start_listening(self.rpc, self.http)
        except BaseException:
            self._close_peer_channel()
            raise
        log.info(
            "tserver %s ready: rpc %s, http %s, fs root %s",
            self.uuid,
            self.rpc.address,
            self.http.address,
            self.settings.fs_root,
        )
        async with asyncio.TaskGroup() as tasks:
            self._replica_tasks = tasks
            assert self.tablets is not None
            self._start_peer_streams(tasks)
            for replica in self.tablets.startable():
                self.start_replica(replica)
            self._start_server_heartbeats(tasks)
            tasks.create_task(self.rpc.wait_for_termination(), name="rpc-server")
            tasks.create_task(self.http.wait_closed(), name="http-server")
            tasks.create_task(self._shutdown_when_stopped(), name="shutdown")
            self._flush_task = tasks.create_task(self._flush_loop(), name="flush")
            tasks.create_task(self._memory_pressure_loop(), name="memory-pressure")
            tasks.create_task(self._scanner_expiry_loop(), name="scanner-expiry")
            self._quarantine_task = tasks.create_task(self._quarantine_loop(), name="quarantine")
            if self.settings.masters:
                self._heartbeat_task = tasks.create_task(self._heartbeat(), name="heartbeater")
            if self.copy is not None:
                self._copy_tasks = self.copy.start(tasks)

    def list_tablets(self) -> list[TabletReport]:
        """What ListTablets and /tablets report."""
        tablets = self.tablets
        assert tablets is not None, "tablets are opened by run()"
        failed_after_ms = self.settings.follower_unavailable_considered_failed_sec * 1000
        return [
            TabletReport(status, peer_health(tablets.lookup(status.tablet_id), failed_after_ms))
            for status in tablets.statuses()
        ]

    def start_replica(self, replica: TabletReplica) -> None:
        """Runs Raft for an opened replica (no-op if it already runs)."""
        tasks = self._replica_tasks
        if tasks is None:
            raise ServiceUnavailableError("the server is not serving yet")
        if replica.runtime is not None or replica.storage is None:
            return
        self._start_consensus(replica, tasks)
        if self.copy is not None:
            self.copy.hook_replica(replica)  # auto-vivification of followers by tablet copy

    async def stop_replica(self, tablet_id: str) -> None:
        """Stops a replica's Raft (before its files are closed or deleted)."""
        assert self.tablets is not None
        replica = self.tablets.lookup(tablet_id)
        if replica is not None:
            await replica.stop_consensus()

    def _authorizer(self) -> TabletAuthorizer | None:
        """The table-privilege check of a secure server (None: insecure)."""
        if self._security is None:
            return None
        assert self.tablets is not None
        return TabletAuthorizer(self._security.verifier, self.tablets)

    def _build_rpc_server(self) -> RpcServer:
        assert self.tablets is not None, "tablets are opened before the RPC server is built"
        if self.settings.rpc_settings().tls is not None:
            # Token-signing keys and revoked users, from the leader master's heartbeats.
            self._security = SecurityUpdates(TokenVerifier(), Revocations())
        revocations = None if self._security is None else self._security.revocations
        server = RpcServer(self.settings.rpc_bind, self.settings.rpc_settings(), revocations)
        self._tablet_service = TabletService(
            self.uuid,
            self._rpc_metrics,
            self._started_s,
            self.tablets,
            self.scanners,
            self.settings.scan_batch_bytes_max,
            self.memory.admit_write,
            self._authorizer(),
            revocations,
        )
        add_tablet_service = tserver_pb2_grpc.add_TabletServiceServicer_to_server
        server.add_service(add_tablet_service, self._tablet_service)
        self._consensus = ConsensusService(
            self.uuid,
            self._rpc_metrics,
            self.tablets,
            lambda: self.peer_streams,
            lambda: self.server_heartbeats,
            self.peer_channel_port,
        )
        server.add_service(add_consensus_service, self._consensus)
        server.add_service(
            tserver_admin_pb2_grpc.add_TabletServerAdminServiceServicer_to_server,
            AdminService(
                self.uuid,
                self._rpc_metrics,
                self.tablets,
                self.list_tablets,
                self.start_replica,
                self.stop_replica,
            ),
        )
        if self.copy is not None:
            server.add_service(add_tablet_copy_service, self.copy.service(self._rpc_metrics))
        return server

    async def _scanner_expiry_loop(self) -> None:
        """Drops idle scanners (and what their cursors pin) even when no scan comes in."""
        interval_s = min(self.settings.scanner_ttl_ms / 4, SCANNER_EXPIRY_INTERVAL_MS_MAX) / 1000
        while not self._stopping:
            await asyncio.sleep(interval_s)
            self.scanners.expire()

    def _measure_memory(self) -> tuple[int, int]:
        """Refreshes the tracked memory (``nyala.tserver.memory``; only the replicas that can
        have changed, ``ReplicaMemory``, and all of them at every
        ``MEMORY_FULL_SWEEP_EVERY``-th check); returns the bytes of the active MemRowSets
        and of those being flushed."""
        tablets = self.tablets
        assert tablets is not None
        self._memory_checks += 1
        replicas = self._replica_memory
        replicas.refresh(
            lambda: [r.tablet_id for r in tablets.replicas()],
            self._replica_bytes,
            full=self._full_sweep(),
        )
        scanners = len(self.scanners) * self.settings.scan_batch_bytes_max
        tracked = MemoryUsage(
            replicas.active_bytes + replicas.flushing_bytes,
            replicas.cache_bytes,
            scanners,
            _native.key_block_cache_stats()["bytes"],
            _native.rowset_index_bytes(),
        )
        self.memory.update(tracked.with_resident(resident_bytes()))
        return replicas.active_bytes, replicas.flushing_bytes

    def _full_sweep(self) -> bool:
        """Whether this memory check looks at every replica (the first one too)."""
        return self._memory_checks % MEMORY_FULL_SWEEP_EVERY == 1

    def _release_idle_files(self) -> None:
        """Closes the WAL files of replicas that quiesced since the last check, once their
        logs are idle (``WalLog.release_files``; a log still finishing work is tried again at
        the next check). A quiesced replica then holds no file descriptor: 2,000 of them held
        two each (issue "Thousands of tablet replicas per server"). Every quiesced replica is
        tried again at each full memory sweep, for files a read opened meanwhile."""
        tablets = self.tablets
        assert tablets is not None
        if self._full_sweep():
            self._files_to_release.update(
                r.tablet_id
                for r in tablets.replicas()
                if r.runtime is not None and r.runtime.liveness_signature() is not None
            )
        done = []
        for tablet_id in self._files_to_release:
            replica = tablets.lookup(tablet_id)
            wal = None if replica is None else replica.wal
            runtime = None if replica is None else replica.runtime
            if wal is None or runtime is None or not runtime.running:
                done.append(tablet_id)  # gone, or its log closed with it
            elif runtime.liveness_signature() is None:
                done.append(tablet_id)  # awake again
            elif wal.release_files():
                done.append(tablet_id)
        self._files_to_release.difference_update(done)

    def _replica_bytes(self, tablet_id: str) -> ReplicaBytes | None:
        assert self.tablets is not None
        replica = self.tablets.lookup(tablet_id)
        if replica is None:
            return None
        storage, wal = replica.storage, replica.wal
        stats = None if storage is None else storage.stats()
        return (
            0 if stats is None else stats["mem_bytes"],
            0 if stats is None else stats["frozen_bytes"],
            0 if wal is None else wal.cache_stats().bytes,
        )

    def _liveness_changed(self, tablet_id: str) -> None:
        super()._liveness_changed(tablet_id)
        replica = None if self.tablets is None else self.tablets.lookup(tablet_id)
        runtime = None if replica is None else replica.runtime
        awake = runtime is not None and runtime.running and runtime.liveness_signature() is None
        self._replica_memory.liveness_changed(tablet_id, awake)
        if awake:
            self._files_to_release.discard(tablet_id)
        else:
            self._files_to_release.add(tablet_id)

    async def _flush(self, tablet_id: str, storage: StorageEngine) -> None:
        await super()._flush(tablet_id, storage)
        self._replica_memory.flushed(tablet_id)

    async def _memory_pressure_loop(self) -> None:
        """Flushes the largest MemRowSets while all of them together exceed
        ``memrowsets_memory_limit_mb`` or the server's tracked memory is above its pressure
        threshold (``memory_pressure_percentage`` of ``memory_limit_bytes``); then gives the
        freed memory back to the kernel."""
        assert self.tablets is not None
        limit_bytes = self.settings.memrowsets_memory_limit_mb * MIB
        while not self._stopping:
            await asyncio.sleep(self.settings.memory_pressure_check_interval_ms / 1000)
            active, flushing = self._measure_memory()
            self._release_idle_files()
            budget = min(limit_bytes, self.memory.memrowsets_budget_bytes())
            # A MemRowSet already being flushed frees its memory when that flush ends.
            room = max(0, budget - flushing)
            chosen = (
                memrowsets_to_flush(self._replica_memory.active_by_tablet(), room)
                if active > room
                else []
            )
            for tablet_id in chosen:
                replica = self.tablets.lookup(tablet_id)
                if self._stopping:
                    return
                if replica is None or replica.storage is None:
                    continue
                await self._flush(tablet_id, replica.storage)
                self._measure_memory()
            if chosen or self.memory.over_pressure:
                # Still over with nothing left to flush: the untracked part may be heap that
                # the allocator keeps (up to its trim threshold) after requests were freed.
                await asyncio.to_thread(trim_heap)
                if not chosen:
                    self._measure_memory()

    def _on_consensus_change(self, tablet_id: str) -> None:
        # Kudu's incremental tablet report, sent at once: the masters name a new leader
        # within one round trip of its election.
        if self._heartbeater is not None:
            self._heartbeater.trigger(tablet_id)

    async def _heartbeat(self) -> None:
        """Heartbeats to every master (``nyala.tserver.heartbeater``) until cancelled."""

        assert self.rpc is not None
        assert self.http is not None
        assert self.tablets is not None
        heartbeater = self._heartbeater = Heartbeater(
            self.uuid,
            self.rpc.address,
            self.http.address,
            self.settings.masters,
            self.settings.master_heartbeat_interval_ms,
            self.tablets,
            self.settings.rpc_settings(),
            peer_failed_after_ms=self.settings.follower_unavailable_considered_failed_sec * 1000,
            security=self._security,
        )
        await heartbeater.run()

    async def _shutdown_when_stopped(self) -> None:
        assert self.rpc is not None
        assert self.http is not None
        await self._stop_listening(self.rpc, self.http)
        if self._flush_task is not None:
            self._flush_task.cancel()  # it may sleep for flush_interval_ms
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
        if self._quarantine_task is not None:
            self._quarantine_task.cancel()
        for task in self._copy_tasks:
            task.cancel()
        if self.copy is not None:
            await self.copy.close()
        assert self.tablets is not None
        # Every runtime is cancelled first, then all are awaited together: stopping thousands
        # of replicas one after another took tens of seconds.
        await asyncio.gather(*(r.stop_consensus() for r in self.tablets.replicas()))
        self._cancel_base_tasks()
        self._replica_tasks = None

    def _register_metrics(self) -> None:
        self._register_server_metrics()
        tablets = self.metrics.gauge(
            "nyala_tablets", "Tablet replicas on this server, by state", ("state",)
        )
        tablets.set_callback(self._tablet_counts)
        for name, (help_text, read) in _PER_TABLET_GAUGES.items():
            gauge = self.metrics.gauge(name, help_text, ("tablet_id",))
            gauge.set_callback(functools.partial(self._per_tablet, read))
        self.metrics.gauge(
            "nyala_server_heartbeats_sent", "Server heartbeats sent to peer servers"
        ).set_callback(self._server_heartbeats_sent)
        self._register_data_metrics()

    def _register_data_metrics(self) -> None:
        """What the data does, by table and tablet (read from each replica at scrape time,
        so writes and scans only bump plain ints)."""
        labels = ("table", "tablet_id")
        for name, (help_text, read) in _PER_REPLICA_COUNTERS.items():
            self.metrics.observed_counter(
                name, help_text, labels, functools.partial(self._per_replica, read)
            )
        for name, (help_text, read) in _PER_REPLICA_GAUGES.items():
            self.metrics.gauge(name, help_text, labels).set_callback(
                functools.partial(self._per_replica, read)
            )
        self.metrics.observed_counter(
            "nyala_write_errors_total",
            "Rows of applied writes that failed, by row status (duplicate or missing key, ...)",
            ("table", "tablet_id", "code"),
            self._write_errors,
        )
        self.metrics.gauge("nyala_leaders", "Tablet replicas this server leads").set_callback(
            self._leader_count
        )
        self._register_memory_metrics()

    def _tracked_memory(self) -> list[tuple[dict[str, str], float]]:
        """``nyala_memory_tracked_bytes`` by kind: the memory tracker's last measurement of
        what counts against ``memory_limit_bytes`` (``nyala.tserver.memory``)."""
        usage = self.memory.usage
        return [
            ({"kind": "MemRowSet"}, float(usage.memrowsets_bytes)),
            ({"kind": "log cache"}, float(usage.log_caches_bytes)),
            ({"kind": "scanners"}, float(usage.scanners_bytes)),
            ({"kind": "key blocks"}, float(usage.key_blocks_bytes)),
            ({"kind": "rowset indexes"}, float(usage.rowset_indexes_bytes)),
            ({"kind": "untracked"}, float(usage.untracked_bytes)),
        ]

    def _register_memory_metrics(self) -> None:
        """The memory limit's thresholds and the writes refused above it."""
        memory = self.memory
        self.metrics.gauge(
            "nyala_memory_limit_bytes",
            "The memory limit and its thresholds (pressure: flush; soft: refuse writes)",
            ("threshold",),
        ).set_callback(
            lambda: [
                ({"threshold": "hard"}, float(memory.limit_bytes)),
                ({"threshold": "soft"}, float(memory.soft_limit_bytes)),
                ({"threshold": "pressure"}, float(memory.pressure_bytes)),
            ]
        )
        self.metrics.gauge(
            "nyala_key_block_cache_capacity_bytes",
            "What the cache of rowsets' key blocks may hold (key_block_cache_mb, at most a "
            "quarter of the pressure threshold)",
        ).set_callback(lambda: [({}, float(self.key_block_cache_bytes))])
        self.metrics.observed_counter(
            "nyala_writes_refused_memory_total",
            "Writes refused above the soft memory limit",
            (),
            lambda: [({}, float(memory.writes_refused))],
        )

    def _per_replica(
        self, read: Callable[[TabletReplica], float | None]
    ) -> list[tuple[dict[str, str], float]]:
        out = []
        for replica in self.tablets.replicas() if self.tablets is not None else []:
            value = read(replica)
            if value is not None:
                labels = {"table": replica.superblock.table_name, "tablet_id": replica.tablet_id}
                out.append((labels, float(value)))
        return out

    def _write_errors(self) -> list[tuple[dict[str, str], float]]:
        out = []
        for replica in self.tablets.replicas() if self.tablets is not None else []:
            applier = replica.applier
            if applier is None:
                continue
            for code, count in applier.rows_failed_by_code.items():
                labels = {
                    "table": replica.superblock.table_name,
                    "tablet_id": replica.tablet_id,
                    "code": code,
                }
                out.append((labels, float(count)))
        return out

    def _leader_count(self) -> list[tuple[dict[str, str], float]]:
        leaders = 0
        for replica in self.tablets.replicas() if self.tablets is not None else []:
            runtime = replica.runtime
            leaders += runtime is not None and runtime.role is Role.LEADER
        return [({}, float(leaders))]

    def _server_heartbeats_sent(self) -> list[tuple[dict[str, str], float]]:
        heartbeats = self.server_heartbeats
        return [({}, float(0 if heartbeats is None else heartbeats.sent))]

    def _per_tablet(
        self, read: Callable[[ReplicaStatus], float]
    ) -> list[tuple[dict[str, str], float]]:
        return [({"tablet_id": tablet_id}, float(read(st))) for tablet_id, st in self._statuses()]

    def _statuses(self) -> list[tuple[str, ReplicaStatus]]:
        """Every running replica's consensus status, taken once for the per-tablet gauges of a
        scrape (they are rendered back to back; a status per gauge and replica made a scrape
        of thousands of replicas a long stall of the event loop)."""
        now = time.monotonic()
        snapshot = self._status_snapshot
        if snapshot is not None and now - snapshot[0] < _STATUS_SNAPSHOT_S:
            return snapshot[1]
        statuses = []
        for replica in self.tablets.replicas() if self.tablets is not None else []:
            runtime = replica.runtime
            if runtime is not None:
                statuses.append((replica.tablet_id, runtime.status()))
        self._status_snapshot = (now, statuses)
        return statuses

    def _tablet_counts(self) -> list[tuple[dict[str, str], float]]:
        counts: dict[str, int] = {}
        tablets = self.tablets
        for status in [] if tablets is None else tablets.statuses(sizes=False):
            counts[status.state] = counts.get(status.state, 0) + 1
        return [({"state": state}, float(n)) for state, n in sorted(counts.items())]

    # --- web UI -------------------------------------------------------------------------------

    def _http_routes(self) -> dict[str, Route]:
        return {
            **super()._http_routes(),
            "/tablets": self._tablets,
            "/tablet": self._tablet_page,
        }

    def _role_nav(self) -> list[tuple[str, str]]:
        return list(TSERVER_NAV)

    def _pages(self) -> TabletServerPages:
        assert self.tablets is not None
        failed_after_ms = self.settings.follower_unavailable_considered_failed_sec * 1000
        return TabletServerPages(self.tablets, failed_after_ms)

    def _home_sections(self) -> list[Markup]:
        return self._pages().home_sections()

    def _tablet_link(self, tablet_id: str) -> Cell:
        return tablet_link(tablet_id)

    async def _tablet_page(self, request: HttpRequest) -> HttpResponse:
        assert self.copy is not None
        anchors = self.copy.sessions.anchors_of(request.param("id"))
        return self._pages().tablet(self.frame(), request, anchors)

    async def _tablets(self, request: HttpRequest) -> HttpResponse:
        if not wants_json(request):
            return self._pages().tablets(self.frame())
        body = json.dumps(
            {"server_uuid": self.uuid, "tablets": [r.to_json() for r in self.list_tablets()]},
            indent=1,
        )
        return HttpResponse(200, body.encode() + b"\n", "application/json")
