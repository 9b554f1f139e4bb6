"""Client side of the RPC layer: one channel per server, a deadline on every call.

``ServerProxy`` (asyncio) and ``BlockingServerProxy`` (threads, tools, tests) expose the same
stubs; both raise ``nyala.errors`` exceptions for a failed call, whether the server answered
with an ``ErrorPB`` or the transport failed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TypeAlias, TypeVar

import grpc
from google.protobuf.descriptor import FileDescriptor

from nyala._proto import (
    consensus_pb2_grpc,
    master_pb2_grpc,
    tablet_copy_pb2,
    tablet_copy_pb2_grpc,
    tserver_admin_pb2_grpc,
    tserver_pb2,
    tserver_pb2_grpc,
)
from nyala.rpc.credentials import channel_credentials, uuid_binding_option
from nyala.rpc.errors import error_from_grpc, raise_for_response, split_host_port
from nyala.rpc.messages import Answer
from nyala.rpc.settings import RpcSettings, tool_settings

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp", bound=Answer)
# A unary method of an asyncio stub and of a blocking one (``proxy.tablet.Write``). Quoted:
# grpc's classes are generic only to the type checker.
_AsyncUnary: TypeAlias = "grpc.aio.UnaryUnaryMultiCallable[_Req, _Resp]"
_Unary: TypeAlias = "grpc.UnaryUnaryMultiCallable[_Req, _Resp]"


def _method_path(file: FileDescriptor, service: str, method: str) -> str:
    """The gRPC path of ``service.method`` as declared in the proto ``file``."""
    full_name = file.services_by_name[service].methods_by_name[method].full_name
    package_service, _, name = full_name.rpartition(".")
    return f"/{package_service}/{name}"


#: The gRPC path of FetchData, whose answers ``fetch_data_serialized`` hands over unparsed: the
#: tablet copy target takes the chunk's bytes from them without a copy.
_FETCH_DATA = _method_path(tablet_copy_pb2.DESCRIPTOR, "TabletCopyService", "FetchData")


def open_channel(
    addr: str, settings: RpcSettings, server_uuid: str | None = None
) -> grpc.aio.Channel:
    """An asyncio channel to ``addr``: TLS when ``settings.tls`` is set, checking the server's
    certificate names ``server_uuid`` when given (else the host dialled)."""
    options = settings.grpc_options()
    if settings.tls is None:
        return grpc.aio.insecure_channel(addr, options=options)
    if server_uuid:
        options.append(uuid_binding_option(server_uuid))
    return grpc.aio.secure_channel(addr, channel_credentials(settings.tls), options=options)


def open_blocking_channel(
    addr: str, settings: RpcSettings, server_uuid: str | None = None
) -> grpc.Channel:
    """A blocking channel to ``addr``, secured as ``open_channel`` says."""
    options = settings.grpc_options()
    if settings.tls is None:
        return grpc.insecure_channel(addr, options=options)
    if server_uuid:
        options.append(uuid_binding_option(server_uuid))
    return grpc.secure_channel(addr, channel_credentials(settings.tls), options=options)


class _Stubs:
    """The generated stubs of every service, over one channel: blocking stubs over a blocking
    channel, asyncio ones over an asyncio channel (``ServerProxy`` declares their types)."""

    def __init__(self, channel: grpc.Channel | grpc.aio.Channel) -> None:
        self.tablet = tserver_pb2_grpc.TabletServiceStub(channel)
        self.admin = tserver_admin_pb2_grpc.TabletServerAdminServiceStub(channel)
        self.consensus = consensus_pb2_grpc.ConsensusServiceStub(channel)
        self.tablet_copy = tablet_copy_pb2_grpc.TabletCopyServiceStub(channel)
        self.master = master_pb2_grpc.MasterServiceStub(channel)


class ServerProxy(_Stubs):
    """An asyncio channel to one server, with the generated stubs of every service over it. Use
    as ``async with``, or call ``close``."""

    # What the generated stubs are over an asyncio channel.
    tablet: tserver_pb2_grpc.TabletServiceAsyncStub
    admin: tserver_admin_pb2_grpc.TabletServerAdminServiceAsyncStub
    consensus: consensus_pb2_grpc.ConsensusServiceAsyncStub
    tablet_copy: tablet_copy_pb2_grpc.TabletCopyServiceAsyncStub
    master: master_pb2_grpc.MasterServiceAsyncStub

    def __init__(
        self, addr: str, settings: RpcSettings | None = None, *, server_uuid: str | None = None
    ) -> None:
        split_host_port(addr)  # validate early: a typo is an InvalidArgumentError here
        self.addr = addr
        self.settings = settings or tool_settings()
        channel = open_channel(addr, self.settings, server_uuid)
        self._channel = channel
        super().__init__(channel)
        self.fetch_data_serialized: grpc.aio.UnaryUnaryMultiCallable[
            tablet_copy_pb2.FetchDataRequestPB, bytes
        ] = channel.unary_unary(
            _FETCH_DATA,
            request_serializer=tablet_copy_pb2.FetchDataRequestPB.SerializeToString,
            response_deserializer=None,
        )

    async def __aenter__(self) -> ServerProxy:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def call(
        self, method: _AsyncUnary[_Req, _Resp], request: _Req, *, timeout_ms: int | None = None
    ) -> _Resp:
        """A unary call with the client deadline (default ``settings.client_timeout_ms``)."""
        return await self._unary(method, request, timeout_ms or self.settings.client_timeout_ms)

    async def admin_call(
        self, method: _AsyncUnary[_Req, _Resp], request: _Req, *, timeout_ms: int | None = None
    ) -> _Resp:
        """A unary call with the admin deadline (default ``settings.admin_timeout_ms``)."""
        return await self._unary(method, request, timeout_ms or self.settings.admin_timeout_ms)

    async def call_serialized(
        self, method: grpc.aio.UnaryUnaryMultiCallable[_Req, bytes], request: _Req, timeout_ms: int
    ) -> bytes:
        """A unary call whose answer comes back serialized (the caller parses it and checks
        its ``error``); transport failures raise as in ``call``."""
        try:
            return await method(request, timeout=timeout_ms / 1000)
        except grpc.RpcError as err:
            raise error_from_grpc(err, target=self.addr) from None

    async def stream(
        self,
        method: grpc.aio.UnaryStreamMultiCallable[_Req, _Resp],
        request: _Req,
        *,
        timeout_ms: int | None = None,
    ) -> AsyncIterator[_Resp]:
        """A server-streaming call; the deadline covers the whole stream."""
        timeout_s = (timeout_ms or self.settings.client_timeout_ms) / 1000
        try:
            async for response in method(request, timeout=timeout_s):
                yield raise_for_response(response)
        except grpc.RpcError as err:
            raise error_from_grpc(err, target=self.addr) from None

    def open_stream(
        self, method: grpc.aio.StreamStreamMultiCallable[_Req, _Resp], *, timeout_ms: int
    ) -> grpc.aio.StreamStreamCall[_Req, _Resp]:
        """A bidirectional stream (``call.write``/``call.read``) with a deadline for its whole
        life; the caller translates ``grpc.RpcError`` with ``nyala.rpc.errors.error_from_grpc``
        and checks each response with ``raise_for_response``.
        """
        return method(timeout=timeout_ms / 1000)

    async def ping(
        self, dest_uuid: str = "", *, timeout_ms: int | None = None
    ) -> tserver_pb2.PingResponsePB:
        """The server's ``PingResponsePB`` (an empty ``dest_uuid`` asks whoever is there)."""
        request = tserver_pb2.PingRequestPB(dest_uuid=dest_uuid)
        return await self.call(self.tablet.Ping, request, timeout_ms=timeout_ms)

    async def _unary(
        self, method: _AsyncUnary[_Req, _Resp], request: _Req, timeout_ms: int
    ) -> _Resp:
        try:
            response = await method(request, timeout=timeout_ms / 1000)
        except grpc.RpcError as err:
            raise error_from_grpc(err, target=self.addr) from None
        return raise_for_response(response)


class BlockingServerProxy(_Stubs):
    """A blocking channel to one server, with the generated stubs of every service over it, for
    tools and tests. Use as ``with``."""

    def __init__(
        self, addr: str, settings: RpcSettings | None = None, *, server_uuid: str | None = None
    ) -> None:
        split_host_port(addr)
        self.addr = addr
        self.settings = settings or tool_settings()
        channel = open_blocking_channel(addr, self.settings, server_uuid)
        self._channel = channel
        super().__init__(channel)

    def __enter__(self) -> BlockingServerProxy:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def call(
        self, method: _Unary[_Req, _Resp], request: _Req, *, timeout_ms: int | None = None
    ) -> _Resp:
        """A unary call with the client deadline (default ``settings.client_timeout_ms``)."""
        return self._unary(method, request, timeout_ms or self.settings.client_timeout_ms)

    def admin_call(
        self, method: _Unary[_Req, _Resp], request: _Req, *, timeout_ms: int | None = None
    ) -> _Resp:
        """A unary call with the admin deadline (default ``settings.admin_timeout_ms``)."""
        return self._unary(method, request, timeout_ms or self.settings.admin_timeout_ms)

    def ping(
        self, dest_uuid: str = "", *, timeout_ms: int | None = None
    ) -> tserver_pb2.PingResponsePB:
        """The server's ``PingResponsePB`` (an empty ``dest_uuid`` asks whoever is there)."""
        request = tserver_pb2.PingRequestPB(dest_uuid=dest_uuid)
        return self.call(self.tablet.Ping, request, timeout_ms=timeout_ms)

    def _unary(self, method: _Unary[_Req, _Resp], request: _Req, timeout_ms: int) -> _Resp:
        try:
            response = method(request, timeout=timeout_ms / 1000)
        except grpc.RpcError as err:
            raise error_from_grpc(err, target=self.addr) from None
        return raise_for_response(response)


#: Picks the method to call from the stubs of a blocking proxy, for helpers that open the
#: proxy themselves (``lambda p: p.master.ListTables``). Quoted: grpc's classes are generic
#: only to the type checker.
BlockingMethod: TypeAlias = (
    "Callable[[BlockingServerProxy], grpc.UnaryUnaryMultiCallable[_Req, _Resp]]"
)
