"""Client side of the RPC layer: one channel per server, a deadline on every call.

``ServerProxy`` (asyncio) and ``BlockingServerProxy`` (threads, tools, tests) expose the same
stubs; both raise ``nyala.errors`` exceptions for a failed call, whether the server answered
with an ``ErrorPB`` or the transport failed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from nyala._proto import (
    consensus_pb2,
    consensus_pb2_grpc,
    master_pb2_grpc,
    tablet_copy_pb2_grpc,
    tserver_admin_pb2_grpc,
    tserver_pb2,
    tserver_pb2_grpc,
)
from nyala.rpc.errors import error_from_grpc, raise_for_response, split_host_port
from nyala.rpc.settings import RpcSettings


class _Stubs:
    """The generated stubs of every service, over one channel."""

    def __init__(self, channel: Any) -> None:
        self.tablet = tserver_pb2_grpc.TabletServiceStub(channel)
        self.admin = tserver_admin_pb2_grpc.TabletServerAdminServiceStub(channel)
        self.consensus = consensus_pb2_grpc.ConsensusServiceStub(channel)
        self.tablet_copy = tablet_copy_pb2_grpc.TabletCopyServiceStub(channel)
        self.master = master_pb2_grpc.MasterServiceStub(channel)
        # UpdateConsensusStream taking requests already serialized
        # (``nyala.consensus.runtime.wire.append_request_to_wire``): the entries are copied once.
        self.consensus_stream_serialized = channel.stream_stream(
            _method_path(consensus_pb2, "ConsensusService", "UpdateConsensusStream"),
            request_serializer=None,
            response_deserializer=consensus_pb2.ConsensusResponsePB.FromString,
        )


def _method_path(module: Any, service: str, method: str) -> str:
    """The gRPC path of ``service.method`` as declared in the proto ``module``."""
    full_name = module.DESCRIPTOR.services_by_name[service].methods_by_name[method].full_name
    package_service, _, name = full_name.rpartition(".")
    return f"/{package_service}/{name}"


class ServerProxy(_Stubs):
    """An asyncio channel to one server. Use as ``async with``, or call ``close``."""

    def __init__(self, addr: str, settings: RpcSettings | None = None) -> None:
        split_host_port(addr)  # validate early: a typo is an InvalidArgumentError here
        self.addr = addr
        self.settings = settings or RpcSettings()
        self._channel: Any = grpc.aio.insecure_channel(addr, options=self.settings.grpc_options())
        super().__init__(self._channel)

    async def __aenter__(self) -> ServerProxy:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def call(self, method: Any, request: Any, *, timeout_ms: int | None = None) -> Any:
        """A unary call with the client deadline (default ``settings.client_timeout_ms``)."""
        return await self._unary(method, request, timeout_ms or self.settings.client_timeout_ms)

    async def admin_call(self, method: Any, request: Any, *, timeout_ms: int | None = None) -> Any:
        """A unary call with the admin deadline (default ``settings.admin_timeout_ms``)."""
        return await self._unary(method, request, timeout_ms or self.settings.admin_timeout_ms)

    async def stream(
        self, method: Any, request: Any, *, timeout_ms: int | None = None
    ) -> AsyncIterator[Any]:
        """A server-streaming call; the deadline covers the whole stream."""
        timeout_s = (timeout_ms or self.settings.client_timeout_ms) / 1000
        try:
            async for response in method(request, timeout=timeout_s):
                yield raise_for_response(response)
        except grpc.RpcError as err:
            raise error_from_grpc(err, target=self.addr) from None

    def open_stream(self, method: Any, *, timeout_ms: int) -> Any:
        """A bidirectional stream (``call.write``/``call.read``) with a deadline for its whole
        life; the caller translates ``grpc.RpcError`` with ``nyala.rpc.errors.error_from_grpc``
        and checks each response with ``raise_for_response``.
        """
        return method(timeout=timeout_ms / 1000)

    async def ping(self, dest_uuid: str = "", *, timeout_ms: int | None = None) -> Any:
        """The server's ``PingResponsePB`` (an empty ``dest_uuid`` asks whoever is there)."""
        request = tserver_pb2.PingRequestPB(dest_uuid=dest_uuid)
        return await self.call(self.tablet.Ping, request, timeout_ms=timeout_ms)

    async def _unary(self, method: Any, request: Any, timeout_ms: int) -> Any:
        try:
            response = await method(request, timeout=timeout_ms / 1000)
        except grpc.RpcError as err:
            raise error_from_grpc(err, target=self.addr) from None
        return raise_for_response(response)


class BlockingServerProxy(_Stubs):
    """A blocking channel to one server, for tools and tests. Use as ``with``."""

    def __init__(self, addr: str, settings: RpcSettings | None = None) -> None:
        split_host_port(addr)
        self.addr = addr
        self.settings = settings or RpcSettings()
        self._channel: Any = grpc.insecure_channel(addr, options=self.settings.grpc_options())
        super().__init__(self._channel)

    def __enter__(self) -> BlockingServerProxy:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def call(self, method: Any, request: Any, *, timeout_ms: int | None = None) -> Any:
        """A unary call with the client deadline (default ``settings.client_timeout_ms``)."""
        return self._unary(method, request, timeout_ms or self.settings.client_timeout_ms)

    def admin_call(self, method: Any, request: Any, *, timeout_ms: int | None = None) -> Any:
        """A unary call with the admin deadline (default ``settings.admin_timeout_ms``)."""
        return self._unary(method, request, timeout_ms or self.settings.admin_timeout_ms)

    def ping(self, dest_uuid: str = "", *, timeout_ms: int | None = None) -> Any:
        """The server's ``PingResponsePB`` (an empty ``dest_uuid`` asks whoever is there)."""
        request = tserver_pb2.PingRequestPB(dest_uuid=dest_uuid)
        return self.call(self.tablet.Ping, request, timeout_ms=timeout_ms)

    def _unary(self, method: Any, request: Any, timeout_ms: int) -> Any:
        try:
            response = method(request, timeout=timeout_ms / 1000)
        except grpc.RpcError as err:
            raise error_from_grpc(err, target=self.addr) from None
        return raise_for_response(response)
