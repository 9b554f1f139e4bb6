"""One consensus stream per pair of servers, shared by every tablet.

Each tablet's ``GrpcTransport`` hands its outbound AppendEntries (heartbeats included) here,
already serialized, with a callback for the answer, and its vote requests (``send_vote``),
which go ahead of the AppendEntries in the next batch. ``PeerStreams`` keeps one long-lived
``ConsensusPeerStream`` to each destination server and writes everything queued for it during
an event-loop turn as one ``ConsensusBatchRequestPB``; the destination answers each request
when it is durable, its answers gathered per turn the same way, matched to their callbacks by
call id. So a server with thousands of tablets sends one gRPC message per peer server per turn,
not one per tablet, and opens one stream per peer, not one per tablet and peer (issue "Thousands
of tablet replicas per server": about 120 µs of CPU per gRPC message on this machine).

Delivery is best effort, as Raft expects: a request that cannot be queued (the queue is full),
or whose stream breaks before its answer, gets its callback called with the error and is lost;
the Raft core sends again. Requests to one destination are written in the order they were
queued, so one tablet's AppendEntries arrive in order.

The receiving side is ``serve``: each request of a batch is handed to its tablet's transport
as it arrives (so one tablet's requests reach its core in order), and its answer, once durable,
joins the next answer batch. A request for a tablet that is not running here is answered with
that error, not by ending the stream.

This module owns the streams and their tasks; it never interprets a request or an answer.
``run`` is started by the owner (a server, or a transport that has no server) and ends by
cancellation (STYLE.md 15).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias, TypeVar

import grpc

from nyala import _native
from nyala._proto import consensus_pb2
from nyala.consensus.runtime import wire
from nyala.consensus.runtime.peer_channel import (
    DiallerConnection,
    batch_request_frame,
    frame_bytes_max,
    open_peer_channel,
)
from nyala.errors import NetworkError, NotSupportedError, NyalaError, ServiceUnavailableError
from nyala.rpc.channel import ServerProxy
from nyala.rpc.credentials import channel_tls_config
from nyala.rpc.errors import error_to_pb, raise_for_response, split_host_port
from nyala.rpc.settings import RpcSettings

log = logging.getLogger(__name__)

Answer = consensus_pb2.ConsensusResponsePB | BaseException
OnAnswer = Callable[[Answer], None]
VoteAnswer = consensus_pb2.VoteResponsePB | BaseException
OnVoteAnswer = Callable[[VoteAnswer], None]
#: Answers one vote request on the serving side (``ConsensusService``'s RequestVote).
HandleVote = Callable[[consensus_pb2.VoteRequestPB], Awaitable[consensus_pb2.VoteResponsePB]]
_Votes: TypeAlias = list[tuple[int, consensus_pb2.VoteRequestPB]]
_Item = TypeVar("_Item")
_Reply = TypeVar("_Reply")
_OnReply: TypeAlias = Callable[[_Reply | BaseException], None]
# Writes one batch: its requests' call ids, the serialized requests, and its votes.
_SendBatch: TypeAlias = Callable[[list[int], list[wire.WireRequest], _Votes], Awaitable[None]]
_StreamCall: TypeAlias = (
    "grpc.aio.StreamStreamCall[consensus_pb2.ConsensusBatchRequestPB, "
    "consensus_pb2.ConsensusBatchResponsePB]"
)


@dataclass(frozen=True, slots=True)
class PeerStreamsOptions:
    """Limits of the per-server-pair streams, with their units."""

    stream_lifetime_ms: int = 600_000  # deadline of one stream; then it is reopened
    reconnect_delay_ms: int = 100  # pause before reopening a failed stream
    queue_requests_max: int = 8_192  # requests queued for one peer and not yet written
    batch_bytes_max: int = 8 * 1024 * 1024  # serialized requests in one batch message
    # Requests written to one peer and not yet answered (they wait for its disk); beyond it
    # queued requests stay queued (and new ones are refused once the queue is full).
    unanswered_requests_max: int = 16_384
    # Send over a peer's channel where it serves one (``peer_channel``), else the gRPC stream.
    use_channel: bool = True
    # Deadline of asking a peer for its channel, and of connecting to it.
    channel_connect_timeout_ms: int = 2_000


class UpdateTarget(Protocol):
    """What ``serve`` needs of a tablet's transport (``GrpcTransport``)."""

    def submit_update(self, pb: wire.ReceivedRequest, decode_batch: wire.BatchDecoder) -> Any:
        """Hands the request to the core now; returns what ``answer_update`` takes."""
        ...

    def answer_update(
        self,
        pending: Any,
        reply: Callable[[consensus_pb2.ConsensusResponsePB | NyalaError], None],
        handoff: AnswerHandoff | None = None,
    ) -> None:
        """Calls ``reply`` with the answer once what the request appended is durable, or with
        the error that kept the tablet from answering; or, given ``handoff``, may hand the
        answer to its log to write once durable (``AnswerHandoff.send``)."""
        ...

    def follow_append(
        self, parsed: _native.ParsedAppend, sink: _native.AnswerSink, call_id: int, late: LateAnswer
    ) -> bool:
        """Appends the request and hands its answer to the log to write to ``sink`` if the
        replica may take it that way; False if it did nothing (``submit_update`` then)."""
        ...


LateAnswer: TypeAlias = Callable[[int, consensus_pb2.ConsensusResponsePB], None]
"""Sends the answer to a request (by call id) from the event loop: one its tablet handed to
its log and took back (``GrpcTransport.follow_append``)."""


AnswerWhenDurable: TypeAlias = Callable[[_native.AnswerSink, bytes], _native.DurableAnswer]
"""A log's ``answer_when_durable``: writes the frame to the sink once what was appended so
far is durable, from the thread that made it so."""


class AnswerHandoff:
    """One served request whose answer its tablet may hand to its log, to be written to the
    connection by the WAL committer whose sync makes the request's entries durable: the
    answer goes out without waiting for the event loop to wake up, learn of the sync and
    build it (docs/performance.md, "A follower's answer from the committer"). Only a stream
    on a plain peer channel connection has a sink to write to."""

    __slots__ = ("_call_id", "_stream")

    def __init__(self, stream: _ServedStream, call_id: int) -> None:
        self._stream = stream
        self._call_id = call_id

    def send(
        self, answer: consensus_pb2.ConsensusResponsePB, answer_when_durable: AnswerWhenDurable
    ) -> _native.DurableAnswer | None:
        """Hands ``answer`` (what it says once the request's entries are durable) to the log;
        the request no longer counts as unanswered. None if the stream has ended."""
        stream = self._stream
        sink = stream.sink
        if stream.closed or sink is None:
            return None
        batch = consensus_pb2.ConsensusBatchResponsePB(call_ids=[self._call_id], responses=[answer])
        handed = answer_when_durable(sink, batch.SerializeToString())
        stream.handed_off()
        return handed

    def late(self, answer: consensus_pb2.ConsensusResponsePB | NyalaError) -> None:
        """The answer the log did not write after all (taken back when it took too long),
        sent from the event loop instead."""
        self._stream._reply(self._call_id, answer)


@dataclass(slots=True)
class _Peer:
    """What is queued for one destination server, and the answers it owes."""

    uuid: str
    address: str
    queue: deque[tuple[int, wire.WireRequest]] = field(default_factory=deque)
    votes: deque[tuple[int, consensus_pb2.VoteRequestPB]] = field(default_factory=deque)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: dict[int, OnAnswer] = field(default_factory=dict)  # call id -> callback
    vote_waiting: dict[int, OnVoteAnswer] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    over_channel: bool = False  # the current connection is the peer channel, not gRPC


class PeerStreams:
    """The consensus streams from this server to each peer server (module docstring)."""

    def __init__(
        self,
        uuid: str,
        *,
        settings: RpcSettings | None = None,
        options: PeerStreamsOptions | None = None,
    ) -> None:
        self.uuid = uuid
        self._settings = settings or RpcSettings()
        self._opts = options or PeerStreamsOptions()
        self._peers: dict[str, _Peer] = {}
        # By (address, UUID): a channel checks the peer's certificate names the UUID.
        self._proxies: dict[tuple[str, str], ServerProxy] = {}
        self._call_ids = itertools.count(1)
        self._group: asyncio.TaskGroup | None = None
        self.requests_dropped = 0
        # Batches and requests written, by transport: "channel" or "grpc".
        self.batches_sent = {"channel": 0, "grpc": 0}
        self.requests_sent = {"channel": 0, "grpc": 0}
        self.votes_sent = {"channel": 0, "grpc": 0}
        self.channel_fallbacks = 0  # a peer announced a channel that could not be reached
        self._tls_config: _native.TlsConfig | None = None

    async def run(self) -> None:
        """Serves until cancelled; then fails what is still waiting and closes the channels."""
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                await asyncio.get_running_loop().create_future()  # until cancelled
        finally:
            self._group = None
            stopped = ServiceUnavailableError("the consensus streams stopped")
            for peer in self._peers.values():
                self._fail_waiting(peer, stopped)
                peer.queue.clear()
            self._peers.clear()
            proxies, self._proxies = self._proxies, {}
            for proxy in proxies.values():
                with contextlib.suppress(Exception):
                    await proxy.close()

    def send(
        self, dest_uuid: str, address: str, request: wire.WireRequest, on_answer: OnAnswer
    ) -> None:
        """Queues a serialized ``ConsensusRequestPB`` for ``dest_uuid`` at ``address``;
        ``on_answer`` gets its ``ConsensusResponsePB``, or the error that lost it."""
        self._queue(dest_uuid, address, lambda p: (p.queue, p.waiting), request, on_answer)

    def send_vote(
        self,
        dest_uuid: str,
        address: str,
        request: consensus_pb2.VoteRequestPB,
        on_answer: OnVoteAnswer,
    ) -> None:
        """Queues a vote request (or pre-vote) for ``dest_uuid`` at ``address``, to go in the
        next batch ahead of its AppendEntries; ``on_answer`` gets its ``VoteResponsePB``, or
        the error that lost it. A failover sends hundreds at once to each survivor: one unary
        RPC each cost the survivors the CPU their elections were waiting for."""
        self._queue(dest_uuid, address, lambda p: (p.votes, p.vote_waiting), request, on_answer)

    def _queue(
        self,
        dest_uuid: str,
        address: str,
        queues: Callable[[_Peer], tuple[deque[tuple[int, _Item]], dict[int, _OnReply[_Reply]]]],
        item: _Item,
        on_answer: _OnReply[_Reply],
    ) -> None:
        """Queues ``item`` in the destination's queue that ``queues`` picks (with the dict of
        callbacks waiting for those answers), or tells ``on_answer`` why it cannot."""
        peer = self._peer(dest_uuid, address)
        if peer is None:
            why = "the consensus streams are not running"
        else:
            queue, waiting = queues(peer)
            if len(queue) < self._opts.queue_requests_max:
                call_id = next(self._call_ids)
                waiting[call_id] = on_answer
                queue.append((call_id, item))
                peer.ready.set()  # the writer wakes next turn: this turn's sends go out together
                return
            why = f"queue to {dest_uuid} is full"
        self.requests_dropped += 1
        on_answer(ServiceUnavailableError(why))

    def _peer(self, dest_uuid: str, address: str) -> _Peer | None:
        """The destination's queue and stream (started here when new, restarted when it moved
        to ``address``); None when the streams are not running."""
        group = self._group
        if group is None:
            return None
        peer = self._peers.get(dest_uuid)
        if peer is None or peer.address != address:
            if peer is not None:
                self._retire(peer)
            peer = self._peers[dest_uuid] = _Peer(dest_uuid, address)
            peer.task = group.create_task(self._stream_loop(peer), name=f"peer-{dest_uuid}")
        return peer

    def _channel_tls(self) -> _native.TlsConfig | None:
        """The client side of the channels' mutual TLS (None on an insecure cluster), made
        once: loading the CA and the key is most of a connection's setup."""
        tls = self._settings.tls
        if tls is None:
            return None
        if self._tls_config is None:
            self._tls_config = channel_tls_config(tls, server=False)
        return self._tls_config

    def connections(self) -> dict[str, int]:
        """Peers whose current connection is the channel, and those on the gRPC stream."""
        channel = sum(1 for peer in self._peers.values() if peer.over_channel)
        return {"channel": channel, "grpc": len(self._peers) - channel}

    def _retire(self, peer: _Peer) -> None:
        """The peer moved to another address: its stream ends, what it owes is lost."""
        if peer.task is not None:
            peer.task.cancel()
        self._fail_waiting(peer, NetworkError(f"{peer.uuid} moved from {peer.address}"))

    def proxy(self, address: str, peer_uuid: str) -> ServerProxy:
        """The server's one channel to ``peer_uuid`` at ``address`` (closed when ``run`` ends):
        every tablet's votes and leader-election nudges to that peer use it too, where a
        channel per tablet and peer meant hundreds of channels (and TLS handshakes) made
        during a failover."""
        proxy = self._proxies.get((address, peer_uuid))
        if proxy is None:
            proxy = ServerProxy(address, self._settings, server_uuid=peer_uuid)
            self._proxies[(address, peer_uuid)] = proxy
        return proxy

    async def _stream_loop(self, peer: _Peer) -> None:
        """Keeps one connection to ``peer`` open while there is anything to send: its peer
        channel where it has one, else a ConsensusPeerStream."""
        delay_s = self._opts.reconnect_delay_ms / 1000
        while True:
            await peer.ready.wait()
            try:
                await self._connect_and_run(peer)
            except* Exception as failure:
                error = _first_error(failure.exceptions)
                log.debug("stream to %s@%s ended: %r", peer.uuid, peer.address, error)
                self._fail_waiting(peer, error)
            await asyncio.sleep(delay_s)

    async def _connect_and_run(self, peer: _Peer) -> None:
        """One connection's life: writes and reads until it fails (which always raises)."""
        channel = await self._open_channel(peer) if self._opts.use_channel else None
        if channel is not None:
            peer.over_channel = True
            log.info("consensus to %s at %s goes over its peer channel", peer.uuid, peer.address)

            async def send(
                call_ids: list[int], requests: list[wire.WireRequest], votes: _Votes
            ) -> None:
                # Framed as it is encoded; entry batches go from where they lie.
                encoded = [(call_id, vote.SerializeToString()) for call_id, vote in votes]
                frame = batch_request_frame(peer.uuid, self.uuid, call_ids, requests, encoded)
                channel.write(frame)
                await channel.drain()

            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(self._write(peer, send))
                    # The answers go to ``_take_answers`` as they come; this ends with the
                    # connection.
                    group.create_task(channel.wait_ended())
            finally:
                channel.close()
            return
        peer.over_channel = False
        proxy = self.proxy(peer.address, peer.uuid)
        call: _StreamCall = proxy.consensus.ConsensusPeerStream(
            timeout=self._opts.stream_lifetime_ms / 1000
        )

        async def write(
            call_ids: list[int], requests: list[wire.WireRequest], votes: _Votes
        ) -> None:
            batch = consensus_pb2.ConsensusBatchRequestPB(
                dest_uuid=peer.uuid,
                caller_uuid=self.uuid,
                requests=[wire.request_bytes(r) for r in requests],
                call_ids=call_ids,
                votes=[vote for _, vote in votes],
                vote_call_ids=[call_id for call_id, _ in votes],
            )
            await call.write(batch)

        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._write(peer, write))
                group.create_task(self._read(peer, call))
        finally:
            call.cancel()

    async def _open_channel(self, peer: _Peer) -> DiallerConnection | None:
        """A connection to ``peer``'s channel (``peer_channel``), or None if it serves none or
        cannot be reached there (the gRPC stream then carries the batches). Raises if the peer
        cannot be asked: its stream would fail the same way."""
        proxy = self.proxy(peer.address, peer.uuid)
        timeout_ms = self._opts.channel_connect_timeout_ms
        try:
            answer = await proxy.call(
                proxy.consensus.GetPeerChannel,
                consensus_pb2.PeerChannelRequestPB(dest_uuid=peer.uuid),
                timeout_ms=timeout_ms,
            )
        except NotSupportedError:
            return None  # a server that predates the channel
        tls = self._settings.tls
        if answer.port == 0 or (tls is not None and not tls.cert_pem):
            return None  # none there, or no certificate here to show it
        host = split_host_port(peer.address)[0]
        try:
            return await open_peer_channel(
                host,
                answer.port,
                timeout_ms=timeout_ms,
                on_answers=functools.partial(self._take_answers, peer),
                frame_bytes_max=frame_bytes_max(self._settings.message_bytes_max),
                tls=self._channel_tls(),
                server_uuid=peer.uuid,
            )
        except NetworkError as exc:
            self.channel_fallbacks += 1
            log.warning("%s; using the gRPC stream to %s", exc, peer.uuid)
            return None

    async def _write(self, peer: _Peer, send: _SendBatch) -> None:
        """Writes what is queued for ``peer``, a batch (up to ``batch_bytes_max``) at a time,
        with ``send(call_ids, requests, votes)``: every vote queued, then AppendEntries while
        fewer than ``unanswered_requests_max`` are unanswered (votes are few and small, and
        are not held back by a follower's slow disk)."""
        bytes_max = self._opts.batch_bytes_max
        unanswered_max = self._opts.unanswered_requests_max
        while True:
            appends_held = not peer.queue or len(peer.waiting) - len(peer.queue) >= unanswered_max
            if appends_held and not peer.votes:
                peer.ready.clear()
                await peer.ready.wait()
                continue
            votes: _Votes = list(peer.votes)
            peer.votes.clear()
            call_ids: list[int] = []
            requests: list[wire.WireRequest] = []
            size = 0
            while (
                not appends_held
                and peer.queue
                and (size == 0 or size + wire.request_size(peer.queue[0][1]) <= bytes_max)
            ):
                call_id, request = peer.queue.popleft()
                requests.append(request)
                call_ids.append(call_id)
                size += wire.request_size(request)
            transport = "channel" if peer.over_channel else "grpc"
            self.batches_sent[transport] += 1
            self.requests_sent[transport] += len(call_ids)
            self.votes_sent[transport] += len(votes)
            await send(call_ids, requests, votes)

    async def _read(
        self, peer: _Peer, answers: AsyncIterable[consensus_pb2.ConsensusBatchResponsePB]
    ) -> None:
        async for answer in answers:
            self._take_answers(peer, answer)
        raise NetworkError(f"the stream to {peer.uuid} ended")

    def _take_answers(self, peer: _Peer, answer: consensus_pb2.ConsensusBatchResponsePB) -> None:
        """Hands one answer batch of ``peer`` to the callbacks of what it answers; raises if
        the whole stream was refused."""
        if answer.HasField("error"):
            raise_for_response(answer)
        for call_id, response in zip(answer.call_ids, answer.responses, strict=True):
            on_answer = peer.waiting.pop(call_id, None)
            if on_answer is not None:
                on_answer(response)
        for call_id, vote in zip(answer.vote_call_ids, answer.vote_responses, strict=True):
            on_vote = peer.vote_waiting.pop(call_id, None)
            if on_vote is not None:
                on_vote(vote)
        if peer.queue:
            peer.ready.set()  # answers free room for more unanswered requests

    # --- serving the peers' streams --------------------------------------------------------

    async def serve(
        self,
        batches: AsyncIterator[wire.PeerBatch],
        route: Callable[[str], UpdateTarget],
        decode_batch: wire.BatchDecoder,
        vote: HandleVote,
        sink: _native.AnswerSink | None = None,
    ) -> AsyncIterator[consensus_pb2.ConsensusBatchResponsePB]:
        """Answers one peer's ConsensusPeerStream (whose batches' ``dest_uuid`` the RPC layer
        checked): ``route`` finds a tablet's transport, or raises the refusal that becomes that
        request's answer; ``vote`` answers a vote request, or raises its refusal. Given the
        connection's ``sink``, tablets may write answers there themselves (``AnswerHandoff``);
        the answers yielded are the rest."""
        group = self._group
        if group is None:
            raise ServiceUnavailableError(f"server {self.uuid} is not serving consensus")
        stream = _ServedStream(
            route, decode_batch, vote, group, self._opts.unanswered_requests_max, sink
        )
        reader = group.create_task(stream.read(batches))
        try:
            while True:
                await stream.wake.wait()
                stream.wake.clear()
                if stream.ready or stream.ready_votes:
                    yield stream.take_answers()
                if reader.done() and not (stream.unanswered or stream.ready or stream.ready_votes):
                    if stream.failure is not None:
                        raise stream.failure
                    return
        finally:
            reader.cancel()
            stream.closed = True  # answers still to come are dropped

    def _fail_waiting(self, peer: _Peer, error: BaseException) -> None:
        """Everything written or queued to ``peer`` is lost: its callbacks learn why."""
        waiting, peer.waiting = peer.waiting, {}
        vote_waiting, peer.vote_waiting = peer.vote_waiting, {}
        peer.queue.clear()
        peer.votes.clear()
        self.requests_dropped += len(waiting) + len(vote_waiting)
        for on_answer in waiting.values():
            on_answer(error)
        for on_vote in vote_waiting.values():
            on_vote(error)


def _first_error(errors: tuple[BaseException, ...]) -> BaseException:
    for error in errors:
        if isinstance(error, NyalaError):
            return error
    return errors[0] if errors else NetworkError("stream ended")


class _ServedStream:
    """The state of one served ConsensusPeerStream: answers ready to go, and how many requests
    are still unanswered. A request's answer arrives by callback (``answer_update``), not by
    a task per request."""

    def __init__(
        self,
        route: Callable[[str], UpdateTarget],
        decode_batch: wire.BatchDecoder,
        vote: HandleVote,
        group: asyncio.TaskGroup,
        unanswered_max: int,
        sink: _native.AnswerSink | None = None,
    ) -> None:
        self.sink = sink
        self._route = route
        self._decode_batch = decode_batch
        self._vote = vote
        self._group = group  # runs each vote's handler (it waits for the core's answer)
        self._unanswered_max = unanswered_max
        self.ready: deque[tuple[int, consensus_pb2.ConsensusResponsePB]] = deque()
        self.ready_votes: deque[tuple[int, consensus_pb2.VoteResponsePB]] = deque()
        self.unanswered = 0
        self.reading_done = False
        self.closed = False
        self.wake = asyncio.Event()
        self._room = asyncio.Event()
        self.failure: BaseException | None = None

    async def read(self, batches: AsyncIterator[wire.PeerBatch]) -> None:
        """Hands every request to its tablet as it arrives; waits (and so stops reading: gRPC
        flow control holds the sender back) while too many are unanswered."""
        try:
            async for batch in batches:
                for call_id, vote in zip(batch.vote_call_ids, batch.votes, strict=True):
                    self.unanswered += 1
                    self._group.create_task(self._answer_vote(call_id, vote))
                for call_id, data in zip(batch.call_ids, batch.requests, strict=True):
                    while self.unanswered >= self._unanswered_max:
                        self._room.clear()
                        await self._room.wait()
                    self._submit(call_id, data)
        except Exception as exc:  # ends the stream after the answers already due
            self.failure = exc
        finally:
            self.reading_done = True
            self.wake.set()

    def _submit(self, call_id: int, data: bytes) -> None:
        sink = self.sink
        if sink is not None:
            # The common request, entries from a leader followed now, needs no Python per
            # request beyond this: appended and answered by the extension.
            parsed = _native.parse_append_request(data)
            if parsed is not None:
                try:
                    target = self._route(parsed.tablet_id)
                except NyalaError as exc:
                    self._answer(call_id, consensus_pb2.ConsensusResponsePB(error=error_to_pb(exc)))
                    return
                if target.follow_append(parsed, sink, call_id, self._answer):
                    return
        try:
            received = wire.append_request_from_wire(data)
            target = self._route(received.tablet_id)
            pending = target.submit_update(received, self._decode_batch)
        except NyalaError as exc:
            self._answer(call_id, consensus_pb2.ConsensusResponsePB(error=error_to_pb(exc)))
            return
        self.unanswered += 1
        handoff = None if self.sink is None else AnswerHandoff(self, call_id)
        target.answer_update(pending, functools.partial(self._settled, call_id), handoff)

    def handed_off(self) -> None:
        """A request's answer went to its log to write (``AnswerHandoff.send``)."""
        self._release()
        if self.reading_done and not self.unanswered:
            self.wake.set()  # the stream may end

    async def _answer_vote(self, call_id: int, request: consensus_pb2.VoteRequestPB) -> None:
        try:
            answer = await self._vote(request)
        except Exception as exc:  # the refusal is the answer (a task of the server's group)
            if not isinstance(exc, NyalaError):
                log.warning("vote request for %s failed: %r", request.tablet_id, exc)
            answer = consensus_pb2.VoteResponsePB(error=error_to_pb(exc))
        self._release()
        if not self.closed:
            self.ready_votes.append((call_id, answer))
            self.wake.set()

    def _settled(
        self, call_id: int, answer: consensus_pb2.ConsensusResponsePB | NyalaError
    ) -> None:
        self._release()
        self._reply(call_id, answer)

    def _release(self) -> None:
        """One request no longer counts as unanswered: reading may go on."""
        self.unanswered -= 1
        self._room.set()

    def _reply(self, call_id: int, answer: consensus_pb2.ConsensusResponsePB | NyalaError) -> None:
        """Queues the answer to send, an error as its refusal."""
        if isinstance(answer, NyalaError):
            answer = consensus_pb2.ConsensusResponsePB(error=error_to_pb(answer))
        self._answer(call_id, answer)

    def _answer(self, call_id: int, answer: consensus_pb2.ConsensusResponsePB) -> None:
        if self.closed:
            return
        self.ready.append((call_id, answer))
        self.wake.set()

    def take_answers(self) -> consensus_pb2.ConsensusBatchResponsePB:
        """Every answer ready now, as one batch."""
        batch = consensus_pb2.ConsensusBatchResponsePB()
        while self.ready:
            call_id, answer = self.ready.popleft()
            batch.call_ids.append(call_id)
            batch.responses.append(answer)
        while self.ready_votes:
            call_id, vote = self.ready_votes.popleft()
            batch.vote_call_ids.append(call_id)
            batch.vote_responses.append(vote)
        return batch
