"""The consensus peer channel (``nyala.consensus.runtime.peer_channel``): PeerStreams' batches
on a plain TCP connection. What goes in and out of a real channel server on loopback, what it
refuses, and the client's fallback to the gRPC stream. Replication end to end over the channel
is in ``test_consensus_runtime.py`` (``test_replicates_over_grpc_streams``, channel variant)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nyala import _native
from nyala._proto import common_pb2, consensus_pb2, consensus_pb2_grpc
from nyala.consensus import OpId
from nyala.consensus.messages import Message, VoteRequest, VoteResponse
from nyala.consensus.runtime.peer_channel import (
    MAGIC,
    PeerChannelServer,
    _FrameConnection,
    batch_request_frame,
    open_peer_channel,
    split_batch_request,
)
from nyala.consensus.runtime.peer_streams import PeerStreams, PeerStreamsOptions
from nyala.consensus.runtime.transport import GrpcTransport
from nyala.consensus.runtime.wire import WireRequest, request_bytes
from nyala.errors import InvalidArgumentError, NetworkError, NotAuthorizedError, TabletNotFoundError
from nyala.rpc import RpcServer
from nyala.rpc.settings import RpcSettings

SERVER = "s" * 32
CLIENT = "c" * 32
FRAME_MAX = 1 << 20
WAIT_S = 10.0


def _request(tablet_id: str) -> bytes:
    return consensus_pb2.ConsensusRequestPB(
        tablet_id=tablet_id, dest_uuid=SERVER, caller_uuid=CLIENT, caller_term=1
    ).SerializeToString()


def _frame(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _batch(dest_uuid: str, *tablet_ids: str) -> bytes:
    batch = consensus_pb2.ConsensusBatchRequestPB(dest_uuid=dest_uuid, caller_uuid=CLIENT)
    for call_id, tablet_id in enumerate(tablet_ids, start=1):
        batch.requests.append(_request(tablet_id))
        batch.call_ids.append(call_id)
    return batch.SerializeToString()


async def _read_answer(reader: asyncio.StreamReader) -> consensus_pb2.ConsensusBatchResponsePB:
    (length,) = struct.unpack(">I", await reader.readexactly(4))
    return consensus_pb2.ConsensusBatchResponsePB.FromString(await reader.readexactly(length))


def _no_tablets(tablet_id: str) -> Any:
    raise TabletNotFoundError(f"tablet {tablet_id} is not here")


#: The tablet whose votes ``_vote`` grants, and the one whose answers no core can read (every
#: other is not here).
VOTING = "v" * 32
GARBLED = "g" * 32


def _vote_request(tablet_id: str, term: int = 3) -> consensus_pb2.VoteRequestPB:
    return consensus_pb2.VoteRequestPB(
        dest_uuid=SERVER, tablet_id=tablet_id, candidate_uuid=CLIENT, candidate_term=term
    )


async def _vote(request: consensus_pb2.VoteRequestPB) -> consensus_pb2.VoteResponsePB:
    """A voter that grants ``VOTING``'s votes after a turn of the loop (as a real one waits
    for its core) and refuses every other tablet's as not here."""
    await asyncio.sleep(0)
    if request.tablet_id == GARBLED:  # a denial code that means nothing to a vote
        error = consensus_pb2.ConsensusErrorPB(code=consensus_pb2.PRECEDING_ENTRY_DIDNT_MATCH)
        return consensus_pb2.VoteResponsePB(responder_uuid=SERVER, consensus_error=error)
    if request.tablet_id != VOTING:
        _no_tablets(request.tablet_id)
    return consensus_pb2.VoteResponsePB(
        responder_uuid=SERVER, responder_term=request.candidate_term, vote_granted=True
    )


async def _with_channel(
    body: Callable[[PeerChannelServer, PeerStreams], Awaitable[None]],
) -> None:
    """A channel server answering from a real ``PeerStreams.serve`` with no tablets: every
    request is answered TABLET_NOT_FOUND, the answer a real server gives for a tablet it does
    not host."""
    streams = PeerStreams(SERVER)
    runner = asyncio.create_task(streams.run())
    await asyncio.sleep(0)

    def serve(
        batches: AsyncIterator[consensus_pb2.ConsensusBatchRequestPB],
        sink: _native.AnswerSink | None = None,
    ) -> AsyncIterator[consensus_pb2.ConsensusBatchResponsePB]:
        return streams.serve(batches, _no_tablets, lambda _data: None, _vote, sink)

    channel = PeerChannelServer(SERVER, serve, frame_bytes_max=FRAME_MAX)
    await channel.start("127.0.0.1", 0)
    try:
        await asyncio.wait_for(body(channel, streams), WAIT_S)
    finally:
        channel.close()
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def _connect(channel: PeerChannelServer) -> tuple[asyncio.StreamReader, Any]:
    return await asyncio.open_connection("127.0.0.1", channel.port)


def _votes(count: int) -> list[tuple[int, bytes]]:
    """``count`` (call id, serialized vote request) pairs, ids counting down from 2**63."""
    return [
        (2**63 - k, _vote_request(f"{k:032d}", term=k + 1).SerializeToString())
        for k in range(count)
    ]


@pytest.mark.parametrize("count", [0, 1, 300])
def test_a_frame_encoded_by_hand_is_the_batch_protobuf_reads(count: int) -> None:
    call_ids = [2**k % (2**64 - 1) + k for k in range(count)]
    requests = [bytes([k % 256]) * (k * 7 % 1000) for k in range(count)]
    votes = _votes(count // 2)
    frame = b"".join(batch_request_frame(SERVER, CLIENT, call_ids, list(requests), votes))
    (length,) = struct.unpack(">I", frame[:4])
    assert length == len(frame) - 4
    batch = consensus_pb2.ConsensusBatchRequestPB.FromString(frame[4:])
    assert batch.dest_uuid == SERVER
    assert batch.caller_uuid == CLIENT
    assert list(batch.call_ids) == call_ids
    assert list(batch.requests) == requests
    assert list(batch.vote_call_ids) == [call_id for call_id, _ in votes]
    assert [vote.SerializeToString() for vote in batch.votes] == [vote for _, vote in votes]


@pytest.mark.parametrize("count", [0, 1, 300])
def test_a_server_splits_a_frame_as_protobuf_parses_it(count: int) -> None:
    """What a follower does with a frame read into the connection's buffer: the requests
    copied out of it, with the fields and call ids protobuf would read (unknown fields
    kept out of the requests, a request field repeated any number of times)."""
    call_ids = [2**k % (2**64 - 1) + k for k in range(count)]
    requests = [bytes([k % 256]) * (k * 7 % 1000) for k in range(count)]
    votes = _votes(count // 2)
    frame = b"".join(batch_request_frame(SERVER, CLIENT, call_ids, list(requests), votes))
    buffer = bytearray(frame[4:])
    batch = split_batch_request(memoryview(buffer))
    buffer[:] = bytes(len(buffer))  # the connection reuses its buffer: nothing points into it
    assert (batch.dest_uuid, list(batch.call_ids), batch.requests) == (SERVER, call_ids, requests)
    assert list(batch.vote_call_ids) == [call_id for call_id, _ in votes]
    assert [vote.SerializeToString() for vote in batch.votes] == [vote for _, vote in votes]
    parsed = consensus_pb2.ConsensusBatchRequestPB.FromString(frame[4:])
    unknown = b"\x3a\x03abc"  # field 7, length-delimited: a later version's field
    again = split_batch_request(parsed.SerializeToString() + unknown)
    assert (again.dest_uuid, list(again.call_ids), again.requests) == (SERVER, call_ids, requests)
    assert list(again.votes) == list(parsed.votes)


def test_a_frame_that_does_not_split_is_refused() -> None:
    frame = b"".join(batch_request_frame(SERVER, CLIENT, [1, 2], [b"one", b"two"]))[4:]
    one_id = consensus_pb2.ConsensusBatchRequestPB(
        dest_uuid=SERVER, call_ids=[1], requests=[b"one", b"two"]
    ).SerializeToString()
    for damaged, message in [
        (frame[:-1], "runs past"),
        (b"\x1a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", "varint"),
        (b"\x1b", "wire type 3"),
        (b"\x18\x01", "not length-delimited"),  # the requests field as a varint
        (b"\x0a\x02\xff\xfe", "is not a ConsensusBatchRequestPB"),  # dest_uuid not UTF-8
        (one_id, "2 requests and 1 call ids"),
        (
            consensus_pb2.ConsensusBatchRequestPB(
                dest_uuid=SERVER, votes=[_vote_request(VOTING)], vote_call_ids=[1, 2]
            ).SerializeToString(),
            "1 votes and 2 vote call ids",
        ),
    ]:
        with pytest.raises(InvalidArgumentError, match=message):
            split_batch_request(damaged)


def test_large_entry_batches_are_framed_in_place_small_ones_joined() -> None:
    """A request given as a head and a batch's bytes (``wire.append_request_parts``) goes
    into the frame as those very bytes when large (written to the socket from where they
    lie), copied when small; the joined pieces are the batch protobuf reads."""
    large = memoryview(bytes(range(256)) * 1024)  # 256 KiB
    small = memoryview(b"entries" * 10)
    requests: list[WireRequest] = [b"whole", (b"head-1", large), (b"head-2", small), b"last"]
    pieces = batch_request_frame(SERVER, CLIENT, [1, 2, 3, 4], requests)
    assert sum(piece is large for piece in pieces) == 1
    assert not any(piece is small for piece in pieces)
    assert len(pieces) == 3  # what precedes the large batch, the batch, what follows it
    frame = b"".join(pieces)
    (length,) = struct.unpack(">I", frame[:4])
    assert length == len(frame) - 4
    batch = consensus_pb2.ConsensusBatchRequestPB.FromString(frame[4:])
    assert list(batch.requests) == [request_bytes(r) for r in requests]
    assert list(batch.call_ids) == [1, 2, 3, 4]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    uuids=st.tuples(st.text(max_size=40), st.text(max_size=40)),
    requests=st.lists(
        st.one_of(
            st.binary(max_size=40),
            st.tuples(st.binary(max_size=40), st.sampled_from([0, 1, 100, 70_000])),
        ),
        max_size=5,
    ),
    call_ids=st.lists(st.integers(0, 2**64 - 1), min_size=5, max_size=5),
    votes=st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**40)), max_size=3),
)
def test_a_frame_is_the_batch_protobuf_reads(
    uuids: tuple[str, str],
    requests: list[bytes | tuple[bytes, int]],
    call_ids: list[int],
    votes: list[tuple[int, int]],
) -> None:
    """Whatever the batch holds (no request, empty ones, bodies on either side of the
    in-place size, several votes, call ids of every size), the native frame is its length
    and then the ``ConsensusBatchRequestPB`` protobuf builds from the same fields."""
    dest, caller = uuids
    wire_requests: list[WireRequest] = [
        r if isinstance(r, bytes) else (r[0], memoryview(bytes([7]) * r[1])) for r in requests
    ]
    ids = call_ids[: len(requests)]
    encoded_votes = [(i, _vote_request("t" * 32, term).SerializeToString()) for i, term in votes]
    pieces = batch_request_frame(dest, caller, ids, wire_requests, encoded_votes)
    frame = b"".join(pieces)
    (length,) = struct.unpack(">I", frame[:4])
    assert length == len(frame) - 4
    expected = consensus_pb2.ConsensusBatchRequestPB(
        dest_uuid=dest,
        caller_uuid=caller,
        requests=[request_bytes(r) for r in wire_requests],
        call_ids=ids,
        votes=[_vote_request("t" * 32, term) for _, term in votes],
        vote_call_ids=[i for i, _ in votes],
    )
    assert frame[4:] == expected.SerializeToString()
    in_place = [r[1] for r in wire_requests if isinstance(r, tuple) and r[1].nbytes >= 64 * 1024]
    assert [p for p in pieces if isinstance(p, memoryview)] == in_place
    assert all(any(p is body for p in pieces) for body in in_place)


def _answer_batch(*call_ids: int) -> bytes:
    answer = consensus_pb2.ConsensusBatchResponsePB(call_ids=call_ids)
    for call_id in call_ids:
        answer.responses.add(responder_uuid=SERVER, responder_term=call_id)
    return answer.SerializeToString()


async def _dial_scripted(
    script: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> tuple[list[consensus_pb2.ConsensusBatchResponsePB], BaseException]:
    """Dials a server that reads the magic and then runs ``script``; returns the answer
    batches the dialler's connection was handed and why the connection ended."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert await reader.readexactly(len(MAGIC)) == MAGIC
        await script(reader, writer)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    answers: list[consensus_pb2.ConsensusBatchResponsePB] = []

    def take(answer: consensus_pb2.ConsensusBatchResponsePB) -> None:
        if answer.HasField("error"):
            raise NotAuthorizedError(answer.error.message)
        answers.append(answer)

    try:
        connection = await open_peer_channel(
            "127.0.0.1", port, timeout_ms=5000, on_answers=take, frame_bytes_max=FRAME_MAX
        )
        try:
            async with asyncio.timeout(WAIT_S):
                await connection.wait_ended()
        except Exception as exc:
            return answers, exc
        finally:
            connection.close()
        raise AssertionError("wait_ended returned")
    finally:
        server.close()


def test_a_dialler_is_handed_every_answer_however_the_bytes_arrive() -> None:
    """Answer frames split at every byte, and several in one read, each reach the dialler's
    callback whole and in order; the peer closing the connection then ends it with a
    ``NetworkError``."""
    frames = b"".join(_frame(_answer_batch(*ids)) for ids in [(1,), (2, 3), (), (4,)])

    async def script(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A byte at a time, then in pieces of 7 (a frame and the start of the next in one
        # read), then everything in one write.
        for size in (1, 7, len(frames)):
            for i in range(0, len(frames), size):
                writer.write(frames[i : i + size])
                await writer.drain()
                await asyncio.sleep(0.001)
        writer.close()

    answers, why = asyncio.run(_dial_scripted(script))
    assert [list(a.call_ids) for a in answers] == [[1], [2, 3], [], [4]] * 3
    assert [r.responder_term for r in answers[1].responses] == [2, 3]
    assert isinstance(why, NetworkError)


def test_a_dialler_ends_its_connection_on_a_refusal_or_an_oversized_frame() -> None:
    """What the callback raises for a refused stream ends the connection with that error,
    and so does a frame over the limit; the answers before either were handed over and
    nothing after them is."""

    async def refused(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        refusal = consensus_pb2.ConsensusBatchResponsePB()
        refusal.error.message = "not a server"
        writer.write(_frame(_answer_batch(1)) + _frame(refusal.SerializeToString()))
        writer.write(_frame(_answer_batch(2)))
        await writer.drain()
        await asyncio.sleep(WAIT_S)

    async def oversized(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(_frame(_answer_batch(1)) + struct.pack(">I", FRAME_MAX + 1))
        await writer.drain()
        await asyncio.sleep(WAIT_S)

    answers, why = asyncio.run(_dial_scripted(refused))
    assert [list(a.call_ids) for a in answers] == [[1]]
    assert isinstance(why, NotAuthorizedError)
    answers, why = asyncio.run(_dial_scripted(oversized))
    assert [list(a.call_ids) for a in answers] == [[1]]
    assert isinstance(why, InvalidArgumentError)
    assert "over the limit" in str(why)


def test_batches_are_answered_on_the_connection_request_by_request() -> None:
    async def body(channel: PeerChannelServer, _: PeerStreams) -> None:
        reader, writer = await _connect(channel)
        writer.write(MAGIC + _frame(_batch(SERVER, "a" * 32, "b" * 32)))
        answered: dict[int, consensus_pb2.ConsensusResponsePB] = {}
        while len(answered) < 2:
            answer = await _read_answer(reader)
            assert not answer.HasField("error")
            answered.update(zip(answer.call_ids, answer.responses, strict=True))
        assert sorted(answered) == [1, 2]
        for response in answered.values():
            assert response.error.code == common_pb2.TABLET_NOT_FOUND
        # The connection stays open for the next batch.
        writer.write(_frame(_batch(SERVER, "c" * 32)))
        answer = await _read_answer(reader)
        assert list(answer.call_ids) == [1]
        writer.close()

    asyncio.run(_with_channel(body))


def test_large_frames_read_in_place_each_parsed_before_the_next_is_read() -> None:
    """Frames larger than the server's scratch buffer are read into one buffer it reuses:
    several of them sent back to back, between small ones, must each be answered for their
    own requests (a frame overwritten before it was parsed would be answered for another's,
    or not parse)."""

    async def body(channel: PeerChannelServer, _: PeerStreams) -> None:
        reader, writer = await _connect(channel)
        sizes = [10, 150_000, 90_000, 20, 300_000, 70_000, 30]  # bytes of padding per tablet id
        tablets = [f"{k:02d}-" + "x" * size for k, size in enumerate(sizes)]
        frames = b""
        for call_id, tablet in enumerate(tablets):
            batch = consensus_pb2.ConsensusBatchRequestPB(dest_uuid=SERVER, caller_uuid=CLIENT)
            batch.requests.append(_request(tablet))
            batch.call_ids.append(call_id)
            frames += _frame(batch.SerializeToString())
        writer.write(MAGIC + frames)
        answered: dict[int, consensus_pb2.ConsensusResponsePB] = {}
        while len(answered) < len(tablets):
            answer = await _read_answer(reader)
            assert not answer.HasField("error")
            answered.update(zip(answer.call_ids, answer.responses, strict=True))
        assert sorted(answered) == list(range(len(tablets)))
        for call_id, tablet in enumerate(tablets):
            assert answered[call_id].error.code == common_pb2.TABLET_NOT_FOUND
            assert tablet in answered[call_id].error.message
        writer.close()

    asyncio.run(_with_channel(body))


class _Feeder(asyncio.Transport):
    """What a connection's socket transport does for its protocol, driven by a test: the
    test writes bytes into the protocol's buffers and keeps to its pause and resume."""

    def __init__(self) -> None:
        super().__init__()
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


@pytest.mark.parametrize("seed", range(6))
def test_frames_arrive_whole_and_in_order_however_the_bytes_are_split(seed: int) -> None:
    """The server side of a connection (``_FrameConnection``) fed the magic and frames of
    every size around its scratch buffer in random pieces, to a reader that takes them late:
    it yields exactly the frames sent. A large frame is read in place into a buffer the
    connection reuses, so it must not read on while such a frame waits to be taken."""
    rng = random.Random(seed)
    scratch = _FrameConnection.SCRATCH_BYTES
    sizes = [0, 1, 100, scratch - 5, scratch - 4, scratch - 3, scratch, 3 * scratch, 200_000]
    sizes += [rng.choice(sizes) for _ in range(20)]
    frames = [rng.randbytes(size) for size in sizes]
    stream = MAGIC + b"".join(struct.pack(">I", len(f)) + f for f in frames)

    async def run() -> list[bytes]:
        connection = _FrameConnection(FRAME_MAX, lambda _: None)
        transport = _Feeder()
        connection.connection_made(transport)
        got: list[bytes] = []

        async def read() -> None:
            while (frame := await connection.next_frame()) is not None:
                for _ in range(rng.randrange(4)):
                    await asyncio.sleep(0)  # a reader that is slow to come back
                got.append(bytes(frame))

        reader = asyncio.create_task(read())
        sent = 0
        while sent < len(stream):
            if transport.paused:
                await asyncio.sleep(0)
                continue
            space = connection.get_buffer(-1)
            n = min(len(space), rng.randint(1, 150_000), len(stream) - sent)
            space[:n] = stream[sent : sent + n]
            connection.buffer_updated(n)
            sent += n
            if rng.random() < 0.3:
                await asyncio.sleep(0)
        connection.eof_received()
        await reader
        return got

    assert asyncio.run(run()) == [MAGIC, *frames]


def test_reading_pauses_while_the_handler_does_not_take_frames() -> None:
    """Back-pressure: small frames read and not taken stop the reading at
    ``QUEUED_BYTES_MAX`` (TCP then holds the sender back), and taking them resumes it."""
    frame = b"f" * 1000
    stream = MAGIC + (struct.pack(">I", len(frame)) + frame) * 2000  # about 2 MB

    async def run() -> None:
        connection = _FrameConnection(FRAME_MAX, lambda _: None)
        transport = _Feeder()
        connection.connection_made(transport)
        sent = 0
        while sent < len(stream) and not transport.paused:
            space = connection.get_buffer(-1)
            n = min(len(space), 4096, len(stream) - sent)
            space[:n] = stream[sent : sent + n]
            connection.buffer_updated(n)
            sent += n
        assert transport.paused
        limit = _FrameConnection.QUEUED_BYTES_MAX
        assert limit <= sent <= limit + _FrameConnection.SCRATCH_BYTES
        assert await connection.next_frame() == MAGIC
        taken = 0
        while True:
            try:
                got = await asyncio.wait_for(connection.next_frame(), 0.5)
            except TimeoutError:
                break  # every frame read was taken; the rest is not sent yet
            assert got == frame
            taken += 1
        assert not transport.paused  # resumed once the handler took them all
        assert len(MAGIC) + taken * (4 + len(frame)) <= sent < len(stream)

    asyncio.run(run())


def test_a_batch_for_another_server_is_refused_and_the_connection_closed() -> None:
    async def body(channel: PeerChannelServer, _: PeerStreams) -> None:
        reader, writer = await _connect(channel)
        writer.write(MAGIC + _frame(_batch("x" * 32, "a" * 32)))
        answer = await _read_answer(reader)
        assert answer.error.code == common_pb2.WRONG_SERVER_UUID, answer
        assert not answer.call_ids
        assert await reader.read() == b""  # closed by the server

    asyncio.run(_with_channel(body))


@pytest.mark.parametrize(
    "opening",
    [
        # Another version of the channel, then a batch it would otherwise answer.
        pytest.param(MAGIC[:-1] + b"\x02" + _frame(_batch(SERVER, "a" * 32)), id="wrong-magic"),
        pytest.param(MAGIC + struct.pack(">I", FRAME_MAX + 1), id="oversized-frame"),
        pytest.param(MAGIC + _frame(b"\xff" * 12), id="not-a-batch"),
    ],
)
def test_malformed_input_closes_only_its_connection(opening: bytes) -> None:
    async def body(channel: PeerChannelServer, _: PeerStreams) -> None:
        healthy_reader, healthy = await _connect(channel)
        healthy.write(MAGIC)
        reader, writer = await _connect(channel)
        writer.write(opening)
        rest = await reader.read()  # the server closes it (after a refusal, if framed)
        if rest:
            answer = consensus_pb2.ConsensusBatchResponsePB.FromString(rest[4:])
            assert answer.error.code == common_pb2.INVALID_ARGUMENT, answer
        assert channel.connections_refused == 1
        # The other connection and the listener are untouched.
        healthy.write(_frame(_batch(SERVER, "a" * 32)))
        assert list((await _read_answer(healthy_reader)).call_ids) == [1]
        _, again = await _connect(channel)
        again.close()

    asyncio.run(_with_channel(body))


class _Announcer(consensus_pb2_grpc.ConsensusServiceServicer):  # type: ignore[misc]
    """A server's GetPeerChannel and ConsensusPeerStream over a real ``PeerStreams.serve``
    with no tablets; ``port`` is what it announces."""

    def __init__(self, streams: PeerStreams, route: Callable[[str], Any] = _no_tablets) -> None:
        self.streams = streams
        self.route = route
        self.port = 0
        self.grpc_streams = 0

    def serve(self, batches: AsyncIterator[Any], sink: Any = None) -> AsyncIterator[Any]:
        return self.streams.serve(batches, self.route, lambda _data: None, _vote, sink)

    async def GetPeerChannel(self, request: Any, _context: Any) -> Any:
        return consensus_pb2.PeerChannelResponsePB(port=self.port)

    async def ConsensusPeerStream(
        self, requests: AsyncIterator[Any], _context: Any
    ) -> AsyncIterator[Any]:
        self.grpc_streams += 1
        async for answers in self.serve(requests):
            yield answers


async def _send(streams: PeerStreams, address: str, tablet_id: str) -> Any:
    answered: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    streams.send(SERVER, address, _request(tablet_id), answered.set_result)
    return await asyncio.wait_for(answered, WAIT_S)


async def _send_vote(streams: PeerStreams, address: str, tablet_id: str) -> Any:
    answered: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    streams.send_vote(SERVER, address, _vote_request(tablet_id), answered.set_result)
    return await asyncio.wait_for(answered, WAIT_S)


async def _send_until_answered(streams: PeerStreams, address: str) -> Any:
    for _ in range(20):
        answer = await _send(streams, address, "b" * 32)
        if not isinstance(answer, BaseException):
            return answer
        await asyncio.sleep(0.05)
    raise AssertionError(f"never answered: {answer!r}")


def test_the_client_uses_an_announced_channel_and_falls_back_to_grpc_without_one() -> None:
    async def body(channel: PeerChannelServer, served: PeerStreams) -> None:
        announcer = _Announcer(served)
        server = RpcServer("127.0.0.1:0", RpcSettings())
        server.add_service(consensus_pb2_grpc.add_ConsensusServiceServicer_to_server, announcer)
        await server.start()
        client = PeerStreams(CLIENT)
        runner = asyncio.create_task(client.run())
        await asyncio.sleep(0)
        try:
            # Announced: the batches go over the channel, none over gRPC.
            announcer.port = channel.port
            answer = await _send(client, server.address, "a" * 32)
            assert answer.error.code == common_pb2.TABLET_NOT_FOUND
            assert client.connections() == {"channel": 1, "grpc": 0}
            assert client.requests_sent == {"channel": 1, "grpc": 0}
            assert announcer.grpc_streams == 0
            # Votes go the same way, and are answered, granted or refused, on it.
            granted = await _send_vote(client, server.address, VOTING)
            assert (granted.vote_granted, granted.responder_term) == (True, 3)
            refused = await _send_vote(client, server.address, "a" * 32)
            assert refused.error.code == common_pb2.TABLET_NOT_FOUND
            assert client.votes_sent == {"channel": 2, "grpc": 0}

            # The channel goes away: the next connection, told there is no channel now, is
            # the gRPC stream (a request sent while the old one broke may be lost, and its
            # callback says so: Raft sends again).
            channel.close()
            announcer.port = 0
            answer = await _send_until_answered(client, server.address)
            assert answer.error.code == common_pb2.TABLET_NOT_FOUND
            assert client.connections() == {"channel": 0, "grpc": 1}
            assert announcer.grpc_streams == 1
            granted = await _send_vote(client, server.address, VOTING)
            assert granted.vote_granted
            assert client.votes_sent == {"channel": 2, "grpc": 1}

            # A channel announced but unreachable: the gRPC stream carries the batches.
            await server.stop(0)
            server = RpcServer("127.0.0.1:0", RpcSettings())
            server.add_service(consensus_pb2_grpc.add_ConsensusServiceServicer_to_server, announcer)
            await server.start()
            announcer.port = channel_port_nobody_listens_on()
            answer = await _send(client, server.address, "d" * 32)
            assert answer.error.code == common_pb2.TABLET_NOT_FOUND
            assert client.channel_fallbacks == 1
            assert announcer.grpc_streams == 2
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
            await server.stop(0)

    asyncio.run(_with_channel(body))


def channel_port_nobody_listens_on() -> int:
    """A loopback port that was free a moment ago (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@contextlib.asynccontextmanager
async def _announcing_server(route: Callable[[str], Any] = _no_tablets) -> AsyncIterator[Any]:
    """A server's RPC port announcing its peer channel, both answered by one real
    ``PeerStreams.serve`` (run here) with ``route`` for its tablets; yields the RPC server."""
    served = PeerStreams(SERVER)
    announcer = _Announcer(served, route)
    channel = PeerChannelServer(SERVER, announcer.serve, frame_bytes_max=FRAME_MAX)
    server = RpcServer("127.0.0.1:0", RpcSettings())
    server.add_service(consensus_pb2_grpc.add_ConsensusServiceServicer_to_server, announcer)
    await server.start()
    announcer.port = await channel.start("127.0.0.1", 0)
    try:
        async with _running(served):
            yield server
    finally:
        channel.close()
        await server.stop(0)


@contextlib.asynccontextmanager
async def _running(streams: PeerStreams) -> AsyncIterator[PeerStreams]:
    """``streams.run()`` for the length of the block."""
    runner = asyncio.create_task(streams.run())
    await asyncio.sleep(0)
    try:
        yield streams
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


class _Unanswered:
    """A tablet whose AppendEntries are taken and never answered: a follower whose disk does
    not come back."""

    def __init__(self) -> None:
        self.taken = 0
        self.first_taken = asyncio.Event()

    def submit_update(self, pb: Any, decode_batch: Any) -> None:
        self.taken += 1
        self.first_taken.set()

    def answer_update(self, pending: Any, reply: Any, handoff: Any = None) -> None:
        pass


def test_votes_go_while_appends_wait_for_answers() -> None:
    """A peer holds as many AppendEntries unanswered as it may: the next waits in the queue,
    but a vote request does not wait behind it (an election must not wait for a slow disk)."""

    async def scenario() -> None:
        tablet = _Unanswered()
        client = PeerStreams(CLIENT, options=PeerStreamsOptions(unanswered_requests_max=1))
        async with _announcing_server(lambda _tablet_id: tablet) as server, _running(client):
            appended: list[Any] = []
            for tablet_id in ("a" * 32, "b" * 32):  # the second, once the first is written
                client.send(SERVER, server.address, _request(tablet_id), appended.append)
                await tablet.first_taken.wait()
            granted = await _send_vote(client, server.address, VOTING)
            assert granted.vote_granted
            assert appended == []
            assert tablet.taken == 1  # the second is still queued at the client
            assert client.requests_sent == {"channel": 1, "grpc": 0}
            assert client.votes_sent == {"channel": 1, "grpc": 0}

    asyncio.run(asyncio.wait_for(scenario(), WAIT_S * 2))


def test_a_candidates_transport_delivers_only_the_vote_answers_its_core_can_use() -> None:
    """A tablet's transport sends its core's vote requests on the server's streams: a granted
    vote reaches the core; a refusal, or an answer the core cannot read, is dropped there and
    leaves the stream to the voter's server working for the next one."""

    async def scenario() -> None:
        client = PeerStreams(CLIENT)
        delivered: dict[str, list[Message]] = {t: [] for t in (VOTING, GARBLED, "n" * 32)}
        arrived = asyncio.Event()

        def deliver_to(tablet_id: str) -> Callable[[Message], None]:
            def deliver(message: Message) -> None:
                delivered[tablet_id].append(message)
                arrived.set()

            return deliver

        async with _announcing_server() as server, _running(client):
            addresses = {SERVER: server.address}
            transports = {
                tablet_id: GrpcTransport(CLIENT, tablet_id, addresses.get, peer_streams=client)
                for tablet_id in delivered
            }
            runners = [asyncio.create_task(transports[t].run(deliver_to(t))) for t in delivered]
            await asyncio.sleep(0)
            for tablet_id in (GARBLED, "n" * 32, VOTING):  # the usable answer last
                request = VoteRequest(CLIENT, SERVER, 3, OpId(1, 7), pre_election=True)
                transports[tablet_id].send(request)
            await arrived.wait()
            (granted,) = delivered[VOTING]
            assert isinstance(granted, VoteResponse)
            assert (granted.src, granted.dest, granted.granted) == (SERVER, CLIENT, True)
            assert granted.pre_election
            assert delivered[GARBLED] == delivered["n" * 32] == []
            assert transports[GARBLED].messages_dropped == 1
            assert transports["n" * 32].messages_dropped == 1
            assert client.votes_sent == {"channel": 3, "grpc": 0}
            for runner in runners:
                runner.cancel()
            await asyncio.gather(*runners, return_exceptions=True)

    asyncio.run(asyncio.wait_for(scenario(), WAIT_S * 2))


def test_a_connections_sink_holds_what_the_socket_does_not_take_until_it_has_room() -> None:
    """Once a plain connection's writes go through its sink (``take_writes``), frames the
    socket cannot take wait in the sink, ``drain`` holds the writer back, and the event loop
    sends the rest when the reader makes room: every frame arrives whole and in order."""
    frames = [bytes([i % 251]) * (64 << 10) for i in range(64)]  # 4 MiB, more than a socket holds

    async def run() -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        connection = _FrameConnection(FRAME_MAX, lambda _: None)
        await loop.connect_accepted_socket(lambda: connection, ours)
        sink = connection.take_writes()
        assert sink is not None
        theirs.setblocking(False)
        written = asyncio.Event()

        async def write_all() -> None:
            for frame in frames:
                connection.write_frame(frame)
                await connection.drain()
            written.set()

        writer = asyncio.create_task(write_all())
        await asyncio.sleep(0.2)
        assert not written.is_set()  # held back: the reader has not read
        assert sink.pending() > 0
        received = bytearray()
        expected = sum(4 + len(f) for f in frames)
        while len(received) < expected:
            try:
                received += await loop.sock_recv(theirs, 1 << 20)
            except BlockingIOError:
                await asyncio.sleep(0.001)
        await asyncio.wait_for(writer, 5)
        assert sink.pending() == 0
        at = 0
        for frame in frames:
            (length,) = struct.unpack_from(">I", received, at)
            assert bytes(received[at + 4 : at + 4 + length]) == frame
            at += 4 + length
        connection.close()
        assert sink.closed
        theirs.close()

    asyncio.run(asyncio.wait_for(run(), WAIT_S))
