"""The RPC services a tablet server answers today: Ping and ListTablets.

Handlers are thin: they check nothing themselves (``nyala.rpc.service`` checks ``dest_uuid``
and turns exceptions into ``ErrorPB``) and delegate to the server's state. Services whose
methods need hosted tablets (Write, Scan, CreateTablet, consensus, tablet copy) are added by
the tablet manager; until then gRPC answers them UNIMPLEMENTED (``NotSupportedError``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from nyala._proto import tserver_admin_pb2, tserver_admin_pb2_grpc, tserver_pb2, tserver_pb2_grpc
from nyala.rpc import RpcMetrics, ServiceBase, unary
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
    """Master-facing service: replica listing today; create/delete/alter once tablets exist."""

    def __init__(
        self, server_uuid: str, metrics: RpcMetrics, list_tablets: Callable[[], list[TabletReport]]
    ) -> None:
        super().__init__(server_uuid, metrics)
        self._list_tablets = list_tablets

    @unary(tserver_admin_pb2.ListTabletsResponsePB)
    async def ListTablets(self, request: Any, context: Any) -> Any:
        response = tserver_admin_pb2.ListTabletsResponsePB()
        for report in self._list_tablets():
            response.status_and_schema.add().tablet_status.CopyFrom(report.to_pb())
        return response
