"""The peer channel: ``PeerStreams``' batches between two servers on a plain TCP connection.

A grpc.aio stream costs 7-10 times a length-prefixed message on a plain asyncio connection
(docs/performance.md, "What a consensus message costs"), and the consensus batches between
two servers are most of a replicated write's messages. So a server also serves them here, and
a peer that learns the port (``GetPeerChannel``, asked before each connection) sends them here
instead of on ``ConsensusPeerStream``. The batches, their order, their
answers and the refusals are those of the stream: only the framing differs.

The wire, on one connection:

- the dialler writes ``MAGIC`` once;
- then each side writes frames: a 4-byte big-endian length and that many bytes, a serialized
  ``ConsensusBatchRequestPB`` from the dialler, a ``ConsensusBatchResponsePB`` from the
  server.

On a secure cluster the connection is mutual TLS with the cluster CA, as every RPC is: the
dialler checks that the server's certificate names the peer's UUID, and the server that the
dialler's names a server (the role ``ConsensusPeerStream`` requires); a dialler without such a
certificate gets one ``NOT_AUTHORIZED`` answer and the connection closes. The TLS is the
extension's (``rpc.tls_socket``), not asyncio's: the server accepts and shakes hands itself.

The server checks each batch's ``dest_uuid``. A refused stream gets one answer whose ``error``
is set, then the connection closes, as ``ConsensusPeerStream`` ends. The server also closes a
connection whose magic is wrong, whose frame is longer than ``frame_bytes_max``, or whose
batch does not parse (logged; nothing else is touched).

A tablet server's clients send their writes on the same port (issue 28: one transport, not
two). Such a connection opens with ``WRITE_MAGIC`` instead; then the client writes frames of
serialized ``WriteMultiRequestPB`` and the server answers each with a frame of
``WriteMultiResponsePB``, in order, one at a time (the server reads the next request once it
has answered the last). On a secure cluster the connection is the same mutual TLS, with the
user's certificate in the client's place; ``ServeWrite`` is given the certificate and checks
each call as the guard of the gRPC method would (``rpc.auth.channel_caller``).

This module owns the listening socket and the connections' tasks; what a batch means is
``PeerStreams.serve``'s business, what a write means ``ServeWrite``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from google.protobuf.message import DecodeError, Message

from nyala import _native
from nyala._proto import consensus_pb2
from nyala.consensus.runtime.wire import PeerBatch, WireRequest
from nyala.errors import InvalidArgumentError, NetworkError, NotAuthorizedError, NyalaError
from nyala.rpc.channel_wire import LENGTH, MAGIC, WRITE_MAGIC
from nyala.rpc.credentials import not_a_server, peer_server_name
from nyala.rpc.errors import error_to_pb
from nyala.rpc.service import check_dest_uuid
from nyala.rpc.tls_socket import SocketTlsTransport, tls_handshake

log = logging.getLogger(__name__)

# Frames up to this size are written as one buffer (one send); larger ones as two, which
# saves copying the batch.
_JOIN_BYTES_MAX = 256 * 1024
# Bytes waiting in a connection's answer sink at which its writers wait for room (asyncio's
# transports pause their protocol at 64 KiB).
_SINK_PENDING_BYTES_MAX = 64 * 1024
# A request's entry batch this large is written from where it lies (one more send, no copy).
_IN_PLACE_BYTES_MIN = 64 * 1024

#: How long a dialler has to complete a secure channel's handshake.
HANDSHAKE_TIMEOUT_S = 10.0

#: Room over a peer's largest gRPC message for the batch around it.
_FRAME_SLACK_BYTES = 64 * 1024


def frame_bytes_max(message_bytes_max: int) -> int:
    """The largest frame either side takes: a batch holds at least one request, which may
    be as large as a gRPC message (``RpcSettings.message_bytes_max``)."""
    return message_bytes_max + _FRAME_SLACK_BYTES


ServeBatches = Callable[
    [AsyncIterator[PeerBatch], "_native.AnswerSink | None"],
    AsyncIterator[consensus_pb2.ConsensusBatchResponsePB],
]
"""Answers one peer's batches (``ConsensusService.serve_peer_batches``); given the
connection's sink, tablets may write some answers there themselves."""

ServeWrite = Callable[[bytes | memoryview, dict[str, Any] | None], Awaitable[bytes]]
"""Answers one client call: a serialized ``WriteMultiRequestPB`` and the caller's verified
certificate (``rpc.tls_socket.peercert_of``; None on an insecure channel) in, its serialized
``WriteMultiResponsePB`` out, every failure an answer (``TabletService.serve_write_frame``)."""


# The field number of ConsensusBatchRequestPB.requests.
_REQUEST_FIELD = 3


class SplitBatch(NamedTuple):
    """A received ``ConsensusBatchRequestPB`` split here rather than parsed by protobuf: its
    own fields parsed, and each request copied once out of the frame (whose buffer the
    connection reuses). Protobuf copied the whole frame into its message, then each request
    again when it was read."""

    dest_uuid: str
    call_ids: Sequence[int]
    requests: list[bytes]
    votes: Sequence[consensus_pb2.VoteRequestPB]
    vote_call_ids: Sequence[int]


def split_batch_request(frame: bytes | memoryview) -> SplitBatch:
    """The ``ConsensusBatchRequestPB`` in ``frame``; ``InvalidArgumentError`` if it is not
    one, or if its requests and call ids do not pair up."""
    rest, ranges = _native.split_proto_repeated(frame, _REQUEST_FIELD)
    header = _parse(consensus_pb2.ConsensusBatchRequestPB, rest)
    if len(header.call_ids) != len(ranges):
        raise InvalidArgumentError(
            f"a peer channel batch has {len(ranges)} requests and {len(header.call_ids)} call ids"
        )
    view = memoryview(frame)
    requests = [bytes(view[start:end]) for start, end in ranges]
    if len(header.vote_call_ids) != len(header.votes):
        raise InvalidArgumentError(
            f"a peer channel batch has {len(header.votes)} votes and "
            f"{len(header.vote_call_ids)} vote call ids"
        )
    return SplitBatch(
        header.dest_uuid, header.call_ids, requests, header.votes, header.vote_call_ids
    )


def batch_request_frame(
    dest_uuid: str,
    caller_uuid: str,
    call_ids: list[int],
    requests: list[WireRequest],
    votes: Sequence[tuple[int, bytes]] = (),
) -> list[bytes | memoryview]:
    """One frame holding the ``ConsensusBatchRequestPB`` of these requests and of ``votes``
    (call id, serialized ``VoteRequestPB``), encoded by the extension
    (``_native.batch_request_frame``) rather than by protobuf (which copied every request
    twice, and framing it a third time), as the pieces to write in order: the small ones
    joined, and each AppendEntries' batch of ``_IN_PLACE_BYTES_MIN`` or more in place, so
    that its bytes are copied only by the socket write."""
    return _native.batch_request_frame(
        dest_uuid, caller_uuid, call_ids, requests, votes, _IN_PLACE_BYTES_MIN
    )


_Message = TypeVar("_Message", bound=Message)


def _parse(message_class: type[_Message], data: bytes | memoryview) -> _Message:
    """``data`` as a ``message_class``; ``InvalidArgumentError`` if it is not one."""
    try:
        return message_class.FromString(data)  # type: ignore[arg-type]  # any buffer parses
    except DecodeError:
        raise InvalidArgumentError(
            f"a peer channel frame of {len(data)} bytes is not a {message_class.__name__}"
        ) from None


class PeerChannelServer:
    """Serves peers' consensus batches on a TCP port (module docstring)."""

    def __init__(
        self,
        server_uuid: str,
        serve: ServeBatches,
        *,
        frame_bytes_max: int,
        tls: _native.TlsConfig | None = None,
        serve_write: ServeWrite | None = None,
    ) -> None:
        self.server_uuid = server_uuid
        self._serve = serve
        self._serve_write = serve_write
        self._frame_bytes_max = frame_bytes_max
        self._tls = tls  # the server side of mutual TLS (rpc.credentials.channel_tls_config)
        self._server: asyncio.Server | None = None
        self._listener: socket.socket | None = None  # a secure channel's (it accepts itself)
        self._connections: set[asyncio.Task[None]] = set()
        self.port = 0
        self.connections_refused = 0  # wrong magic, oversized frame, unparseable batch
        self.write_calls = 0  # client calls answered (WRITE_MAGIC connections)

    async def start(self, host: str, port: int) -> int:
        """Listens on ``host``:``port`` (0: any free port); returns the port."""
        loop = asyncio.get_running_loop()
        if self._tls is None:
            self._server = await loop.create_server(
                lambda: _FrameConnection(self._frame_bytes_max, self._connected), host, port
            )
            self.port = self._server.sockets[0].getsockname()[1]
            return self.port
        # TLS by the extension (rpc.tls_socket), not asyncio's TLS transport: this server
        # accepts and shakes hands itself.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.create_server((host, port), family=family)
        listener.setblocking(False)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._track(loop.create_task(self._accept(listener)))
        return self.port

    def close(self) -> None:
        """Stops listening and ends every connection (their unanswered requests are lost, as
        when a gRPC stream breaks; the peers' Raft sends again)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._connections):
            task.cancel()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self.port = 0

    def _track(self, task: asyncio.Task[None]) -> None:
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    def _connected(self, connection: _FrameConnection) -> None:
        self._track(asyncio.get_running_loop().create_task(self._handle(connection)))

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as exc:  # out of descriptors, say: the next accept may succeed
                log.warning("peer channel: accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._track(loop.create_task(self._shake_hands(sock)))

    async def _shake_hands(self, sock: socket.socket) -> None:
        assert self._tls is not None
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                session = await tls_handshake(sock, self._tls)
        except (OSError, TimeoutError) as exc:  # ConnectionError: the TLS handshake failed
            log.debug("peer channel: handshake on %s failed: %r", sock, exc)  # socket closed
            return
        connection = _FrameConnection(self._frame_bytes_max, self._connected)
        SocketTlsTransport(asyncio.get_running_loop(), sock, session, connection)

    async def _handle(self, connection: _FrameConnection) -> None:
        peer = connection.get_extra_info("peername")
        try:
            hello = await connection.next_frame()
            if hello is not None and self._serve_write is not None and bytes(hello) == WRITE_MAGIC:
                await self._answer_writes(connection, self._serve_write)
                return
            if hello is None or bytes(hello) != MAGIC:
                self.connections_refused += 1
                log.warning("peer channel: %s did not open with the channel's magic; closed", peer)
                return
            try:
                if self._tls is not None:
                    why = not_a_server(connection.get_extra_info("peercert"))
                    if why is not None:
                        raise NotAuthorizedError(f"the peer channel {why} ({peer})")
                # A plain connection's writes go through a sink that WAL committers write
                # answers to as well; a secure one's through its TLS session.
                sink = connection.take_writes() if self._tls is None else None
                async for answers in self._serve(self._batches(connection), sink):
                    connection.write_frame(answers.SerializeToString())
                    await connection.drain()
            except NyalaError as exc:
                if isinstance(exc, InvalidArgumentError | NotAuthorizedError):
                    self.connections_refused += 1
                    log.warning("peer channel: closed the connection from %s: %s", peer, exc)
                refusal = consensus_pb2.ConsensusBatchResponsePB(error=error_to_pb(exc))
                connection.write_frame(refusal.SerializeToString())
                await connection.drain()
        except ConnectionError:  # the TLS session's failures included
            pass  # the peer went away; what it was owed is lost, as on a broken stream
        finally:
            connection.close()

    async def _answer_writes(self, connection: _FrameConnection, serve: ServeWrite) -> None:
        """Answers a client's write calls, each before the next is read, until it closes (or
        sends a frame over the limit: closed, as a peer's would be)."""
        peercert = None if self._tls is None else connection.get_extra_info("peercert")
        while True:
            try:
                frame = await connection.next_frame()
            except InvalidArgumentError as exc:
                self.connections_refused += 1
                log.warning("peer channel: closed a client's connection: %s", exc)
                return
            if frame is None:
                return
            answer = await serve(frame, peercert)
            del frame  # a large one is a view of the connection's buffer
            self.write_calls += 1
            connection.write_frame(answer)
            await connection.drain()

    async def _batches(self, connection: _FrameConnection) -> AsyncIterator[PeerBatch]:
        while True:
            data = await connection.next_frame()
            if data is None:
                return
            # Split (its requests copied out) before the next frame is asked for, which may
            # reuse its buffer.
            batch = split_batch_request(data)
            del data
            check_dest_uuid(batch.dest_uuid, self.server_uuid)
            yield batch


class _FrameConnection(asyncio.BufferedProtocol):
    """The server's side of one channel connection: the magic, then frames, read straight
    from the socket (or from TLS, which decrypts into them) into buffers of this connection.

    A ``StreamReader`` copied every byte twice on its way (into its buffer, then out of it
    into the frame's ``bytes``), after the transport had allocated a fresh ``bytes`` for each
    read. Here small frames are read into a scratch buffer, several per read, and copied out;
    a frame too large for it is read in place into a buffer the connection keeps and reuses,
    so a follower receiving a write load neither copies the batches nor touches fresh memory
    for them. ``next_frame`` hands out a view of that buffer, valid until the next call (the
    caller parses it first). Reading pauses while such a frame, or ``QUEUED_BYTES_MAX`` of
    small ones, wait to be taken (back-pressure: TCP then holds the sender back), and writing
    waits for the transport's room (``drain``).
    """

    SCRATCH_BYTES = 64 * 1024
    #: Bytes of frames read and not yet taken at which reading pauses (what a
    #: ``StreamReader`` buffers before it pauses its transport, doubled).
    QUEUED_BYTES_MAX = 256 * 1024

    def __init__(self, frame_bytes_max: int, connected: Callable[[_FrameConnection], None]) -> None:
        self._frame_bytes_max = frame_bytes_max
        self._connected = connected
        self._transport: asyncio.Transport | None = None
        self._scratch = bytearray(self.SCRATCH_BYTES)
        self._scratch_view = memoryview(self._scratch)
        self._filled = 0  # bytes of the scratch buffer read and not yet split into frames
        self._big = bytearray()  # the in-place buffer, grown to the largest frame so far
        self._big_length = -1  # length of the frame being read into it (-1: none)
        self._big_filled = 0
        self._big_lent = False  # a view of ``_big`` was handed out and may still be read
        self._magic_seen = False
        self._frames: deque[bytes | memoryview] = deque()
        self._queued_bytes = 0  # of the frames in ``_frames``
        self._ended: BaseException | None = None  # why no more frames come (None: not yet)
        self._frame_ready: asyncio.Future[None] | None = None
        self._paused = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._closed = False
        self._sink: _native.AnswerSink | None = None  # takes every write once made
        self._sink_watched: int | None = None  # the sink's descriptor, watched for room

    # --- protocol callbacks ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._connected(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._big_length >= 0:
            return memoryview(self._big)[self._big_filled : self._big_length]
        return self._scratch_view[self._filled :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._big_length >= 0:
            self._big_filled += nbytes
            if self._big_filled == self._big_length:
                frame = memoryview(self._big)[: self._big_length]
                self._big_length = -1
                self._big_lent = True
                self._push(frame)
                self._pause()  # the buffer holds this frame until it is taken and parsed
            return
        self._filled += nbytes
        try:
            self._split()
        except InvalidArgumentError as exc:
            self._end(exc)
            if self._transport is not None:
                self._transport.pause_reading()

    def eof_received(self) -> bool:
        if self._filled or self._big_length >= 0:
            self._end(ConnectionResetError("the peer channel ended inside a frame"))
        else:
            self._end(None)
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._drop_sink()
        self._end(exc or ConnectionResetError("the peer channel connection was lost"))
        self._writable.set()  # a writer waiting for room learns of it in drain

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # --- splitting ------------------------------------------------------------------------

    def _split(self) -> None:
        """Takes every whole frame out of the scratch buffer, and starts reading a large
        one in place; what is left of a partial small frame moves to the front."""
        data, pos, end = self._scratch_view, 0, self._filled
        if not self._magic_seen:
            if end < len(MAGIC):
                return
            self._push(bytes(data[: len(MAGIC)]))
            self._magic_seen = True
            pos = len(MAGIC)
        while end - pos >= LENGTH.size:
            (length,) = LENGTH.unpack_from(self._scratch, pos)
            if length > self._frame_bytes_max:
                raise InvalidArgumentError(
                    f"peer channel frame of {length} bytes, over the limit of "
                    f"{self._frame_bytes_max}"
                )
            start = pos + LENGTH.size
            if end - start >= length:  # whole
                self._push(bytes(data[start : start + length]))
                pos = start + length
                continue
            if LENGTH.size + length > len(self._scratch):  # large: read the rest in place
                if self._big_lent or len(self._big) < length:
                    # A frame handed out may still be read from the old one: a new one.
                    self._big = bytearray(length)
                    self._big_lent = False
                self._big[: end - start] = data[start:end]
                self._big_length, self._big_filled = length, end - start
                pos = end
            break
        if pos:
            rest = end - pos
            # Through a copy: the two ranges may overlap, and a bytearray's slice assignment
            # copies with memcpy (at most one partial small frame, under the scratch's size).
            self._scratch[:rest] = bytes(data[pos:end])
            self._filled = rest

    def _push(self, frame: bytes | memoryview) -> None:
        self._frames.append(frame)
        self._queued_bytes += len(frame)
        self._wake()
        if self._queued_bytes >= self.QUEUED_BYTES_MAX:
            self._pause()  # the handler is behind: TCP holds the sender back

    def _pause(self) -> None:
        if self._transport is not None and not self._paused:
            self._paused = True
            self._transport.pause_reading()

    def _end(self, why: BaseException | None) -> None:
        if self._ended is None:
            self._ended = why if why is not None else _CleanEnd()
        self._wake()

    def _wake(self) -> None:
        waiter = self._frame_ready
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # --- the handler's side ---------------------------------------------------------------

    async def next_frame(self) -> bytes | memoryview | None:
        """The next frame's bytes (a view of the in-place buffer for a large one, valid until
        the next call), or None at a clean end between frames. Raises ``InvalidArgumentError``
        for a frame over the limit and ``ConnectionError`` for a connection that broke."""
        self._big_lent = self._big_lent and any(
            isinstance(frame, memoryview) for frame in self._frames
        )  # the caller is done with the frame it was given last
        while not self._frames:
            if self._ended is not None:
                if isinstance(self._ended, _CleanEnd):
                    return None
                raise self._ended
            if self._paused and self._transport is not None:
                self._paused = False
                self._transport.resume_reading()
            self._frame_ready = asyncio.get_running_loop().create_future()
            await self._frame_ready
            self._frame_ready = None
        frame = self._frames.popleft()
        self._queued_bytes -= len(frame)
        return frame

    def write_frame(self, data: bytes) -> None:
        """Queues one frame of ``data`` (the caller drains)."""
        if self._transport is None or self._closed:
            return
        sink = self._sink
        if sink is not None:
            try:
                pending = sink.write_frame(data)
            except OSError as exc:  # the connection broke
                log.debug("peer channel: write failed: %r", exc)
                self._transport.abort()
                return
            if pending:
                self._watch_sink(sink, pending)
            return
        head = LENGTH.pack(len(data))
        if len(data) <= _JOIN_BYTES_MAX:
            self._transport.write(head + data)
        else:
            self._transport.write(head)
            self._transport.write(data)

    async def drain(self) -> None:
        """Waits until the transport has room for more; ``ConnectionError`` once closed."""
        await self._writable.wait()
        if self._closed:
            raise ConnectionResetError("the peer channel connection was lost")

    def get_extra_info(self, name: str) -> Any:
        return None if self._transport is None else self._transport.get_extra_info(name)

    def close(self) -> None:
        self._drop_sink()
        if self._transport is not None:
            self._transport.close()

    # --- the native sink ------------------------------------------------------------------

    def take_writes(self) -> _native.AnswerSink | None:
        """Moves this connection's writes to a native sink (``AnswerSink``), which WAL
        committers write answers to as well (``peer_streams.AnswerHandoff``); returns it, or
        None on a connection without a socket of its own (TLS) or once closed. Frames from
        both stay whole and in order; what the socket does not take waits in the sink, and
        this connection flushes it when the socket has room."""
        transport = self._transport
        if transport is None or self._closed or self._sink is not None:
            return self._sink
        sock = transport.get_extra_info("socket")
        if sock is None:
            return None
        try:
            sink = _native.AnswerSink(sock.fileno())
        except OSError as exc:  # out of descriptors: the event loop writes, as before
            log.warning("peer channel: no answer sink: %s", exc)
            return None
        asyncio.get_running_loop().add_reader(sink.wake_fd(), self._sink_woken)
        self._sink = sink
        return sink

    def _sink_woken(self) -> None:
        """A committer left bytes pending in the sink."""
        if self._sink is not None:
            self._sink.drain_wake()
            self._flush_sink()

    def _flush_sink(self) -> None:
        """Sends what the sink holds: once its socket has room, or a committer left bytes."""
        sink = self._sink
        if sink is None:
            return
        try:
            pending = sink.flush()
        except OSError as exc:
            log.debug("peer channel: write failed: %r", exc)
            if self._transport is not None:
                self._transport.abort()
            return
        self._watch_sink(sink, pending)

    def _watch_sink(self, sink: _native.AnswerSink, pending: int) -> None:
        """With ``pending`` bytes left in the sink: watches its socket for room (and holds
        writers back while much is left); with none, stops watching."""
        loop = asyncio.get_running_loop()
        fd = sink.fileno()
        if pending and fd is not None:
            if self._sink_watched is None:
                loop.add_writer(fd, self._flush_sink)
                self._sink_watched = fd
            if pending > _SINK_PENDING_BYTES_MAX:
                self._writable.clear()
            return
        if self._sink_watched is not None:
            loop.remove_writer(self._sink_watched)
            self._sink_watched = None
        self._writable.set()

    def _drop_sink(self) -> None:
        sink, self._sink = self._sink, None
        if sink is None:
            return
        loop = asyncio.get_running_loop()
        if self._sink_watched is not None:
            loop.remove_writer(self._sink_watched)
            self._sink_watched = None
        loop.remove_reader(sink.wake_fd())
        sink.close()


class _CleanEnd(Exception):
    """The peer closed the connection between frames."""


OnAnswers = Callable[[consensus_pb2.ConsensusBatchResponsePB], None]
"""Takes one answer batch of a peer (``PeerStreams``); raising ends the connection."""


class DiallerConnection(asyncio.Protocol):
    """The dialler's side of one peer channel connection: writes request frames, and hands
    each answer batch, parsed, to ``on_answers`` in the transport's own callback, as soon as
    its frame is whole. A stream reader and a reading task cost every answer two reads, a
    task's wake-up and one more event-loop turn before its callbacks ran (on a leader, one
    turn more between a follower's answer and the commit)."""

    def __init__(self, frame_bytes_max: int, on_answers: OnAnswers) -> None:
        self._frame_bytes_max = frame_bytes_max
        self._on_answers = on_answers
        self._transport: asyncio.BaseTransport | None = None
        self._buffer = bytearray()
        self._writable = asyncio.Event()
        self._writable.set()
        self._ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # may be told twice (``_open_tls``): the same transport

    def data_received(self, data: bytes) -> None:
        if self._ended.done():
            return  # ended by an earlier frame: the rest is not read
        buffer = self._buffer
        buffer += data
        pos = 0
        try:
            while len(buffer) - pos >= LENGTH.size:
                (length,) = LENGTH.unpack_from(buffer, pos)
                if length > self._frame_bytes_max:
                    raise InvalidArgumentError(
                        f"peer channel frame of {length} bytes, over the limit of "
                        f"{self._frame_bytes_max}"
                    )
                start = pos + LENGTH.size
                if len(buffer) - start < length:
                    break
                with memoryview(buffer) as view:  # released before the buffer is cut
                    frame = bytes(view[start : start + length])
                answer = _parse(consensus_pb2.ConsensusBatchResponsePB, frame)
                pos = start + length
                self._on_answers(answer)
        except Exception as exc:  # a bad frame, or a refusal the callback raised
            self._end(exc)
            return
        del buffer[:pos]

    def eof_received(self) -> bool:
        self._end(NetworkError("the peer channel ended"))
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc or NetworkError("the peer channel connection was lost"))
        self._writable.set()  # a writer waiting for room learns of it in drain

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # --- the dialler's side ---------------------------------------------------------------

    def write(self, pieces: Sequence[bytes | memoryview]) -> None:
        """Queues a frame's pieces, in order (the caller drains)."""
        transport = self._transport
        if transport is None or self._ended.done():
            return  # ``drain`` raises why
        assert isinstance(transport, asyncio.WriteTransport)
        for piece in pieces:
            transport.write(piece)

    async def drain(self) -> None:
        """Waits until the transport has room for more; raises why the connection ended."""
        await self._writable.wait()
        if self._ended.done():
            self._ended.result()  # raises

    async def wait_ended(self) -> None:
        """Returns never: raises why the connection ended (``NetworkError`` when the peer
        closed it, the error of a frame that was refused)."""
        await asyncio.shield(self._ended)

    def close(self) -> None:
        """Closes the connection whatever state it is in."""
        if self._transport is not None:
            with contextlib.suppress(Exception):
                self._transport.close()
        self._end(NetworkError("the peer channel connection was closed"))

    def _end(self, why: BaseException) -> None:
        if not self._ended.done():
            self._ended.set_exception(why)
            self._ended.exception()  # marked retrieved: no one may be waiting yet
            if self._transport is not None:
                self._transport.close()


async def open_peer_channel(
    host: str,
    port: int,
    *,
    timeout_ms: int,
    on_answers: OnAnswers,
    frame_bytes_max: int,
    tls: _native.TlsConfig | None = None,
    server_uuid: str = "",
) -> DiallerConnection:
    """Connects to a peer's channel (with ``tls``, checking its certificate names
    ``server_uuid``) and writes the magic; each answer batch then goes to ``on_answers``.
    Raises ``NetworkError``."""
    loop = asyncio.get_running_loop()

    def connection() -> DiallerConnection:
        return DiallerConnection(frame_bytes_max, on_answers)

    try:
        async with asyncio.timeout(timeout_ms / 1000):
            if tls is None:
                _, dialled = await loop.create_connection(connection, host, port)
            else:
                dialled = await _open_tls(
                    host, port, tls, peer_server_name(server_uuid), connection
                )
    except (OSError, TimeoutError) as exc:  # ConnectionError: the TLS handshake failed
        raise NetworkError(f"cannot connect to the peer channel at {host}:{port}: {exc}") from None
    dialled.write((MAGIC,))
    return dialled


async def _open_tls(
    host: str,
    port: int,
    tls: _native.TlsConfig,
    server_name: str,
    connection: Callable[[], DiallerConnection],
) -> DiallerConnection:
    """A connection over the extension's TLS (``rpc.tls_socket``), the dialler's side."""
    loop = asyncio.get_running_loop()
    failure: OSError = OSError(f"no address for {host}")
    for family, kind, proto, _, address in await loop.getaddrinfo(
        host, port, type=socket.SOCK_STREAM
    ):
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            sock.close()
            failure = exc
            continue
        except BaseException:
            sock.close()
            raise
        session = await tls_handshake(sock, tls, server_hostname=server_name)  # closes on failure
        protocol = connection()
        # The transport tells the protocol on the next turn; it takes writes at once.
        protocol.connection_made(SocketTlsTransport(loop, sock, session, protocol))
        return protocol
    raise failure
