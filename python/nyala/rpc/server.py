"""The gRPC server of one process: binds the RPC address and serves the registered services."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

import grpc

from nyala.errors import NetworkError
from nyala.rpc.errors import join_host_port, split_host_port
from nyala.rpc.settings import RpcSettings

log = logging.getLogger(__name__)

_Servicer = TypeVar("_Servicer")

#: A method handler as gRPC registers it; its request and response types differ by method.
#: (Quoted: ``grpc.RpcMethodHandler`` is generic only to the type checker.)
_Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"


class RpcServer:
    """A grpc.aio server with nyala's limits; ``start`` binds, ``stop`` drains."""

    def __init__(self, bind: str, settings: RpcSettings) -> None:
        self._host, self._port = split_host_port(bind)
        self._settings = settings
        self._server = grpc.aio.server(options=settings.grpc_options())
        self.port = 0  # the bound port, known after start (differs from bind's port if that is 0)

    def add_service(
        self, add_to_server: Callable[[_Servicer, grpc.aio.Server], None], servicer: _Servicer
    ) -> None:
        """Registers a servicer with its generated ``add_<Service>Servicer_to_server``."""
        add_to_server(servicer, self._server)

    @property
    def address(self) -> str:
        """``host:port`` actually bound (after ``start``)."""
        return join_host_port(self._host, self.port)

    async def start(self) -> None:
        """Binds the address and starts serving; ``NetworkError`` if the bind fails."""
        target = join_host_port(self._host, self._port)
        try:
            self.port = self._server.add_insecure_port(target)
        except RuntimeError as exc:
            raise NetworkError(f"cannot bind RPC address {target}: {exc}") from None
        if self.port == 0:
            raise NetworkError(f"cannot bind RPC address {target}")
        await self._server.start()
        log.info("rpc server listening on %s", self.address)

    async def wait_for_termination(self) -> None:
        """Returns once the server has stopped: the server's task in its owner's TaskGroup."""
        await self._server.wait_for_termination()

    async def stop(self, grace_s: float) -> None:
        """Refuses new calls, lets running ones finish for up to ``grace_s``, then cancels."""
        await self._server.stop(grace_s)
