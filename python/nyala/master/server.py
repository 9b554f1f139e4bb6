"""The master process: one asyncio event loop, one TaskGroup, RPC and HTTP servers.

Start-up order: open the fs root; if the sys-catalog replica exists, refuse to start unless
``--masters`` names exactly its config's masters; bind RPC (other masters ask this one for its
UUID while the catalog forms) and HTTP; then find the initial config if the replica is new
(``nyala.master.formation``), create it, and run its Raft. The catalog manager loads the
catalog whenever this master wins an election; the background tasks work while it leads.
SIGTERM or SIGINT shuts down gracefully (exit code 0).

The sys catalog is a tablet like any other on disk: its MemRowSet is flushed every
``flush_interval_ms`` and its WAL GC'd below the flush every ``wal_gc_interval_ms``, so a
master's disk stays bounded however many DDL operations and leader changes it records. A master
added after the WAL it would need to catch up is gone gets the sys catalog by tablet copy from
the leader (``nyala.server.tablet_copy``: the leader's Raft asks for it, as a tablet leader
does for a tserver replica), and then catches up from the leader's log.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

from nyala._proto import master_pb2, master_pb2_grpc
from nyala.errors import IllegalStateError
from nyala.master.background_tasks import BackgroundTasks
from nyala.master.catalog_manager import CatalogManager
from nyala.master.formation import check_masters_match, discover_config, own_address
from nyala.master.settings import MasterSettings
from nyala.master.sys_catalog import SysCatalog
from nyala.master.ts_manager import TSManager
from nyala.master.web_ui import MASTER_NAV, MasterPages
from nyala.rpc import HttpResponse, HttpServer, RpcServer
from nyala.rpc.http import HttpRequest, Route
from nyala.server.base import ServerBase
from nyala.server.consensus_service import ConsensusService, add_consensus_service
from nyala.server.security import ca_passphrase, http_authorizer, http_tls, prepare_master
from nyala.server.tablet_copy import TabletCopy, add_tablet_copy_service
from nyala.server.web_ui import Markup, wants_json
from nyala.tablet.replica import TabletReplica, TabletState

log = logging.getLogger(__name__)


class MasterServer(ServerBase):
    """One master. ``run`` serves until ``request_stop`` (or a signal)."""

    REPLICA_FAILURE_STOPS_SERVER = True
    ROLE = "master"

    def __init__(self, settings: MasterSettings) -> None:
        super().__init__(settings)
        self.settings = settings
        self.manager: CatalogManager | None = None
        self._own_addr = ""
        self._tasks: asyncio.TaskGroup | None = None
        self._workers: list[asyncio.Task[None]] = []

    async def run(self) -> None:
        """Opens the fs root, serves until stopped, shuts down gracefully."""
        masters = self.settings.master_addrs
        self._own_addr = own_address(self.settings.rpc_bind, masters)
        tablets = self._open_fs_and_tablets()
        try:
            ca = await prepare_master(self.settings, self.uuid, self._own_addr)
            security_dir = Path(self.settings.security_dir) if self.settings.security_dir else None
            sys_catalog = SysCatalog(tablets, self.settings.catalog_write_timeout_ms)
            self._check_existing(sys_catalog)
            self.manager = CatalogManager(
                self.uuid,
                sys_catalog,
                TSManager(self.settings.tserver_unresponsive_timeout_ms),
                self.settings,
                secure=bool(self.settings.security_dir),
                ca=ca,
                security_dir=security_dir,
                ca_passphrase=ca_passphrase(self.settings),
            )
            self._register_metrics()
            self.copy = TabletCopy(
                self.uuid,
                self.settings,
                tablets,
                start_replica=self._start_replica,
                stop_replica=self._stop_replica,
            )
            await self._serve(sys_catalog)
        finally:
            self._close_fs_and_tablets()
        log.info("master %s stopped", self.uuid)

    def _check_existing(self, sys_catalog: SysCatalog) -> None:
        replica = sys_catalog.replica
        if replica is None:
            return
        if replica.state is TabletState.FAILED:
            raise IllegalStateError(f"the sys catalog replica failed: {replica.state_reason}")
        config = sys_catalog.committed_config()
        assert config is not None
        check_masters_match(config, self.settings.master_addrs)

    async def _serve(self, sys_catalog: SysCatalog) -> None:
        assert self.manager is not None
        rpc = self._build_rpc_server()
        assert self.copy is not None
        http = HttpServer(
            self.settings.http_bind,
            self._http_routes(),
            self.copy.http_post_routes(self.frame),
            tls=http_tls(self.settings),
            authorize=http_authorizer(self.manager.revocations) if self.manager.secure else None,
        )
        # The peer channel first: a peer that asks GetPeerChannel as soon as the RPC port
        # answers learns its port, not that there is none (it would then keep to the gRPC
        # stream for that stream's whole life).
        assert self._consensus is not None
        await self._start_peer_channel(self._consensus)
        try:
            await self._start_listening(rpc, http)
        except BaseException:
            self._close_peer_channel()
            raise
        log.info("master %s ready: rpc %s, http %s", self.uuid, rpc.address, http.address)
        background = BackgroundTasks(self.manager, self.settings.rpc_settings())
        async with asyncio.TaskGroup() as tasks:
            self._tasks = tasks
            tasks.create_task(rpc.wait_for_termination(), name="rpc-server")
            tasks.create_task(http.wait_closed(), name="http-server")
            tasks.create_task(self._shutdown_when_stopped(rpc, http), name="shutdown")
            self._start_peer_streams(tasks)
            self._workers = [
                tasks.create_task(self._start_sys_catalog(sys_catalog), name="sys-catalog"),
                tasks.create_task(self.manager.run(), name="catalog-manager"),
                tasks.create_task(background.run(), name="background-tasks"),
                tasks.create_task(self._flush_loop(), name="flush"),
                tasks.create_task(self._quarantine_loop(), name="quarantine"),
            ]
            assert self.copy is not None
            self._workers += self.copy.start(tasks)

    async def _start_sys_catalog(self, sys_catalog: SysCatalog) -> None:
        replica = sys_catalog.replica
        if replica is None:
            config = await discover_config(
                self.uuid,
                self._own_addr,
                self.settings.master_addrs,
                self.settings.rpc_settings(),
                self.settings.master_discovery_timeout_ms,
            )
            log.info("creating the sys catalog with config %s", [p.address for p in config.peers])
            replica = await asyncio.to_thread(sys_catalog.create, config)
        self._start_replica(replica)

    def _start_replica(self, replica: TabletReplica) -> None:
        """Runs the sys catalog's Raft (at start, and after a tablet copy replaced it)."""
        assert self._tasks is not None
        if replica.runtime is not None or replica.storage is None:
            return
        self._start_consensus(replica, self._tasks)
        if self.copy is not None:
            self.copy.hook_replica(replica)  # a new master far behind gets a tablet copy

    async def _stop_replica(self, tablet_id: str) -> None:
        """Stops the sys catalog's Raft before a tablet copy replaces it."""
        assert self.tablets is not None
        replica = self.tablets.lookup(tablet_id)
        if replica is not None:
            await replica.stop_consensus()

    def _build_rpc_server(self) -> RpcServer:
        assert self.tablets is not None
        assert self.manager is not None
        # Imported here: the service module imports membership, which imports the rpc proxies.
        from nyala.master.service import MasterService

        server = RpcServer(
            self.settings.rpc_bind, self.settings.rpc_settings(), self.manager.revocations
        )
        server.add_service(
            master_pb2_grpc.add_MasterServiceServicer_to_server,
            MasterService(self.uuid, self._rpc_metrics, self.manager),
        )
        self._consensus = ConsensusService(
            self.uuid,
            self._rpc_metrics,
            self.tablets,
            lambda: self.peer_streams,
            peer_channel_port=self.peer_channel_port,
        )
        server.add_service(add_consensus_service, self._consensus)
        assert self.copy is not None
        server.add_service(add_tablet_copy_service, self.copy.service(self._rpc_metrics))
        return server

    async def _shutdown_when_stopped(self, rpc: RpcServer, http: HttpServer) -> None:
        await self._stop_listening(rpc, http)
        for worker in self._workers:
            worker.cancel()
        if self.copy is not None:
            await self.copy.close()
        assert self.tablets is not None
        for replica in self.tablets.replicas():
            await replica.stop_consensus()
        self._cancel_base_tasks()
        self._tasks = None

    # --- HTTP -------------------------------------------------------------------------------

    def _register_metrics(self) -> None:
        self._register_server_metrics()
        self.metrics.gauge(
            "nyala_master_is_leader", "1 if this master leads with its catalog loaded"
        ).set_callback(self._is_leader_gauge)
        self.metrics.gauge(
            "nyala_master_live_tservers", "Tablet servers heard from recently"
        ).set_callback(self._live_tservers_gauge)

    def _is_leader_gauge(self) -> list[tuple[dict[str, str], float]]:
        ready = self.manager is not None and self.manager.is_ready_leader()
        return [({}, 1.0 if ready else 0.0)]

    def _live_tservers_gauge(self) -> list[tuple[dict[str, str], float]]:
        count = 0 if self.manager is None else len(self.manager.ts_manager.live())
        return [({}, float(count))]

    def _http_routes(self) -> dict[str, Route]:
        return {
            **super()._http_routes(),
            "/masters": self._masters_page,
            "/tables": self._tables_page,
            "/table": self._table_page,
            "/tablet-servers": self._tservers_page,
        }

    def _role_nav(self) -> list[tuple[str, str]]:
        return list(MASTER_NAV)

    def _pages(self) -> MasterPages:
        assert self.manager is not None
        return MasterPages(self.manager)

    def _home_sections(self) -> list[Markup]:
        return self._pages().home_sections()

    @staticmethod
    def _json(doc: object) -> HttpResponse:
        return HttpResponse(200, json.dumps(doc, indent=1).encode() + b"\n", "application/json")

    async def _table_page(self, request: HttpRequest) -> HttpResponse:
        return self._pages().table(self.frame(), request)

    async def _masters_page(self, request: HttpRequest) -> HttpResponse:
        assert self.manager is not None
        if not wants_json(request):
            return self._pages().masters(self.frame())
        masters = [
            {
                "uuid": e.permanent_uuid,
                "rpc_addr": f"{e.rpc_addr.host}:{e.rpc_addr.port}",
                "role": master_pb2.RaftRole.Name(e.role),
                "member_type": "VOTER" if e.member_type == 1 else "NON_VOTER",
            }
            for e in self.manager.master_entries()
        ]
        return self._json({"server_uuid": self.uuid, "masters": masters})

    async def _tables_page(self, request: HttpRequest) -> HttpResponse:
        assert self.manager is not None
        if not wants_json(request):
            return self._pages().tables(self.frame())
        if not self.manager.is_ready_leader():
            return self._json({"server_uuid": self.uuid, "leader": False, "tables": []})
        tables = [
            {
                "id": t.table_id,
                "name": t.name,
                "state": master_pb2.SysTableState.Name(t.pb.state),
                "schema_version": t.pb.schema.version,
                "num_replicas": t.pb.num_replicas,
                "tablets": [tablet.tablet_id for tablet in t.live_tablets()],
            }
            for t in self.manager.catalog.live_tables()
        ]
        return self._json({"server_uuid": self.uuid, "leader": True, "tables": tables})

    async def _tservers_page(self, request: HttpRequest) -> HttpResponse:
        assert self.manager is not None
        if not wants_json(request):
            return self._pages().tablet_servers(self.frame())
        ts_manager = self.manager.ts_manager
        servers = [
            {
                "uuid": ts.uuid,
                "rpc_addr": ts.rpc_addr,
                "http_addr": ts.http_addr,
                "millis_since_heartbeat": ts.millis_since_heartbeat(),
                "live": ts_manager.is_live(ts),
                "state": ts_manager.state(ts),
            }
            for ts in ts_manager.all()
        ]
        return self._json({"server_uuid": self.uuid, "tablet_servers": servers})
