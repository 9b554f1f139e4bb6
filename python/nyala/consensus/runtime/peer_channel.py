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
certificate gets one ``NOT_AUTHORIZED`` answer and the connection closes.

The server checks each batch's ``dest_uuid``. A refused stream gets one answer whose ``error``
is set, then the connection closes, as ``ConsensusPeerStream`` ends. The server also closes a
connection whose magic is wrong, whose frame is longer than ``frame_bytes_max``, or whose
batch does not parse (logged; nothing else is touched).

This module owns the listening socket and the connections' tasks; what a batch means is
``PeerStreams.serve``'s business.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import struct
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from nyala._proto import consensus_pb2
from nyala.consensus.runtime.wire import WireRequest, request_size
from nyala.errors import InvalidArgumentError, NetworkError, NotAuthorizedError, NyalaError
from nyala.rpc.credentials import not_a_server, peer_server_name
from nyala.rpc.errors import error_to_pb
from nyala.rpc.pb_fields import length_delimited_head, varint
from nyala.rpc.service import check_dest_uuid

log = logging.getLogger(__name__)

#: What a dialler writes first: the channel's name and its version.
MAGIC = b"NYPC\x00\x00\x00\x01"
_LENGTH = struct.Struct(">I")
# Frames up to this size are written as one buffer (one send); larger ones as two, which
# saves copying the batch.
_JOIN_BYTES_MAX = 256 * 1024
# A request's entry batch this large is written from where it lies (one more send, no copy).
_IN_PLACE_BYTES_MIN = 64 * 1024

#: Room over a peer's largest gRPC message for the batch around it.
_FRAME_SLACK_BYTES = 64 * 1024


def frame_bytes_max(message_bytes_max: int) -> int:
    """The largest frame either side takes: a batch holds at least one request, which may
    be as large as a gRPC message (``RpcSettings.message_bytes_max``)."""
    return message_bytes_max + _FRAME_SLACK_BYTES


ServeBatches = Callable[
    [AsyncIterator[consensus_pb2.ConsensusBatchRequestPB]],
    AsyncIterator[consensus_pb2.ConsensusBatchResponsePB],
]
"""Answers one peer's batches (``ConsensusService.serve_peer_batches``)."""


def write_frame(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Queues one frame of ``data`` on ``writer`` (the caller drains)."""
    head = _LENGTH.pack(len(data))
    if len(data) <= _JOIN_BYTES_MAX:
        writer.write(head + data)
    else:
        writer.write(head)
        writer.write(data)


# Field numbers of ConsensusBatchRequestPB.
_DEST_UUID_FIELD = 1
_CALLER_UUID_FIELD = 2
_REQUEST_FIELD = 3
_CALL_IDS_FIELD = 4  # packed


def batch_request_frame(
    dest_uuid: str, caller_uuid: str, call_ids: list[int], requests: list[WireRequest]
) -> list[bytes | memoryview]:
    """One frame holding the ``ConsensusBatchRequestPB`` of these requests, encoded here
    rather than by protobuf (which copied every request twice, and framing it a third time),
    as the pieces to write in order: the small ones joined, and each AppendEntries' batch of
    ``_IN_PLACE_BYTES_MIN`` or more in place, so that its bytes are copied only by the
    socket write."""
    dest, caller = dest_uuid.encode(), caller_uuid.encode()
    ids = b"".join(varint(call_id) for call_id in call_ids)
    pieces: list[bytes | memoryview] = []
    small: list[bytes | memoryview] = [
        length_delimited_head(_DEST_UUID_FIELD, len(dest)),
        dest,
        length_delimited_head(_CALLER_UUID_FIELD, len(caller)),
        caller,
    ]
    for request in requests:
        small.append(length_delimited_head(_REQUEST_FIELD, request_size(request)))
        if isinstance(request, bytes):
            small.append(request)
            continue
        head, body = request
        small.append(head)
        if body.nbytes < _IN_PLACE_BYTES_MIN:
            small.append(body)
            continue
        pieces += (b"".join(small), body)
        small = []
    small += (length_delimited_head(_CALL_IDS_FIELD, len(ids)), ids)
    pieces.append(b"".join(small))
    length = sum(len(piece) if isinstance(piece, bytes) else piece.nbytes for piece in pieces)
    pieces[0] = _LENGTH.pack(length) + pieces[0]
    return pieces


async def read_frame(reader: asyncio.StreamReader, frame_bytes_max: int) -> bytes | None:
    """The next frame's bytes, or None at a clean end of the connection (between frames).

    Raises ``NetworkError`` for a connection that ended inside a frame and
    ``InvalidArgumentError`` for a frame over ``frame_bytes_max``.
    """
    try:
        head = await reader.readexactly(_LENGTH.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise NetworkError("the peer channel ended inside a frame's length") from None
    (length,) = _LENGTH.unpack(head)
    if length > frame_bytes_max:
        raise InvalidArgumentError(
            f"peer channel frame of {length} bytes, over the limit of {frame_bytes_max}"
        )
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise NetworkError(
            f"the peer channel ended {len(exc.partial)} bytes into a frame of {length}"
        ) from None


_Message = TypeVar("_Message", bound=Message)


def _parse(message_class: type[_Message], data: bytes) -> _Message:
    """``data`` as a ``message_class``; ``InvalidArgumentError`` if it is not one."""
    try:
        return message_class.FromString(data)
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
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.server_uuid = server_uuid
        self._serve = serve
        self._frame_bytes_max = frame_bytes_max
        self._ssl = tls  # the server side of mutual TLS (rpc.credentials.socket_tls_context)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.port = 0
        self.connections_refused = 0  # wrong magic, oversized frame, unparseable batch

    async def start(self, host: str, port: int) -> int:
        """Listens on ``host``:``port`` (0: any free port); returns the port."""
        self._server = await asyncio.start_server(self._handle, host, port, ssl=self._ssl)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def close(self) -> None:
        """Stops listening and ends every connection (their unanswered requests are lost, as
        when a gRPC stream breaks; the peers' Raft sends again)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._connections):
            task.cancel()
        self.port = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        try:
            hello = await reader.readexactly(len(MAGIC))
            if hello != MAGIC:
                self.connections_refused += 1
                log.warning("peer channel: %s did not open with the channel's magic; closed", peer)
                return
            try:
                if self._ssl is not None:
                    why = not_a_server(writer.get_extra_info("peercert"))
                    if why is not None:
                        raise NotAuthorizedError(f"the peer channel {why} ({peer})")
                async for answers in self._serve(self._batches(reader)):
                    write_frame(writer, answers.SerializeToString())
                    await writer.drain()
            except NyalaError as exc:
                if isinstance(exc, InvalidArgumentError | NotAuthorizedError):
                    self.connections_refused += 1
                    log.warning("peer channel: closed the connection from %s: %s", peer, exc)
                refusal = consensus_pb2.ConsensusBatchResponsePB(error=error_to_pb(exc))
                write_frame(writer, refusal.SerializeToString())
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass  # the peer went away; what it was owed is lost, as on a broken stream
        finally:
            self._connections.discard(task)
            writer.close()

    async def _batches(
        self, reader: asyncio.StreamReader
    ) -> AsyncIterator[consensus_pb2.ConsensusBatchRequestPB]:
        while True:
            data = await read_frame(reader, self._frame_bytes_max)
            if data is None:
                return
            batch = _parse(consensus_pb2.ConsensusBatchRequestPB, data)
            check_dest_uuid(batch.dest_uuid, self.server_uuid)
            yield batch


async def open_peer_channel(
    host: str,
    port: int,
    *,
    timeout_ms: int,
    tls: ssl.SSLContext | None = None,
    server_uuid: str = "",
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connects to a peer's channel (with ``tls``, checking its certificate names
    ``server_uuid``) and writes the magic; raises ``NetworkError``."""
    name = peer_server_name(server_uuid) if tls is not None else None
    try:
        async with asyncio.timeout(timeout_ms / 1000):
            reader, writer = await asyncio.open_connection(
                host, port, ssl=tls, server_hostname=name
            )
    except (OSError, TimeoutError) as exc:  # ssl.SSLError included
        raise NetworkError(f"cannot connect to the peer channel at {host}:{port}: {exc}") from None
    writer.write(MAGIC)
    return reader, writer


async def answers_of(
    reader: asyncio.StreamReader, frame_bytes_max: int
) -> AsyncIterator[consensus_pb2.ConsensusBatchResponsePB]:
    """The answer batches a peer writes on its channel, until it ends the connection."""
    while True:
        data = await read_frame(reader, frame_bytes_max)
        if data is None:
            return
        yield _parse(consensus_pb2.ConsensusBatchResponsePB, data)


def close_quietly(writer: asyncio.StreamWriter) -> None:
    """Closes a channel connection whatever state it is in."""
    with contextlib.suppress(Exception):
        writer.close()
