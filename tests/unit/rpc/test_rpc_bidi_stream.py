"""Bidirectional streams (ConsensusPeerStream): per-message dest_uuid checks, answers in order,
a deadline for the whole stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from nyala import errors
from nyala._proto import consensus_pb2, consensus_pb2_grpc
from nyala.common.metrics import MetricsRegistry
from nyala.rpc import (
    Context,
    RpcMetrics,
    RpcServer,
    RpcSettings,
    ServerProxy,
    ServiceBase,
    bidi_stream,
)
from nyala.rpc.errors import error_from_grpc, raise_for_response

UUID = "0123456789abcdef0123456789abcdef"
Batch = consensus_pb2.ConsensusBatchRequestPB
Answers = consensus_pb2.ConsensusBatchResponsePB


class _Consensus(ServiceBase, consensus_pb2_grpc.ConsensusServiceServicer):
    """Answers each batch with its own call ids, so order is visible."""

    @bidi_stream(Answers)
    async def ConsensusPeerStream(
        self, requests: AsyncIterator[Batch], context: Context[Batch, Answers]
    ) -> AsyncIterator[Answers]:
        async for batch in requests:
            answers = Answers(call_ids=batch.call_ids)
            answers.responses.extend(
                consensus_pb2.ConsensusResponsePB(responder_uuid=self.server_uuid)
                for _ in batch.call_ids
            )
            yield answers


def _batch(*call_ids: int, dest_uuid: str = UUID) -> Batch:
    return Batch(
        dest_uuid=dest_uuid, caller_uuid="c", requests=[b""] * len(call_ids), call_ids=call_ids
    )


async def _server(metrics: RpcMetrics) -> RpcServer:
    server = RpcServer("127.0.0.1:0", RpcSettings())
    server.add_service(
        consensus_pb2_grpc.add_ConsensusServiceServicer_to_server, _Consensus(UUID, metrics)
    )
    await server.start()
    return server


def test_answers_come_back_in_order_and_a_wrong_uuid_ends_the_stream() -> None:
    async def main() -> None:
        metrics = RpcMetrics(MetricsRegistry())
        server = await _server(metrics)
        try:
            async with ServerProxy(server.address) as proxy:
                call = proxy.open_stream(proxy.consensus.ConsensusPeerStream, timeout_ms=5_000)
                seen = []
                for ids in ((3,), (4, 5), (6,)):
                    await call.write(_batch(*ids))
                    seen.extend(raise_for_response(await call.read()).call_ids)
                assert seen == [3, 4, 5, 6]
                await call.write(_batch(7, dest_uuid="f" * 32))
                with pytest.raises(errors.WrongServerUuidError):
                    raise_for_response(await call.read())
                assert await call.read() is grpc.aio.EOF
            refused = metrics.requests.value(method="ConsensusPeerStream", code="WRONG_SERVER_UUID")
            assert refused == 1
        finally:
            await server.stop(0)

    asyncio.run(main())


def test_a_stream_past_its_deadline_times_out() -> None:
    async def main() -> None:
        server = await _server(RpcMetrics(MetricsRegistry()))
        try:
            async with ServerProxy(server.address) as proxy:
                call = proxy.open_stream(proxy.consensus.ConsensusPeerStream, timeout_ms=200)
                await call.write(_batch(1))
                await call.read()
                await asyncio.sleep(0.4)
                with pytest.raises(grpc.RpcError) as caught:
                    await call.read()
                assert isinstance(error_from_grpc(caught.value, target="x"), errors.TimedOutError)
        finally:
            await server.stop(0)

    asyncio.run(main())
