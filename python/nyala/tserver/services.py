"""The RPC services a tablet server answers today: Ping, CreateTablet, DeleteTablet and
ListTablets.

Handlers are thin: they check nothing themselves (``nyala.rpc.service`` checks ``dest_uuid``
and turns exceptions into ``ErrorPB``) and delegate to the server's state; the tablet manager's
blocking disk work runs in a worker thread so the event loop keeps serving. Write, Scan,
consensus and tablet copy methods need the Raft runtime; until it is wired in, gRPC answers
them UNIMPLEMENTED (``NotSupportedError``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from nyala._proto import tserver_admin_pb2, tserver_admin_pb2_grpc, tserver_pb2, tserver_pb2_grpc
from nyala._proto.metadata_pb2 import TabletDataState
from nyala.errors import InvalidArgumentError
from nyala.rpc import RpcMetrics, ServiceBase, unary
from nyala.tablet import DataState, TabletManager
from nyala.tserver.convert import config_from_pb, partition_from_pb, schema_from_pb
from nyala.tserver.tablet_meta import TabletReport


class TabletService(ServiceBase, tserver_pb2_grpc.TabletServiceServicer):  # type: ignore[misc]
    """Client-facing service: liveness today; writes and scans once tablets are hosted."""

    def __init__(self, server_uuid: str, metrics: RpcMetrics, started_s: float) -> None:
        super().__init__(server_uuid, metrics)
        self._started_s = started_s  # time.monotonic() when the server started serving

    @unary(tserver_pb2.PingResponsePB, allow_empty_dest=True)
    async def Ping(self, request: Any, context: Any) -> Any:
        return tserver_pb2.PingResponsePB(
            server_uuid=self.server_uuid, uptime_s=time.monotonic() - self._started_s
        )


class AdminService(ServiceBase, tserver_admin_pb2_grpc.TabletServerAdminServiceServicer):  # type: ignore[misc]
    """Master-facing service: create, tombstone, delete and list replicas."""

    def __init__(
        self,
        server_uuid: str,
        metrics: RpcMetrics,
        tablets: TabletManager,
        list_tablets: Callable[[], list[TabletReport]],
    ) -> None:
        super().__init__(server_uuid, metrics)
        self._tablets = tablets
        self._list_tablets = list_tablets

    @unary(tserver_admin_pb2.CreateTabletResponsePB)
    async def CreateTablet(self, request: Any, context: Any) -> Any:
        if not request.HasField("config") or not request.HasField("schema"):
            raise InvalidArgumentError("CreateTablet needs a schema and the initial config")
        config = config_from_pb(request.config)
        if config.peer(self.server_uuid) is None:
            raise InvalidArgumentError("the initial config does not list this server")
        await asyncio.to_thread(
            self._tablets.create_tablet,
            request.tablet_id,
            table_id=request.table_id,
            table_name=request.table_name,
            schema=schema_from_pb(request.schema),
            partition=partition_from_pb(request.partition),
            config=config,
        )
        return tserver_admin_pb2.CreateTabletResponsePB()

    @unary(tserver_admin_pb2.DeleteTabletResponsePB)
    async def DeleteTablet(self, request: Any, context: Any) -> Any:
        kinds = {
            TabletDataState.TABLET_DATA_TOMBSTONED: DataState.TOMBSTONED,
            TabletDataState.TABLET_DATA_DELETED: DataState.DELETED,
        }
        if request.delete_type not in kinds:
            raise InvalidArgumentError("delete_type must be TOMBSTONED or DELETED")
        cas = (
            request.cas_config_opid_index_less_or_equal
            if request.HasField("cas_config_opid_index_less_or_equal")
            else None
        )
        await asyncio.to_thread(
            self._tablets.delete_tablet,
            request.tablet_id,
            kinds[request.delete_type],
            reason=request.reason,
            cas_config_opid_index_le=cas,
        )
        return tserver_admin_pb2.DeleteTabletResponsePB()

    @unary(tserver_admin_pb2.ListTabletsResponsePB)
    async def ListTablets(self, request: Any, context: Any) -> Any:
        response = tserver_admin_pb2.ListTabletsResponsePB()
        for report in await asyncio.to_thread(self._list_tablets):
            entry = response.status_and_schema.add()
            entry.tablet_status.CopyFrom(report.to_pb())
            schema = report.schema_pb() if request.need_schema_info else None
            if schema is not None:
                entry.schema.CopyFrom(schema)
        return response
