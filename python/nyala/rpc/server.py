"""The gRPC server of one process: binds the RPC address and serves the registered services."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol, TypeAlias, TypeVar, cast

import grpc

from nyala.errors import NetworkError
from nyala.rpc.auth import Revocations, guarded_registration
from nyala.rpc.credentials import server_credentials
from nyala.rpc.errors import join_host_port, split_host_port
from nyala.rpc.registration import HandlerStandIn
from nyala.rpc.settings import RpcSettings

log = logging.getLogger(__name__)

_Servicer = TypeVar("_Servicer")

#: A method handler as gRPC registers it; its request and response types differ by method.
#: (Quoted: ``grpc.RpcMethodHandler`` is generic only to the type checker.)
_Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"


class RpcServer:
    """A grpc.aio server with nyala's limits; ``start`` binds, ``stop`` drains. With
    ``settings.tls`` every connection is mutual TLS and every call is checked against the role
    its method requires (``nyala.rpc.auth``)."""

    def __init__(
        self, bind: str, settings: RpcSettings, revocations: Revocations | None = None
    ) -> None:
        self._host, self._port = split_host_port(bind)
        self._settings = settings
        self._revocations = revocations
        self._server = grpc.aio.server(options=settings.grpc_options())
        self.port = 0  # the bound port, known after start (differs from bind's port if that is 0)

    def add_service(
        self, add_to_server: Callable[[_Servicer, grpc.aio.Server], None], servicer: _Servicer
    ) -> None:
        """Registers a servicer with its generated ``add_<Service>Servicer_to_server``; on a
        secure server every method is guarded by the caller's role (``nyala.rpc.auth``)."""
        if self._settings.tls is None:
            add_to_server(servicer, self._server)
        else:
            add_to_server(servicer, guarded_registration(self._server, self._revocations))

    @property
    def address(self) -> str:
        """``host:port`` actually bound (after ``start``)."""
        return join_host_port(self._host, self.port)

    async def start(self) -> None:
        """Binds the address and starts serving; ``NetworkError`` if the bind fails."""
        target = join_host_port(self._host, self._port)
        tls = self._settings.tls
        try:
            if tls is None:
                self.port = self._server.add_insecure_port(target)
            else:
                self.port = self._server.add_secure_port(target, server_credentials(tls))
        except RuntimeError as exc:
            raise NetworkError(f"cannot bind RPC address {target}: {exc}") from None
        if self.port == 0:
            raise NetworkError(f"cannot bind RPC address {target}")
        await self._server.start()
        log.info(
            "rpc server listening on %s (%s)",
            self.address,
            "plaintext" if tls is None else "mutual TLS",
        )

    async def wait_for_termination(self) -> None:
        """Returns once the server has stopped: the server's task in its owner's TaskGroup."""
        await self._server.wait_for_termination()

    async def stop(self, grace_s: float) -> None:
        """Refuses new calls, lets running ones finish for up to ``grace_s``, then cancels."""
        await self._server.stop(grace_s)


class _NamedTupleHandler(Protocol):
    """A method handler as gRPC makes it: a namedtuple (its declared type says only that it
    has the fields)."""

    def _replace(self, **fields: Callable[..., object] | None) -> _Handler: ...


def _identity(data: bytes) -> bytes:
    return data


def override_serializers(
    server: grpc.aio.Server,
    deserializers: dict[str, Callable[[bytes], object]],
    serialized_responses: frozenset[str] = frozenset(),
) -> grpc.aio.Server:
    """What a service registers with to replace the request deserializer of the methods named
    in ``deserializers``, and to make the methods named in ``serialized_responses`` answer with
    bytes their handler serialized itself (``nyala.rpc.service.unary_serialized``). Only the
    registered handlers change: the generic fallback keeps the generated (de)serializers, which
    handlers must also accept (``nyala.rpc.registration``)."""

    def replace(path: str, handler: _Handler) -> _Handler:
        method = path.rpartition("/")[2]
        if method in deserializers:
            handler = cast(_NamedTupleHandler, handler)._replace(
                request_deserializer=deserializers[method]
            )
        if method in serialized_responses:
            handler = cast(_NamedTupleHandler, handler)._replace(response_serializer=_identity)
        return handler

    return HandlerStandIn(server, replace, generic=False).as_server()
