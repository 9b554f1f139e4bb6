"""The bidirectional UpdateConsensusStream: per-message dest_uuid checks, ordered answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from nyala import errors
from nyala._proto import consensus_pb2, consensus_pb2_grpc
from nyala.common.metrics import MetricsRegistry
from nyala.rpc import RpcMetrics, RpcServer, RpcSettings, ServerProxy, ServiceBase, bidi_stream
from nyala.rpc.errors import error_from_grpc, raise_for_response

UUID = "0123456789abcdef0123456789abcdef"


class _Consensus(ServiceBase, consensus_pb2_grpc.ConsensusServiceServicer):  # type: ignore[misc]
    """Answers each request with its own term, so order is visible."""

    @bidi_stream(consensus_pb2.ConsensusResponsePB)
    async def UpdateConsensusStream(
        self, requests: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[Any]:
        async for request in requests:
            # A request deserialized by ``wire.append_request_from_wire`` holds the message's
            # other fields in ``header``.
            fields = getattr(request, "header", request)
            yield consensus_pb2.ConsensusResponsePB(
                responder_uuid=self.server_uuid, responder_term=fields.caller_term
            )


def _request(term: int, dest_uuid: str = UUID) -> Any:
    return consensus_pb2.ConsensusRequestPB(dest_uuid=dest_uuid, tablet_id="t", caller_term=term)


def test_answers_come_back_in_order_and_a_wrong_uuid_ends_the_stream() -> None:
    async def main() -> None:
        metrics = RpcMetrics(MetricsRegistry())
        server = RpcServer("127.0.0.1:0", RpcSettings())
        server.add_service(
            consensus_pb2_grpc.add_ConsensusServiceServicer_to_server, _Consensus(UUID, metrics)
        )
        await server.start()
        try:
            async with ServerProxy(server.address) as proxy:
                call = proxy.open_stream(proxy.consensus.UpdateConsensusStream, timeout_ms=5_000)
                terms = []
                for term in (3, 4, 5):
                    await call.write(_request(term))
                    terms.append(raise_for_response(await call.read()).responder_term)
                assert terms == [3, 4, 5]
                await call.write(_request(6, dest_uuid="f" * 32))
                with pytest.raises(errors.WrongServerUuidError):
                    raise_for_response(await call.read())
                assert await call.read() is grpc.aio.EOF
            assert (
                metrics.requests.value(method="UpdateConsensusStream", code="WRONG_SERVER_UUID")
                == 1
            )
        finally:
            await server.stop(0)

    asyncio.run(main())


def test_a_stream_past_its_deadline_times_out() -> None:
    async def main() -> None:
        server = RpcServer("127.0.0.1:0", RpcSettings())
        server.add_service(
            consensus_pb2_grpc.add_ConsensusServiceServicer_to_server,
            _Consensus(UUID, RpcMetrics(MetricsRegistry())),
        )
        await server.start()
        try:
            async with ServerProxy(server.address) as proxy:
                call = proxy.open_stream(proxy.consensus.UpdateConsensusStream, timeout_ms=200)
                await call.write(_request(1))
                await call.read()
                await asyncio.sleep(0.4)
                with pytest.raises(grpc.RpcError) as caught:
                    await call.read()
                assert isinstance(error_from_grpc(caught.value, target="x"), errors.TimedOutError)
        finally:
            await server.stop(0)

    asyncio.run(main())


def test_a_replaced_deserializer_serves_the_stream_and_serialized_requests_go_through() -> None:
    """``DeserializerOverride`` puts its deserializer on the method gRPC actually serves, and
    ``consensus_stream_serialized`` sends requests that are already bytes."""
    from nyala.consensus.runtime import wire
    from nyala.rpc.server import DeserializerOverride

    seen: list[type] = []

    def deserialize(data: bytes) -> Any:
        received = wire.append_request_from_wire(data)
        seen.append(type(received))
        return received

    async def main() -> None:
        server = RpcServer("127.0.0.1:0", RpcSettings())
        server.add_service(
            lambda servicer, grpc_server: consensus_pb2_grpc.add_ConsensusServiceServicer_to_server(
                servicer, DeserializerOverride(grpc_server, {"UpdateConsensusStream": deserialize})
            ),
            _Consensus(UUID, RpcMetrics(MetricsRegistry())),
        )
        await server.start()
        try:
            async with ServerProxy(server.address) as proxy:
                call = proxy.open_stream(proxy.consensus_stream_serialized, timeout_ms=5_000)
                await call.write(_request(8).SerializeToString())
                assert raise_for_response(await call.read()).responder_term == 8
                await call.done_writing()
        finally:
            await server.stop(0)

    asyncio.run(main())
    assert seen == [wire.ReceivedAppendRequest]
