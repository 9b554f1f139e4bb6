"""``GrpcTransport``'s server half: how a received AppendEntries gets its answer.

The test plays the Raft core (it reads what the transport delivers and sends the answers a
core would), so each path is reached on purpose: an answer at once, an answer held until what
it appended is durable, an answer that gives up waiting for durability, and a core that never
answers. A server answers thousands of these a second with callbacks and timer handles, no
task per request (``answer_update``), so these paths are not exercised by a coroutine any more.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nyala._proto import consensus_pb2
from nyala.consensus import EntryBatch, OpId
from nyala.consensus.messages import AppendRequest, AppendResponse, AppendStatus, Message
from nyala.consensus.runtime import wire
from nyala.consensus.runtime.transport import GrpcTransport, GrpcTransportOptions
from nyala.errors import NyalaError, ServiceUnavailableError

TABLET = "t" * 32
REPLY_TIMEOUT_MS = 300

Reply = consensus_pb2.ConsensusResponsePB | NyalaError


def _no_batch(_data: bytes, _start: int, _end: int) -> EntryBatch:
    raise AssertionError("heartbeats carry no entries")


@dataclass
class Received:
    """Replica "b"'s running transport, what it delivered to the core, the heartbeat from
    leader "a" handed to it (as the core got it) and the replies given so far."""

    transport: GrpcTransport
    delivered: list[Message]
    request: AppendRequest
    replies: list[Reply]


def with_a_received_heartbeat(scenario: Callable[[Received], Awaitable[None]]) -> None:
    """Runs ``scenario`` once "b"'s transport runs and has a heartbeat from "a" to answer."""

    async def main() -> None:
        addresses: dict[str, str] = {}  # "b" sends nothing
        transport = GrpcTransport(
            "b",
            TABLET,
            addresses.get,
            options=GrpcTransportOptions(reply_timeout_ms=REPLY_TIMEOUT_MS),
        )
        delivered: list[Message] = []
        async with asyncio.TaskGroup() as group:
            task = group.create_task(transport.run(delivered.append))
            await asyncio.sleep(0)  # ``run`` attaches the core's callback
            replies: list[Reply] = []
            heartbeat = AppendRequest("a", "b", 1, OpId(1, 5), None, 5, 0)
            pb = wire.append_request_to_pb(heartbeat, TABLET)
            pending = transport.submit_update(pb, _no_batch)
            transport.answer_update(pending, replies.append)
            await scenario(Received(transport, delivered, pending.request, replies))
            task.cancel()

    asyncio.run(main())


def ok(
    request: AppendRequest, *, last: int, durable: int, seq: int | None = None
) -> AppendResponse:
    """The core's OK answer to ``request`` (``seq`` 0: an unsolicited durability ack)."""
    return AppendResponse(
        "b",
        "a",
        1,
        AppendStatus.OK,
        OpId(1, last),
        durable,
        seq=request.seq if seq is None else seq,
    )


def the_answer(r: Received) -> AppendResponse:
    """The one reply given so far, which must be an answer (not an error), decoded."""
    assert len(r.replies) == 1
    answer = r.replies[0]
    assert isinstance(answer, consensus_pb2.ConsensusResponsePB)
    assert not answer.HasField("error")
    return wire.append_response_from_pb(answer, dest="a", seq=r.request.seq)


async def turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_an_answer_whose_entries_are_durable_goes_at_once() -> None:
    async def scenario(r: Received) -> None:
        await turns()
        assert r.delivered == [r.request]
        assert r.request.seq != 0
        r.transport.send(ok(r.request, last=5, durable=5))
        await turns()
        assert the_answer(r).status is AppendStatus.OK

    with_a_received_heartbeat(scenario)


def test_an_answer_waits_until_what_it_appended_is_durable() -> None:
    async def scenario(r: Received) -> None:
        r.transport.send(ok(r.request, last=5, durable=3))
        await turns()
        assert r.replies == []  # entries 4 and 5 are not durable yet
        r.transport.send(ok(r.request, last=5, durable=5, seq=0))  # the log synced
        await turns()
        assert the_answer(r).durable_index == 5

    with_a_received_heartbeat(scenario)


def test_an_answer_whose_entries_stay_unsynced_says_what_is_durable_after_the_timeout() -> None:
    async def scenario(r: Received) -> None:
        r.transport.send(ok(r.request, last=5, durable=3))
        await asyncio.sleep(REPLY_TIMEOUT_MS / 1000 / 2)
        assert r.replies == []
        await asyncio.sleep(REPLY_TIMEOUT_MS / 1000 + 0.2)
        assert the_answer(r).durable_index == 3  # what is durable, no more
        r.transport.send(ok(r.request, last=5, durable=5, seq=0))
        await turns()
        assert len(r.replies) == 1  # answered once

    with_a_received_heartbeat(scenario)


def test_a_core_that_never_answers_gives_an_error_and_a_late_answer_is_dropped() -> None:
    async def scenario(r: Received) -> None:
        await asyncio.sleep(REPLY_TIMEOUT_MS / 1000 + 0.2)
        assert len(r.replies) == 1
        assert isinstance(r.replies[0], ServiceUnavailableError)
        dropped = r.transport.messages_dropped
        r.transport.send(ok(r.request, last=5, durable=5))
        await turns()
        assert len(r.replies) == 1
        assert r.transport.messages_dropped == dropped + 1

    with_a_received_heartbeat(scenario)


def test_a_failed_status_goes_at_once_without_waiting_for_durability() -> None:
    async def scenario(r: Received) -> None:
        mismatch = AppendResponse(
            "b", "a", 1, AppendStatus.LOG_MISMATCH, OpId(1, 2), 0, hint_index=2, seq=r.request.seq
        )
        r.transport.send(mismatch)
        await turns()
        assert the_answer(r).status is AppendStatus.LOG_MISMATCH

    with_a_received_heartbeat(scenario)
