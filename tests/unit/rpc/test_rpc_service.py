"""Handlers, channels and limits of the RPC layer, over a real in-process gRPC server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from nyala import errors
from nyala._proto import tserver_pb2, tserver_pb2_grpc
from nyala.common.metrics import MetricsRegistry
from nyala.rpc import (
    RpcMetrics,
    RpcServer,
    RpcSettings,
    ServerProxy,
    ServiceBase,
    check_dest_uuid,
    server_stream,
    unary,
)
from nyala.rpc.ports import free_loopback_ports

UUID = "0123456789abcdef0123456789abcdef"
OTHER = "f" * 32


class _Service(ServiceBase, tserver_pb2_grpc.TabletServiceServicer):  # type: ignore[misc]
    """A TabletService whose Write does what the test tells it to."""

    def __init__(self, metrics: RpcMetrics) -> None:
        super().__init__(UUID, metrics)
        self.write_behaviour: Callable[[], Awaitable[None]] | None = None

    @unary(tserver_pb2.PingResponsePB, allow_empty_dest=True)
    async def Ping(self, request: Any, context: Any) -> Any:
        return tserver_pb2.PingResponsePB(server_uuid=self.server_uuid)

    @unary(tserver_pb2.WriteResponsePB)
    async def Write(self, request: Any, context: Any) -> Any:
        if self.write_behaviour is not None:
            await self.write_behaviour()
        return tserver_pb2.WriteResponsePB()

    @server_stream(tserver_pb2.ScanResponsePB)
    async def Scan(self, request: Any, context: Any) -> AsyncIterator[Any]:
        for i in range(2):
            yield tserver_pb2.ScanResponsePB(scanner_id="s1", row_count=i, has_more_results=True)
        raise errors.ScannerExpiredError("scanner s1 expired")


def _run(
    test: Callable[[ServerProxy, _Service, RpcMetrics], Awaitable[None]],
    settings: RpcSettings | None = None,
) -> None:
    async def main() -> None:
        settings_ = settings or RpcSettings()
        metrics = RpcMetrics(MetricsRegistry())
        service = _Service(metrics)
        server = RpcServer("127.0.0.1:0", settings_)
        server.add_service(tserver_pb2_grpc.add_TabletServiceServicer_to_server, service)
        await server.start()
        try:
            async with ServerProxy(server.address, settings_) as proxy:
                await test(proxy, service, metrics)
        finally:
            await server.stop(0)

    asyncio.run(main())


def _write(dest_uuid: str = UUID, ops: bytes = b"") -> Any:
    return tserver_pb2.WriteRequestPB(dest_uuid=dest_uuid, tablet_id="t" * 32, ops=ops)


def test_dest_uuid_check() -> None:
    check_dest_uuid(UUID, UUID)
    check_dest_uuid("", UUID, allow_empty=True)
    with pytest.raises(errors.WrongServerUuidError, match=OTHER):
        check_dest_uuid(OTHER, UUID)
    with pytest.raises(errors.InvalidArgumentError):
        check_dest_uuid("", UUID)


def test_ping_answers_and_learns_the_uuid() -> None:
    async def test(proxy: ServerProxy, service: _Service, metrics: RpcMetrics) -> None:
        assert (await proxy.ping()).server_uuid == UUID
        assert (await proxy.ping(UUID)).server_uuid == UUID
        assert metrics.requests.value(method="Ping", code="OK") == 2

    _run(test)


def test_wrong_and_missing_dest_uuid_are_refused_before_the_handler_runs() -> None:
    async def test(proxy: ServerProxy, service: _Service, metrics: RpcMetrics) -> None:
        calls = 0

        async def count() -> None:
            nonlocal calls
            calls += 1

        service.write_behaviour = count
        with pytest.raises(errors.WrongServerUuidError):
            await proxy.call(proxy.tablet.Write, _write(OTHER))
        with pytest.raises(errors.InvalidArgumentError):
            await proxy.call(proxy.tablet.Write, _write(""))
        with pytest.raises(errors.WrongServerUuidError):
            await proxy.ping(OTHER)
        assert calls == 0
        await proxy.call(proxy.tablet.Write, _write())
        assert calls == 1
        assert metrics.requests.value(method="Write", code="WRONG_SERVER_UUID") == 1
        assert metrics.requests.value(method="Write", code="INVALID_ARGUMENT") == 1

    _run(test)


def test_handler_exceptions_reach_the_client_typed() -> None:
    async def test(proxy: ServerProxy, service: _Service, metrics: RpcMetrics) -> None:
        async def not_leader() -> None:
            raise errors.NotLeaderError("follower", leader_uuid=OTHER, leader_addr="h:7050")

        service.write_behaviour = not_leader
        with pytest.raises(errors.NotLeaderError) as caught:
            await proxy.call(proxy.tablet.Write, _write())
        assert caught.value.leader_uuid == OTHER
        assert caught.value.leader_addr == "h:7050"

        async def bug() -> None:
            raise ZeroDivisionError("oops")

        service.write_behaviour = bug
        with pytest.raises(errors.NyalaError, match="oops") as unknown:
            await proxy.call(proxy.tablet.Write, _write())
        assert type(unknown.value) is errors.NyalaError
        assert metrics.requests.value(method="Write", code="UNKNOWN_ERROR") == 1

    _run(test)


def test_a_failing_stream_ends_with_its_error_after_the_good_batches() -> None:
    async def test(proxy: ServerProxy, service: _Service, metrics: RpcMetrics) -> None:
        received: list[int] = []
        request = tserver_pb2.ScanRequestPB(dest_uuid=UUID, scanner_id="s1")

        async def drain() -> None:
            async for response in proxy.stream(proxy.tablet.Scan, request):
                received.append(response.row_count)

        with pytest.raises(errors.ScannerExpiredError):
            await drain()
        assert received == [0, 1]
        assert metrics.requests.value(method="Scan", code="SCANNER_EXPIRED") == 1

    _run(test)


def test_a_call_past_its_deadline_times_out() -> None:
    async def test(proxy: ServerProxy, service: _Service, metrics: RpcMetrics) -> None:
        async def slow() -> None:
            await asyncio.sleep(2)

        service.write_behaviour = slow
        with pytest.raises(errors.TimedOutError):
            await proxy.call(proxy.tablet.Write, _write(), timeout_ms=100)

    _run(test)


def test_messages_over_the_size_limit_are_refused() -> None:
    limit = 64 * 1024

    async def test(proxy: ServerProxy, service: _Service, metrics: RpcMetrics) -> None:
        await proxy.call(proxy.tablet.Write, _write(ops=b"x" * (limit // 2)))
        with pytest.raises(errors.InvalidArgumentError, match="RESOURCE_EXHAUSTED"):
            await proxy.call(proxy.tablet.Write, _write(ops=b"x" * (limit * 2)))

    _run(test, RpcSettings(message_bytes_max=limit))


def test_unimplemented_methods_are_not_supported() -> None:
    async def test(proxy: ServerProxy, service: _Service, metrics: RpcMetrics) -> None:
        request = tserver_pb2.ScannerKeepAliveRequestPB(dest_uuid=UUID, scanner_id="s")
        with pytest.raises(errors.NotSupportedError):
            await proxy.call(proxy.tablet.ScannerKeepAlive, request)

    _run(test)


def test_nobody_listening_is_a_network_error() -> None:
    (port,) = free_loopback_ports(1)

    async def main() -> None:
        async with ServerProxy(f"127.0.0.1:{port}") as proxy:
            with pytest.raises(errors.NetworkError):
                await proxy.ping(timeout_ms=2_000)

    asyncio.run(main())


def test_binding_a_taken_port_is_a_network_error() -> None:
    async def main() -> None:
        first = RpcServer("127.0.0.1:0", RpcSettings())
        await first.start()
        try:
            second = RpcServer(first.address, RpcSettings())
            with pytest.raises(errors.NetworkError, match="cannot bind"):
                await second.start()
        finally:
            await first.stop(0)

    asyncio.run(main())


def test_settings_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="message_bytes_max"):
        RpcSettings(message_bytes_max=10)
    with pytest.raises(ValueError, match="timeouts"):
        RpcSettings(client_timeout_ms=0)
