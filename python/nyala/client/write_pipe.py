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

The pipe has no thread of its own: the writer whose request finds the pipe idle starts the call,
and the gRPC completion callback answers the waiters and starts the next call.

A write's rows (``ops``, megabytes under a bulk load) are never put into a protobuf message: the
pipe serializes the rest of the ``WriteRequestPB`` and joins the rows after it as field ``ops``
(``nyala.rpc.pb_fields``), one copy where building the messages made three.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeAlias, TypeVar

import grpc
from google.protobuf.message import Message

from nyala import errors
from nyala._proto import tserver_pb2
from nyala.client.rpc import Stubs
from nyala.rpc.errors import error_from_grpc, error_from_pb
from nyala.rpc.pb_fields import length_delimited_head

#: Calls to one server in flight at once; more writes wait and go together in the next call
#: (1 measured better than 2: larger calls, less CPU per write, docs/performance.md).
INFLIGHT_CALLS_MAX = 1
#: Most writes one call carries.
CALL_REQUESTS_MAX = 1024
#: Most row bytes one call carries (a single larger write still goes, alone); well under the
#: RPC message limit.
CALL_BYTES_MAX = 8 * 1024 * 1024

_OPS_FIELD = tserver_pb2.WriteRequestPB.DESCRIPTOR.fields_by_name["ops"].number
_REQUESTS_FIELD = tserver_pb2.WriteMultiRequestPB.DESCRIPTOR.fields_by_name["requests"].number
_Response = TypeVar("_Response", bound=Message)

# A call in flight: Write (one write) or WriteMulti (several). Quoted: ``grpc.Future`` is
# generic only to the type checker.
_Call: TypeAlias = (
    "grpc.Future[tserver_pb2.WriteResponsePB] | grpc.Future[tserver_pb2.WriteMultiResponsePB]"
    " | _Completed"
)


class _Completed:
    """A blocking call made at once, read back like a finished future (``result()``)."""

    def __init__(self, call: Callable[[], tserver_pb2.WriteResponsePB]) -> None:
        self._response: tserver_pb2.WriteResponsePB | None = None
        self._error: BaseException | None = None
        try:
            self._response = call()
        except Exception as exc:  # raised again by result(), as a future would
            self._error = exc

    def result(self) -> tserver_pb2.WriteResponsePB:
        if self._error is not None:
            raise self._error
        assert self._response is not None, "a call that did not raise answered"
        return self._response


@dataclass(eq=False)
class _Pending:
    """One write waiting for its answer."""

    dest_uuid: str
    head: bytes  # the serialized WriteRequestPB without ``ops``
    ops: bytes
    deadline: float  # time.monotonic()
    done: threading.Event = field(default_factory=threading.Event)
    response: tserver_pb2.WriteResponsePB | None = None
    error: BaseException | None = None
    abandoned: bool = False  # its caller stopped waiting before it was sent

    def settle(
        self, response: tserver_pb2.WriteResponsePB | None, error: BaseException | None
    ) -> None:
        self.response, self.error = response, error
        self.done.set()


class WritePipe:
    """Sends the writes to one server, coalescing those issued while calls are in flight."""

    def __init__(
        self,
        stubs: Stubs,
        *,
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
        self._lock = threading.Lock()
        self._queue: deque[_Pending] = deque()
        self._inflight = 0
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
        pending = _Pending(
            request.dest_uuid,
            request.SerializeToString(),
            ops,
            time.monotonic() + timeout_ms / 1000,
        )
        with self._lock:
            self._queue.append(pending)
            batch = self._take_locked()
        if batch == [pending]:
            self._call_inline(pending)
        elif batch:
            self._start(batch)
        if not pending.done.wait(timeout_ms / 1000):
            with self._lock:
                if not pending.done.is_set():
                    pending.abandoned = True  # if still queued, it is never sent
            if not pending.done.is_set():
                raise errors.TimedOutError(
                    f"write to {self.stubs.addr} not answered within {timeout_ms} ms "
                    "(its outcome is unknown)"
                )
        if pending.error is not None:
            raise pending.error
        assert pending.response is not None, "settled with a response or an error"
        return pending.response

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

    def _call_inline(self, pending: _Pending) -> None:
        """Sends a write that found the pipe idle and alone as a blocking call in its caller's
        thread. A sync channel's ``future()`` starts a polling thread whenever the channel has
        no call in flight and stops it when the call ends, so a lone writer paid a thread start
        per write (docs/performance.md); calls queued meanwhile still go as futures."""
        timeout_s = max(0.001, pending.deadline - time.monotonic())
        request = b"".join(_request_parts(pending))
        self._finish([pending], _Completed(lambda: self._write(request, timeout=timeout_s)), None)

    def _start(self, batch: list[_Pending]) -> None:
        timeout_s = max(0.001, max(p.deadline for p in batch) - time.monotonic())
        call: _Call
        try:
            if len(batch) == 1:
                call = self._write.future(b"".join(_request_parts(batch[0])), timeout=timeout_s)
            else:
                multi = tserver_pb2.WriteMultiRequestPB(dest_uuid=batch[0].dest_uuid)
                parts = [multi.SerializeToString()]
                for p in batch:
                    sub = _request_parts(p)
                    parts.append(length_delimited_head(_REQUESTS_FIELD, sum(map(len, sub))))
                    parts += sub
                call = self._write_multi.future(b"".join(parts), timeout=timeout_s)
        except Exception as exc:  # e.g. the channel is closed: fails only this batch
            self._finish(batch, None, exc)
            return
        call.add_done_callback(lambda done: self._finish(batch, done, None))

    def _finish(
        self, batch: list[_Pending], call: _Call | None, failure: BaseException | None
    ) -> None:
        try:
            self._settle(batch, call, failure)
        finally:
            with self._lock:
                self._inflight -= 1
                following = self._take_locked()
            if following:
                self._start(following)

    def _settle(
        self, batch: list[_Pending], call: _Call | None, failure: BaseException | None
    ) -> None:
        if failure is None:
            assert call is not None, "a call that did not fail to start"
            try:
                response = call.result()
            except grpc.RpcError as err:
                failure = error_from_grpc(err, target=self.stubs.addr)
            except Exception as exc:  # cancelled, or a bug in the transport
                failure = errors.NetworkError(f"write call to {self.stubs.addr} failed: {exc}")
        if failure is not None:
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
        for p, sub in zip(batch, response.responses, strict=True):
            if sub.HasField("error"):
                p.settle(None, error_from_pb(sub.error))
            else:
                p.settle(sub, None)


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


__all__ = ["CALL_BYTES_MAX", "CALL_REQUESTS_MAX", "INFLIGHT_CALLS_MAX", "WritePipe"]
