"""The leader master's background tasks: the RPCs that make tservers match the catalog.

After every committed change (and every ``background_task_interval_ms``) the leader looks at
its committed records and sends, with at most one RPC per (kind, tserver, tablet) every
``background_rpc_retry_ms``:

* ``CreateTablet`` to each replica of a CREATING tablet that has not reported it; a tablet
  still without a leader after ``tablet_creation_timeout_ms`` is replaced (the replacement is
  replicated before anything is sent, seed 002 Appendix B), unless a majority of its replicas
  run on live servers: those are electing, and on a busy cluster replacing them only adds
  tablets, copies and elections (the storm a 600-replica load test showed). At most
  ``tablet_replacements_per_pass_max`` are replaced per pass;
* ``AlterSchema`` to the leader of each tablet of an ALTERING table that has not reported the
  table's schema version;
* ``DeleteTablet`` (tombstone) for each queued deletion: replicas of deleted or replaced
  tablets, and replicas evicted from their tablet's config (with a CAS on the config's op index).

All of it is idempotent and driven by committed state plus tablet reports, so a new leader
master simply continues where the old one stopped (the full reports it gets after failover
re-queue what was missed, KUDU-1374).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

from nyala._proto import master_pb2, metadata_pb2, tserver_admin_pb2
from nyala.errors import CasFailedError, NetworkError, NyalaError, TabletNotFoundError
from nyala.master.catalog import TableInfo, TabletInfo
from nyala.master.catalog_manager import CatalogManager
from nyala.master.ddl import TableDdl
from nyala.master.rereplication import Action, PlannedChange, Rereplicator
from nyala.master.sys_catalog import CatalogRecord
from nyala.rpc import ServerProxy
from nyala.rpc.settings import RpcSettings

log = logging.getLogger(__name__)

#: Deadline of one background RPC.
TASK_RPC_TIMEOUT_MS = 10_000
# One RPC to start: its (kind, tserver, tablet) key and the coroutine that sends it.
_Call = tuple[tuple[str, str, str], Awaitable[None]]
_RUNNING_STATES = (metadata_pb2.RUNNING, metadata_pb2.BOOTSTRAPPING, metadata_pb2.NOT_STARTED)
# What the background tasks ask a tablet server's admin service (the method named with it).
_AdminRequest: TypeAlias = (
    tserver_admin_pb2.CreateTabletRequestPB
    | tserver_admin_pb2.AlterSchemaRequestPB
    | tserver_admin_pb2.DeleteTabletRequestPB
)


class BackgroundTasks:
    """Runs on every master; works only while its catalog manager leads."""

    def __init__(self, manager: CatalogManager, rpc_settings: RpcSettings) -> None:
        self._m = manager
        self._ddl = TableDdl(manager)
        self._settings = manager.settings
        self._rpc_settings = rpc_settings
        self._proxies: dict[str, ServerProxy] = {}
        self._sent_s: dict[tuple[str, str, str], float] = {}
        # (kind, tserver, tablet) of RPCs under way: a slow server never gets a second one.
        self._inflight: set[tuple[str, str, str]] = set()
        self._rpcs: asyncio.TaskGroup | None = None
        self.rereplicator = Rereplicator(manager)

    async def run(self) -> None:
        """Runs until cancelled."""
        interval_s = self._settings.background_task_interval_ms / 1000
        try:
            # RPCs run as tasks of this group, so one slow tserver never stalls a pass.
            async with asyncio.TaskGroup() as rpcs:
                self._rpcs = rpcs
                await self._passes(interval_s)
        finally:
            self._rpcs = None
            for proxy in self._proxies.values():
                with contextlib.suppress(Exception):
                    await proxy.close()

    async def _passes(self, interval_s: float) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):
                    await self._m.wake.wait()
            self._m.wake.clear()
            if not self._m.is_ready_leader():
                self._sent_s.clear()
                continue
            try:
                await self.run_once()
            except NyalaError as exc:
                log.info("background tasks: %s", exc)

    async def run_once(self) -> None:
        """One pass over the catalog."""
        if self._m.secure:
            await self._rotate_token_keys()
            await self._store_ca()
        catalog = self._m.catalog
        now_us = time.time_ns() // 1000
        timeout_us = self._settings.tablet_creation_timeout_ms * 1000
        calls: list[_Call] = []
        replacements_left = self._settings.tablet_replacements_per_pass_max
        for tablet in list(catalog.tablets_by_id.values()):
            if tablet.pb.state != master_pb2.SYS_TABLET_CREATING:
                continue
            timed_out = now_us - tablet.pb.create_time_us > timeout_us
            if timed_out and not self._electing(tablet):
                if replacements_left > 0:
                    replacements_left -= 1
                    await self._ddl.replace_tablet(tablet.tablet_id)
                continue
            table = catalog.tables_by_id.get(tablet.pb.table_id)
            if table is not None:
                calls.extend(self._create_calls(table, tablet))
        for table in catalog.live_tables():
            if table.pb.state == master_pb2.SYS_TABLE_ALTERING:
                calls.extend(self._alter_calls(table))
        calls.extend(self._delete_calls())
        calls.extend(self._config_calls())
        for key, call in calls:
            self._start(key, call)

    async def _rotate_token_keys(self) -> None:
        """Makes the next token-signing key when it is due (``nyala.master.token_keys``)."""
        record = self._m.token_keys.due(int(time.time() * 1000))
        if record is not None:
            await self._replicate_one(CatalogRecord.tsk(record), self._m.token_keys.commit)
            log.info(
                "token-signing key %d made; it signs from Unix ms %d",
                record.key_seq,
                record.activate_unix_ms,
            )

    async def _store_ca(self) -> None:
        """Stores the cluster CA in the sys catalog once (``SysCaEntryPB``)."""
        record = self._m.ca_record_due()
        if record is not None:
            await self._replicate_one(CatalogRecord.ca(record), self._m.set_ca_record)
            log.info(
                "stored the cluster CA in the sys catalog (%s)",
                "with its key encrypted" if record.encrypted_key_pem else "certificate only",
            )

    async def _replicate_one(self, record: CatalogRecord, commit: Callable[[Any], None]) -> None:
        """Replicates one record as the leader, then ``commit``s its message in memory."""
        async with self._m.lock:
            self._m.require_leader()
            await self._m.replicate([record])
            commit(record.metadata)

    def _electing(self, tablet: TabletInfo) -> bool:
        """A majority of the tablet's replicas report a running replica from a live server:
        they only need time to elect a leader, not to be replaced."""
        reports = self._m.reports.get(tablet.tablet_id, {})
        config = tablet.pb.consensus_state.committed_config
        running = 0
        for peer in config.peers:
            reported = reports.get(peer.permanent_uuid)
            ts = self._m.ts_manager.get(peer.permanent_uuid)
            if (
                reported is not None
                and reported.state in _RUNNING_STATES
                and ts is not None
                and self._m.ts_manager.is_live(ts)
            ):
                running += 1
        voters = sum(1 for p in config.peers if p.member_type == metadata_pb2.VOTER)
        return running >= voters // 2 + 1

    def _start(self, key: tuple[str, str, str], call: Awaitable[None]) -> None:
        rpcs = self._rpcs
        assert rpcs is not None, "passes run inside run()"
        self._inflight.add(key)

        async def tracked() -> None:
            try:
                await call
            except Exception:  # a bug in one RPC must not stop the background tasks
                log.exception("background %s of %s on %s failed", key[0], key[2], key[1])
            finally:
                self._inflight.discard(key)

        rpcs.create_task(tracked(), name=f"{key[0]}-{key[2]}")

    def _due(self, kind: str, ts_uuid: str, tablet_id: str) -> bool:
        key = (kind, ts_uuid, tablet_id)
        now = time.monotonic()
        if key in self._inflight:
            return False
        if now - self._sent_s.get(key, -1e9) < self._settings.background_rpc_retry_ms / 1000:
            return False
        self._sent_s[key] = now
        return True

    def _proxy(self, ts_uuid: str) -> ServerProxy | None:
        ts = self._m.ts_manager.get(ts_uuid)
        if ts is None:
            return None
        proxy = self._proxies.get(ts.rpc_addr)
        if proxy is None:
            proxy = self._proxies[ts.rpc_addr] = ServerProxy(ts.rpc_addr, self._rpc_settings)
        return proxy

    def _create_calls(self, table: TableInfo, tablet: TabletInfo) -> list[_Call]:
        reports = self._m.reports.get(tablet.tablet_id, {})
        calls: list[_Call] = []
        config = tablet.pb.consensus_state.committed_config
        for peer in config.peers:
            reported = reports.get(peer.permanent_uuid)
            if reported is not None and reported.state in _RUNNING_STATES:
                continue
            if not self._due("create", peer.permanent_uuid, tablet.tablet_id):
                continue
            request = tserver_admin_pb2.CreateTabletRequestPB(
                dest_uuid=peer.permanent_uuid,
                table_id=table.table_id,
                table_name=table.name,
                tablet_id=tablet.tablet_id,
                schema=table.pb.schema,
                partition_schema=table.pb.partition_schema,
                partition=tablet.pb.partition,
                config=config,
            )
            key = ("create", peer.permanent_uuid, tablet.tablet_id)
            calls.append((key, self._send("CreateTablet", peer.permanent_uuid, request)))
        return calls

    def _alter_calls(self, table: TableInfo) -> list[_Call]:
        version = table.pb.schema.version
        calls: list[_Call] = []
        for tablet in table.live_tablets():
            leader = tablet.pb.consensus_state.leader_uuid
            if tablet.pb.reported_schema_version >= version or not leader:
                continue
            if not self._due("alter", leader, tablet.tablet_id):
                continue
            request = tserver_admin_pb2.AlterSchemaRequestPB(
                dest_uuid=leader,
                tablet_id=tablet.tablet_id,
                schema=table.pb.schema,
                new_table_name=table.name,
            )
            calls.append(
                (("alter", leader, tablet.tablet_id), self._send("AlterSchema", leader, request))
            )
        return calls

    def _delete_calls(self) -> list[_Call]:
        calls: list[_Call] = []
        for (ts_uuid, tablet_id), cas in list(self._m.pending_deletes.items()):
            if not self._due("delete", ts_uuid, tablet_id):
                continue
            request = tserver_admin_pb2.DeleteTabletRequestPB(
                dest_uuid=ts_uuid,
                tablet_id=tablet_id,
                delete_type=metadata_pb2.TABLET_DATA_TOMBSTONED,
                reason="deleted by the master",
            )
            if cas is not None:
                request.cas_config_opid_index_less_or_equal = cas
            calls.append(
                (("delete", ts_uuid, tablet_id), self._delete(ts_uuid, tablet_id, request))
            )
        return calls

    def _config_calls(self) -> list[_Call]:
        """Re-replication (``nyala.master.rereplication``): one change per tablet leader."""
        calls: list[_Call] = []
        for change in self.rereplicator.plan():
            if not self._due("config", change.leader_uuid, change.tablet_id):
                continue
            key = ("config", change.leader_uuid, change.tablet_id)
            calls.append((key, self._change_config(change)))
        return calls

    async def _change_config(self, change: PlannedChange) -> None:
        proxy = self._proxy(change.leader_uuid)
        if proxy is None:
            return
        d = change.decision
        method = "LeaderStepDown" if d.action is Action.STEP_DOWN else "ChangeConfig"
        log.info("tablet %s: %s %s (%s)", change.tablet_id, d.action.value, d.uuid, d.reason)
        try:
            await proxy.admin_call(
                getattr(proxy.consensus, method), change.request, timeout_ms=TASK_RPC_TIMEOUT_MS
            )
        except NyalaError as exc:
            log.info(
                "%s of tablet %s failed (next pass decides again): %s",
                method,
                change.tablet_id,
                exc,
            )

    async def _delete(
        self, ts_uuid: str, tablet_id: str, request: tserver_admin_pb2.DeleteTabletRequestPB
    ) -> None:
        try:
            await self._call("DeleteTablet", ts_uuid, request)
        except (TabletNotFoundError, CasFailedError) as exc:
            log.info("tombstone of %s on %s not needed: %s", tablet_id, ts_uuid, exc)
        except NyalaError as exc:
            log.info("DeleteTablet %s on %s failed (will retry): %s", tablet_id, ts_uuid, exc)
            return
        self._m.pending_deletes.pop((ts_uuid, tablet_id), None)

    async def _send(self, method: str, ts_uuid: str, request: _AdminRequest) -> None:
        try:
            await self._call(method, ts_uuid, request)
        except NyalaError as exc:
            log.info("%s %s on %s failed (will retry): %s", method, request.tablet_id, ts_uuid, exc)

    async def _call(self, method: str, ts_uuid: str, request: _AdminRequest) -> None:
        proxy = self._proxy(ts_uuid)
        if proxy is None:
            return
        try:
            await proxy.admin_call(
                getattr(proxy.admin, method), request, timeout_ms=TASK_RPC_TIMEOUT_MS
            )
        except NetworkError:
            # A fresh channel next time: gRPC's reconnect back-off would delay a restarted
            # tserver's work by many seconds.
            if self._proxies.get(proxy.addr) is proxy:
                del self._proxies[proxy.addr]
                await proxy.close()
            raise
