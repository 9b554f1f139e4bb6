"""Coalescing of concurrent writes to one tablet server (Nagle-like, docs/performance.md).

Every ``Write`` call costs a few hundred microseconds of CPU in Python gRPC on each side, far
more than replicating one small row. A ``WritePipe`` per server keeps at most
``inflight_calls_max`` calls to it in flight; a write issued while they are busy waits in a
queue, and the next call carries everything queued (``WriteMulti``). An idle pipe sends at once,
so a lone writer sees no added latency; under load, calls grow with the number of waiting
writers and the per-call cost is shared.

Each queued write keeps its own ``WriteRequestPB`` (tablet, request id, rows) and gets its own
answer: a sub-request's error (``NOT_THE_LEADER``, a schema mismatch, ...) is raised to its own
caller only, and a call that fails as a whole (the server is unreachable, the deadline passed)
fails exactly the writes it carried. Retrying and redirecting stay with the caller
(``Writer._send``), which resends the same bytes under the same request id, so exactly-once is
unchanged.

The pipe has no thread of its own. A call is made, blocking, in the thread of one of the writers
it carries: the writer whose request finds the pipe idle makes it at once; when a call ends, its
maker answers the writers it carried and hands the writes queued meanwhile to the one of them
with the latest deadline, whose thread wakes and makes the next call. (A sync gRPC channel's
``future()`` started a polling thread whenever the channel had no call in flight; a blocking
call needs none.) A call runs until the latest deadline of its writes, so that writer is the
one that waits for it: no writer waits past its own deadline, and the others time out at theirs
with their outcome unknown.

The writers a call answered are woken one at a time (``_native.Wake``): each is woken by a thread
that is about to wait in the pipe (the previous writer, back with its next write, or a call's
maker), after that thread gave up the GIL, so that the woken one finds the GIL free. Woken all at
once, each thread woke twice (from its wait, then again when the GIL came free): 64 writers cost
four thread switches per write, most of the client's kernel time (docs/performance.md, "Writer
threads that take turns"). A writer that returns to its caller wakes the next one itself unless
it came back within ``RETURN_GAP_S`` last time, a call is in flight (whose maker wakes one when
it starts the next call or returns) and a writer was woken within ``RELAY_LAG_S``: an answered
writer waits at most until a thread next waits in the pipe, or a call starts or ends.

The calls go on the tablet server's peer channel (``WRITE_MAGIC``,
``nyala.consensus.runtime.peer_channel``): a length-prefixed ``WriteMultiRequestPB`` on a TCP
connection and its ``WriteMultiResponsePB`` back, which costs both ends a fraction of a gRPC
call (docs/performance.md). On a secure cluster the connection is mutual TLS (the extension's,
``rpc.tls_socket``) with this client's certificate, and the server checks each call as it
checks the gRPC method's. The port is asked with ``GetPeerChannel`` before each connection. A
server that serves no channel, or a connection that cannot be made (a handshake refused
included), sends the writes over gRPC instead; nothing has been sent then, so nothing is
duplicated or lost. A call cut after it was sent fails its writes with ``NetworkError`` (their
outcome unknown; the writer retries them under the same request ids, as for a gRPC call that
broke).

A write's rows (``ops``, megabytes under a bulk load) are never put into a protobuf message: the
pipe serializes the rest of the ``WriteRequestPB`` and joins the rows after it as field ``ops``
(``nyala.rpc.pb_fields``), one copy where building the messages made three.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeAlias, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from nyala import _native, errors
from nyala._proto import consensus_pb2, tserver_pb2
from nyala.client.rpc import Stubs
from nyala.rpc.channel_wire import LENGTH, WRITE_MAGIC
from nyala.rpc.credentials import peer_server_name
from nyala.rpc.errors import error_from_grpc, error_from_pb, split_host_port
from nyala.rpc.pb_fields import length_delimited_head

#: Calls to one server in flight at once; more writes wait and go together in the next call
#: (1 measured better than 2: larger calls, less CPU per write, docs/performance.md).
INFLIGHT_CALLS_MAX = 1
#: Writers whose answers came are woken one at a time, each as the previous one waits in the
#: pipe again (module doc). A writer that returned within ``RETURN_GAP_S`` of its previous
#: write is expected back and leaves the next one asleep when it returns, while a call is in
#: flight and a writer was woken within ``RELAY_LAG_S``; otherwise it wakes the next itself.
RETURN_GAP_S = 0.001
RELAY_LAG_S = 0.001
#: Most writes one call carries.
CALL_REQUESTS_MAX = 1024
#: Most row bytes one call carries (a single larger write still goes, alone); well under the
#: RPC message limit.
CALL_BYTES_MAX = 8 * 1024 * 1024

_OPS_FIELD = tserver_pb2.WriteRequestPB.DESCRIPTOR.fields_by_name["ops"].number
_REQUESTS_FIELD = tserver_pb2.WriteMultiRequestPB.DESCRIPTOR.fields_by_name["requests"].number
_Response = TypeVar("_Response", bound=Message)

_Answer: TypeAlias = "tserver_pb2.WriteResponsePB | tserver_pb2.WriteMultiResponsePB"
#: A call in flight, or to make: returns its answer or its failure.
_Call: TypeAlias = "Callable[[], tuple[_Answer | None, BaseException | None]]"

#: After a server could not be reached on its channel (or serves none), its writes go over gRPC
#: for this long before the channel is tried again.
CHANNEL_RETRY_S = 10.0
# A request this large is sent as two pieces (its length, then itself) rather than joined.
_JOIN_BYTES_MAX = 256 * 1024
#: How long a connection to a channel (and its TLS handshake) may take at most.
CONNECT_TIMEOUT_S = 5.0
# TlsSession.handshake's answers.
_HANDSHAKE_DONE, _HANDSHAKE_WANT_READ = 0, 1


@dataclass(eq=False)
class _Pending:
    """One write waiting for its answer, or for a call to make (``leads``)."""

    dest_uuid: str
    head: bytes  # the serialized WriteRequestPB without ``ops``
    ops: bytes
    deadline: float  # time.monotonic()
    wake: _native.Wake = field(default_factory=_native.Wake)
    settled: bool = False
    left: bool = False  # its writer returned (a relay skips it)
    response: tserver_pb2.WriteResponsePB | None = None
    error: BaseException | None = None
    abandoned: bool = False  # its caller stopped waiting before it was sent
    leads: tuple[list[_Pending], _Call] | None = None  # a call for this writer's thread

    def settle(
        self, response: tserver_pb2.WriteResponsePB | None, error: BaseException | None
    ) -> None:
        self.response, self.error = response, error
        self.settled = True
        self.wake.set()

    def take_error(self) -> BaseException:
        """Its error, no longer held here."""
        error, self.error = self.error, None
        assert error is not None, "settled with an error"
        return error

    def settle_asleep(self, response: tserver_pb2.WriteResponsePB) -> None:
        """Settles it without waking its writer (a relay does, ``WritePipe._relay_target``)."""
        self.response, self.error = response, None
        self.settled = True


class WritePipe:
    """Sends the writes to one server, coalescing those issued while calls are in flight."""

    def __init__(
        self,
        stubs: Stubs,
        *,
        channel: bool = True,
        tls: _native.TlsConfig | None = None,
        inflight_calls_max: int = INFLIGHT_CALLS_MAX,
        call_requests_max: int = CALL_REQUESTS_MAX,
        call_bytes_max: int = CALL_BYTES_MAX,
    ) -> None:
        if inflight_calls_max < 1 or call_requests_max < 1:
            raise errors.InvalidArgumentError("a write pipe needs room for one call of one write")
        self.stubs = stubs
        self.inflight_calls_max = inflight_calls_max
        self.call_requests_max = call_requests_max
        self.call_bytes_max = call_bytes_max
        # Write and WriteMulti taking the request already serialized (see the module doc).
        self._write = _serialized_call(stubs.channel, "Write", tserver_pb2.WriteResponsePB)
        self._write_multi = _serialized_call(
            stubs.channel, "WriteMulti", tserver_pb2.WriteMultiResponsePB
        )
        #: The server's peer channel, unless this pipe may not use it (``tls``: a secure
        #: cluster's, this client's certificate).
        self.channel = WriteChannel(stubs, tls) if channel else None
        self._lock = threading.Lock()
        self._queue: deque[_Pending] = deque()
        self._inflight = 0
        # Writers whose answers came, not woken yet: woken one at a time (module doc).
        self._asleep: deque[_Pending] = deque()
        self._relayed_at = 0.0  # time.monotonic() of the last relay
        self._local = threading.local()  # per writer thread: when it last returned
        #: Calls sent and writes they carried (for tests and benchmarks).
        self.calls_sent = 0
        self.writes_sent = 0

    def write(
        self, request: tserver_pb2.WriteRequestPB, ops: bytes, timeout_ms: int
    ) -> tserver_pb2.WriteResponsePB:
        """Sends ``request`` (a ``WriteRequestPB`` without its ``ops``) with ``ops`` as its rows
        and returns its ``WriteResponsePB``; raises its error as a ``nyala.errors`` exception
        (``TimedOutError`` once ``timeout_ms`` has passed without an answer: the outcome is
        then unknown)."""
        if request.ops:
            raise errors.InvalidArgumentError("the rows of a write go in ops, not in its request")
        return self.write_encoded(request.dest_uuid, request.SerializeToString(), ops, timeout_ms)

    def write_encoded(
        self, dest_uuid: str, head: bytes, ops: bytes, timeout_ms: int
    ) -> tserver_pb2.WriteResponsePB:
        """``write`` of a request already serialized, without its ``ops`` (``head``, for
        server ``dest_uuid``: ``_native.write_request_head``)."""
        pending = _Pending(dest_uuid, head, ops, time.monotonic() + timeout_ms / 1000)
        self._send_and_wait(pending)
        if not pending.settled:
            raise errors.TimedOutError(
                f"write to {self.stubs.addr} not answered within {timeout_ms} ms "
                "(its outcome is unknown)"
            )
        if pending.error is not None:
            # Taken out of ``pending`` as it is raised: the error's traceback holds this
            # frame, and a frame that led back to the error (a cycle) would keep the request
            # alive until the cyclic collector runs (a client retrying refused bulk writes
            # held each refused one so). Its batch's other writers share the error.
            raise pending.take_error()
        assert pending.response is not None, "settled with a response or an error"
        return pending.response

    def _send_and_wait(self, pending: _Pending) -> None:
        """Queues ``pending``, makes the calls this thread is handed, and waits until it is
        settled or its deadline passed."""
        local = self._local
        left_at = getattr(local, "left_at", None)
        # A thread that came back within RETURN_GAP_S of its last write is likely to come
        # back again: its next return leaves the relay to its next wait.
        returns_fast = left_at is not None and time.monotonic() - left_at < RETURN_GAP_S
        with self._lock:
            self._queue.append(pending)
            batch = self._take_locked()
            maker = _maker(batch)

            def call() -> tuple[_Answer | None, BaseException | None]:
                return self._answer(lambda: self._call(batch))

            if maker is not None and maker is not pending:  # it waits longest: its call
                maker.leads = (batch, call)
        try:
            if maker is pending:  # the pipe was idle: this thread makes the call
                self._make_call(batch, call, pending)
            elif maker is not None:
                maker.wake.set()
            while not pending.settled:
                relay = self._relay_target()
                woken = pending.wake.wait(
                    max(0.0, pending.deadline - time.monotonic()),
                    None if relay is None else relay.wake,
                )
                with self._lock:
                    led, pending.leads = pending.leads, None
                    pending.wake.clear()
                    if led is None and not woken and not pending.settled:
                        pending.abandoned = True  # if still queued, it is never sent
                        break
                if led:  # handed a call: it runs until this write's deadline at most
                    self._make_call(*led, pending)
        finally:
            pending.left = True
            self._relay_on_leave(returns_fast)
            local.left_at = time.monotonic()

    def close(self) -> None:
        """Closes the channel's connections (a call in flight fails)."""
        if self.channel is not None:
            self.channel.close()

    def _take_locked(self) -> list[_Pending]:
        """The writes for the next call, if a call may start now (the lock is held)."""
        if self._inflight >= self.inflight_calls_max:
            return []
        batch: list[_Pending] = []
        size = 0
        while self._queue and len(batch) < self.call_requests_max:
            head = self._queue[0]
            if head.abandoned:
                self._queue.popleft()
                continue
            head_bytes = len(head.ops)
            if batch and size + head_bytes > self.call_bytes_max:
                break
            self._queue.popleft()
            batch.append(head)
            size += head_bytes
        if batch:
            self._inflight += 1
            self.calls_sent += 1
            self.writes_sent += len(batch)
        return batch

    def _make_call(self, batch: list[_Pending], call: _Call, own: _Pending) -> None:
        """Reads the answer of ``call`` (carrying ``batch``) in this thread, starts the next
        call with the writes queued meanwhile and hands it to the first of them, then answers
        ``batch``'s writes (module doc). ``own`` is this thread's write."""
        relay = self._relay_target()  # this thread waits for the answer: one writer runs
        if relay is not None:
            relay.wake.set()
        try:
            answer, failure = call()
        except BaseException as exc:  # interrupted: the call's outcome is unknown
            self._hand_on()
            self._settle(batch, None, errors.NetworkError(f"write call interrupted: {exc!r}"))
            raise
        self._hand_on()
        self._settle(batch, answer, failure, own)

    def _relay_target(self) -> _Pending | None:
        """The writer to wake as this thread blocks: the first answered one still asleep."""
        with self._lock:
            return self._pop_asleep_locked()

    def _pop_asleep_locked(self) -> _Pending | None:
        asleep = self._asleep
        while asleep:
            head = asleep.popleft()
            if not head.left:
                self._relayed_at = time.monotonic()
                return head
        return None

    def _relay_on_leave(self, returns_fast: bool) -> None:
        """A writer returns to its caller: it wakes the next answered writer, unless it is
        likely to wait in the pipe again soon (``returns_fast``) and wake one then, a call is
        in flight or queued (whose maker wakes one when it starts the next call or returns),
        and the last relay is recent (the relays are not stalled)."""
        with self._lock:
            if not self._asleep or (
                returns_fast
                and (self._inflight or self._queue)
                and time.monotonic() - self._relayed_at < RELAY_LAG_S
            ):
                return
            relay = self._pop_asleep_locked()
        if relay is not None:
            relay.wake.set()

    def _hand_on(self) -> None:
        with self._lock:
            self._inflight -= 1
            following = self._take_locked()
            if not following:
                return
            presend = _Presend()
            maker = _maker(following)
            assert maker is not None
            # Set under the lock: a writer that wakes (its deadline passed, say) sees either
            # no call to make or this one, never neither once it was taken from the queue.
            maker.leads = (following, lambda: presend.call(self, following))
        # Sent after the lock is released: a send may give up the CPU, and writers queueing
        # meanwhile would have waited for the lock, each at the cost of a thread switch.
        presend.send(self, following)
        maker.wake.set()

    def _answer(self, call: Callable[[], _Answer]) -> tuple[_Answer | None, BaseException | None]:
        """``call``'s answer, or its failure as a ``nyala.errors`` exception."""
        try:
            return call(), None
        except grpc.RpcError as err:
            return None, error_from_grpc(err, target=self.stubs.addr)
        except errors.NyalaError as exc:
            return None, exc
        except Exception as exc:  # a bug in the transport: the writes may have gone out
            return None, errors.NetworkError(f"write call to {self.stubs.addr} failed: {exc!r}")

    def _call(self, batch: list[_Pending]) -> _Answer:
        """Makes the call carrying ``batch``: on the channel if it can take it, else over
        gRPC."""
        timeout_s = _timeout_s(batch)
        if self.channel is not None and self.channel.usable(batch[0].dest_uuid, timeout_s):
            try:
                sent = self.channel.send(_multi_request(batch), timeout_s)
            except _NotSent:
                pass  # over gRPC, below
            else:
                return self.channel.receive(sent)
        if len(batch) == 1:
            return self._write(b"".join(_request_parts(batch[0])), timeout=timeout_s)
        return self._write_multi(_multi_request(batch), timeout=timeout_s)

    def _settle(
        self,
        batch: list[_Pending],
        response: _Answer | None,
        failure: BaseException | None,
        own: _Pending | None = None,
    ) -> None:
        if failure is not None or response is None:
            failure = failure or errors.NetworkError(f"no answer from {self.stubs.addr}")
            for p in batch:
                p.settle(None, failure)
            return
        if response.HasField("error"):  # refused as a whole (e.g. wrong server)
            error = error_from_pb(response.error)
            for p in batch:
                p.settle(None, error)
            return
        if isinstance(response, tserver_pb2.WriteResponsePB):  # one write: a Write call
            batch[0].settle(response, None)
            return
        if len(response.responses) != len(batch):
            error = errors.NetworkError(
                f"{self.stubs.addr} answered {len(response.responses)} of {len(batch)} writes"
            )
            for p in batch:
                p.settle(None, error)
            return
        asleep: list[_Pending] = []
        for p, sub in zip(batch, response.responses, strict=True):
            if sub.HasField("error"):
                p.settle(None, error_from_pb(sub.error))
            elif p is own:
                p.settle(sub, None)
            else:
                p.settle_asleep(sub)
                asleep.append(p)
        with self._lock:
            self._asleep.extend(asleep)


@dataclass(frozen=True)
class _Sent:
    """A call sent on a channel connection, its answer not read yet."""

    connection: _Connection
    deadline: float  # time.monotonic()
    timeout_s: float


def _maker(batch: list[_Pending]) -> _Pending | None:
    """The writer of ``batch`` whose thread makes its call: the one with the latest deadline
    (the call runs until it), the first of them on a tie."""
    if not batch:
        return None
    return max(batch, key=lambda p: p.deadline)


def _timeout_s(batch: list[_Pending]) -> float:
    """A call's timeout: until the latest deadline of the writes it carries."""
    return max(0.001, max(p.deadline for p in batch) - time.monotonic())


class _NotSent(Exception):
    """The channel could not take a call (no connection could be made): nothing was sent."""


class WriteChannel:
    """Write calls on a tablet server's peer channel (module doc): blocking, one call per
    connection at a time; idle connections are kept for the next call. With ``tls`` (a
    secure cluster) each connection is mutual TLS, the server's certificate checked to name
    the server the port was asked of."""

    def __init__(self, stubs: Stubs, tls: _native.TlsConfig | None = None) -> None:
        self.stubs = stubs
        self._tls = tls
        self._host = split_host_port(stubs.addr)[0]
        self._lock = threading.Lock()
        self._idle: list[_Connection] = []
        self._port = 0  # the channel's port, once asked (0: not known)
        self._server_uuid = ""  # of the server the port was asked of
        self._retry_at = 0.0  # time.monotonic() before which the channel is not tried
        self._closed = False
        #: Calls made here, and connections opened (for tests and benchmarks).
        self.calls = 0
        self.connections = 0

    def usable(self, dest_uuid: str, timeout_s: float) -> bool:
        """True if a call may go here: a connection is idle, or the server's channel port is
        known or could be asked now. False while a refusal or failure is recent."""
        with self._lock:
            if self._idle or self._port:
                return True
            if self._closed or time.monotonic() < self._retry_at:
                return False
        try:
            answer = self.stubs.call(
                self.stubs.consensus.GetPeerChannel,
                consensus_pb2.PeerChannelRequestPB(dest_uuid=dest_uuid),
                int(min(timeout_s, CHANNEL_RETRY_S) * 1000),
            )
        except errors.NyalaError:  # unreachable, not this server, or one without the method
            answer = consensus_pb2.PeerChannelResponsePB()
        with self._lock:
            self._port, self._server_uuid = answer.port, dest_uuid
            if not answer.port:
                self._retry_at = time.monotonic() + CHANNEL_RETRY_S
            return bool(answer.port)

    def send(self, request: bytes, timeout_s: float) -> _Sent:
        """Sends ``request`` (a serialized ``WriteMultiRequestPB``) on a connection, opened if
        none is idle; read its answer with ``receive``. Raises ``_NotSent`` if no connection
        could be made, ``NetworkError`` if the connection broke while sending."""
        return self._send(self._connection(timeout_s), request, timeout_s)

    def send_on_idle(self, request: bytes, timeout_s: float) -> _Sent | None:
        """``send`` if a connection is idle (None if not: nothing sent)."""
        connection = self._idle_connection()
        return None if connection is None else self._send(connection, request, timeout_s)

    def receive(self, sent: _Sent) -> tserver_pb2.WriteMultiResponsePB:
        """The answer of a call ``send`` sent. Raises ``TimedOutError`` after its timeout and
        ``NetworkError`` if the connection broke (the connection is then dropped; the outcome
        of both is unknown)."""
        done = False
        try:
            (length,) = LENGTH.unpack(sent.connection.receive(LENGTH.size, sent.deadline))
            data = sent.connection.receive(length, sent.deadline)
            done = True
        except TimeoutError:
            raise errors.TimedOutError(
                f"write call to {self.stubs.addr} not answered within {sent.timeout_s * 1000:.0f}"
                " ms (its outcome is unknown)"
            ) from None
        except OSError as exc:  # a failed TLS session's ConnectionError included
            raise errors.NetworkError(
                f"the write channel to {self.stubs.addr} broke: {exc!r} (the outcome is unknown)"
            ) from None
        finally:
            self._release(sent.connection, done)
        try:
            return tserver_pb2.WriteMultiResponsePB.FromString(data)
        except DecodeError:
            raise errors.NetworkError(
                f"{self.stubs.addr} answered a write call with {len(data)} bytes that do not "
                "parse (the outcome is unknown)"
            ) from None

    def _send(self, connection: _Connection, request: bytes, timeout_s: float) -> _Sent:
        deadline = time.monotonic() + timeout_s
        try:
            head = LENGTH.pack(len(request))
            if len(request) <= _JOIN_BYTES_MAX:
                connection.send(head + request, deadline)
            else:
                connection.send(head, deadline)
                connection.send(request, deadline)
        except OSError as exc:  # a timeout included: part of it may have gone
            self._release(connection, False)
            raise errors.NetworkError(
                f"the write channel to {self.stubs.addr} broke while sending: {exc!r} (the "
                "outcome is unknown)"
            ) from None
        return _Sent(connection, deadline, timeout_s)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _idle_connection(self) -> _Connection | None:
        with self._lock:
            while self._idle:
                connection = self._idle.pop()
                if connection.alive():
                    return connection
                connection.close()  # the server ended it (restarted, say): its port may differ
                self._port = 0
        return None

    def _connection(self, timeout_s: float) -> _Connection:
        connection = self._idle_connection()
        if connection is not None:
            return connection
        with self._lock:
            port, server_uuid, closed = self._port, self._server_uuid, self._closed
        if closed or not port:
            raise _NotSent()
        deadline = time.monotonic() + min(timeout_s, CONNECT_TIMEOUT_S)
        try:
            sock = socket.create_connection((self._host, port), timeout=deadline - time.monotonic())
        except OSError:
            self._pause()
            raise _NotSent() from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = _Connection.open(sock, self._tls, server_uuid, deadline)
            connection.send(WRITE_MAGIC, deadline)
        except OSError:  # a refused handshake's ConnectionError, or a timeout
            sock.close()
            self._pause()
            raise _NotSent() from None
        with self._lock:
            self.connections += 1
        return connection

    def _pause(self) -> None:
        """After a failed connection: over gRPC for a while, then the port asked again (the
        server may have moved it)."""
        with self._lock:
            self._port = 0
            self._retry_at = time.monotonic() + CHANNEL_RETRY_S

    def _release(self, connection: _Connection, reusable: bool) -> None:
        with self._lock:
            self.calls += 1
            if reusable and not self._closed:
                self._idle.append(connection)
                return
            if not reusable:
                self._port = 0  # asked again: a broken connection may mean a moved server
        connection.close()


class _Presend:
    """The next call, started by the thread whose call just ended (``WritePipe._hand_on``):
    a small one is sent at once on an idle channel connection, so that it travels while that
    thread answers its own writers; the writer it is handed to reads the answer, or makes the
    whole call if it was not sent."""

    def __init__(self) -> None:
        self._done = threading.Event()  # ``send`` has returned
        self._sent: _Sent | None = None
        self._failure: BaseException | None = None

    def send(self, pipe: WritePipe, batch: list[_Pending]) -> None:
        channel = pipe.channel
        try:
            if channel is not None and sum(len(p.ops) for p in batch) <= _JOIN_BYTES_MAX:
                self._sent = channel.send_on_idle(_multi_request(batch), _timeout_s(batch))
        except errors.NyalaError as exc:
            self._failure = exc
        finally:
            self._done.set()

    def call(
        self, pipe: WritePipe, batch: list[_Pending]
    ) -> tuple[_Answer | None, BaseException | None]:
        self._done.wait()  # set before the writer is woken, unless it woke on its own
        if self._failure is not None:
            return None, self._failure
        sent, channel = self._sent, pipe.channel
        if sent is not None and channel is not None:
            return pipe._answer(lambda: channel.receive(sent))
        return pipe._answer(lambda: pipe._call(batch))


class _Connection:
    """One connection to a channel, used by one call at a time: a plain socket, or the
    extension's TLS session over it (``rpc.tls_socket``). The socket is non-blocking and its
    readiness awaited with ``poll``, so that a plain call costs four system calls: the idle
    check, the send, one poll and one read for the whole answer. With a socket timeout,
    CPython switched the socket's mode and polled before every send and read: eleven."""

    #: What a plain connection reads at once: a whole answer, length and body, as a rule.
    READ_BYTES = 16 * 1024

    def __init__(self, sock: socket.socket, session: _native.TlsSession | None) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.session = session
        self._buffered = bytearray()  # a plain connection's bytes read and not yet asked for

    @classmethod
    def open(
        cls,
        sock: socket.socket,
        tls: _native.TlsConfig | None,
        server_uuid: str,
        deadline: float,
    ) -> _Connection:
        """Over connected ``sock``: plain, or after a TLS handshake checking that the server's
        certificate names ``server_uuid`` (``ConnectionError`` if it fails)."""
        if tls is None:
            return cls(sock, None)
        session = _native.TlsSession(tls, sock.fileno(), peer_server_name(server_uuid))
        connection = cls(sock, session)
        while (step := session.handshake()) != _HANDSHAKE_DONE:
            connection._wait(write=step != _HANDSHAKE_WANT_READ, deadline=deadline)
        return connection

    def send(self, data: bytes, deadline: float) -> None:
        """All of ``data``, by ``deadline`` (``TimeoutError``)."""
        if self.session is None:
            view = memoryview(data)
            while view:
                try:
                    view = view[self.sock.send(view) :]
                except BlockingIOError:
                    self._wait(write=True, deadline=deadline)
            return
        unsent = self.session.send(data)
        while unsent:
            self._wait(write=True, deadline=deadline)
            unsent = self.session.flush()

    def receive(self, length: int, deadline: float) -> bytes:
        """Exactly ``length`` bytes, by ``deadline`` (``TimeoutError`` after it,
        ``ConnectionResetError`` if the connection ends first)."""
        buffered = self._buffered
        if len(buffered) >= length:  # read with what came before it
            out = bytes(buffered[:length])
            del buffered[:length]
            return out
        # A plain connection reads what has come, past ``length`` too (an answer's body with
        # its length); TLS reads only what it is asked for.
        room = length if self.session is not None else max(length, self.READ_BYTES)
        buffer = bytearray(room)
        buffer[: len(buffered)] = buffered
        got = len(buffered)
        buffered.clear()
        view = memoryview(buffer)
        while got < length:
            n = self._recv_into(view[got:], deadline)
            if n == 0:
                raise ConnectionResetError("the server closed the write channel inside an answer")
            got += n
        buffered += view[length:got]
        return bytes(view[:length])

    def alive(self) -> bool:
        """True if this idle connection is still open (no end and nothing unasked waits on
        it)."""
        if self._buffered or (self.session is not None and self.session.has_buffered()):
            return False
        try:
            self.sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return False  # ended, or bytes no call asked for wait on it

    def close(self) -> None:
        self.sock.close()

    def _recv_into(self, view: memoryview, deadline: float) -> int:
        if self.session is None:
            while True:  # polled first: an answer has rarely come yet when it is asked for
                self._wait(write=False, deadline=deadline)
                try:
                    return self.sock.recv_into(view)
                except BlockingIOError:
                    continue
        while (n := self.session.recv_into(view)) < 0:
            self._wait(write=False, deadline=deadline)
        return n

    def _wait(self, *, write: bool, deadline: float) -> None:
        remaining_ms = (deadline - time.monotonic()) * 1000
        if remaining_ms <= 0:
            raise TimeoutError("the write channel's deadline passed")
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLOUT if write else select.POLLIN)
        if not poller.poll(remaining_ms):
            raise TimeoutError("the write channel's deadline passed")


def _multi_request(batch: list[_Pending]) -> bytes:
    """The serialized ``WriteMultiRequestPB`` carrying ``batch``."""
    multi = tserver_pb2.WriteMultiRequestPB(dest_uuid=batch[0].dest_uuid)
    parts = [multi.SerializeToString()]
    for p in batch:
        sub = _request_parts(p)
        parts.append(length_delimited_head(_REQUESTS_FIELD, sum(map(len, sub))))
        parts += sub
    return b"".join(parts)


def _serialized_call(
    channel: grpc.Channel, method: str, response_type: type[_Response]
) -> grpc.UnaryUnaryMultiCallable[bytes, _Response]:
    """TabletService's ``method`` over ``channel``, taking its request already serialized."""
    # ``_registered_method`` is gRPC's own argument, which the generated stubs pass too;
    # grpc's type stubs do not declare it.
    return channel.unary_unary(  # type: ignore[call-arg]
        f"/nyala.TabletService/{method}",
        request_serializer=None,
        response_deserializer=response_type.FromString,
        _registered_method=True,
    )


def _request_parts(pending: _Pending) -> list[bytes]:
    """The serialized ``WriteRequestPB`` of ``pending``, in pieces that join into it."""
    return [pending.head, length_delimited_head(_OPS_FIELD, len(pending.ops)), pending.ops]


__all__ = [
    "CALL_BYTES_MAX",
    "CALL_REQUESTS_MAX",
    "CHANNEL_RETRY_S",
    "INFLIGHT_CALLS_MAX",
    "WriteChannel",
    "WritePipe",
]
