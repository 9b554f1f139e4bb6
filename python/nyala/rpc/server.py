"""The gRPC server of one process: binds the RPC address and serves the registered services."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypeAlias, TypeVar, cast

import grpc

from nyala.errors import NetworkError
from nyala.rpc.auth import GuardedRegistration, Revocations
from nyala.rpc.credentials import server_credentials
from nyala.rpc.errors import join_host_port, split_host_port
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
            add_to_server(
                servicer, GuardedRegistration(self._server, self._revocations).as_server()
            )

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


class DeserializerOverride:
    """Stands in for the server while a generated ``add_<Service>Servicer_to_server`` runs,
    replacing the request deserializer of the methods named in ``deserializers``, and making
    the methods named in ``serialized_responses`` answer with bytes their handler serialized
    itself (``nyala.rpc.service.unary_serialized``).

    gRPC serves a method through its registered handler when there is one, so replacing it
    there is enough; the generic handler registered next to it keeps the generated
    (de)serializers and is only a fallback, which handlers must also accept.
    """

    def __init__(
        self,
        server: grpc.aio.Server,
        deserializers: dict[str, Callable[[bytes], object]],
        serialized_responses: frozenset[str] = frozenset(),
    ) -> None:
        self._server = server
        self._deserializers = deserializers
        self._serialized_responses = serialized_responses

    def as_server(self) -> grpc.aio.Server:
        """This stand-in, typed as what ``add_<Service>Servicer_to_server`` takes: of a server,
        that function calls only the two methods below."""
        return cast(grpc.aio.Server, self)

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, _Handler]
    ) -> None:
        replaced = {method: self._replace(method, handler) for method, handler in handlers.items()}
        self._server.add_registered_method_handlers(service, replaced)

    def _replace(self, method: str, handler: _Handler) -> _Handler:
        if method in self._deserializers:
            handler = cast(_NamedTupleHandler, handler)._replace(
                request_deserializer=self._deserializers[method]
            )
        if method in self._serialized_responses:
            handler = cast(_NamedTupleHandler, handler)._replace(response_serializer=_identity)
        return handler
