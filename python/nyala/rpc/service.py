"""Server-side plumbing shared by every RPC handler: the ``dest_uuid`` check, turning
exceptions into ``ErrorPB`` answers, and per-method metrics.

A handler is an ``async def`` method of a ``ServiceBase`` subclass decorated with ``@unary``
(or ``@server_stream``). It raises ``nyala.errors`` exceptions; the decorator answers them as
the response's ``error`` field, so handlers never build error responses by hand.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol, TypeAlias, TypeVar

import grpc

from nyala._proto import common_pb2
from nyala.common.metrics import MetricsRegistry
from nyala.errors import InvalidArgumentError, NyalaError, WrongServerUuidError
from nyala.rpc.errors import error_to_pb
from nyala.rpc.messages import Addressed, Answer

log = logging.getLogger(__name__)

_S = TypeVar("_S", bound="ServiceBase")
_Req = TypeVar("_Req", bound=Addressed)
_Resp = TypeVar("_Resp", bound=Answer)
_Resp_co = TypeVar("_Resp_co", bound=Answer, covariant=True)


class AnswerClass(Protocol[_Resp_co]):
    """A response message class: made with only its ``error`` set when the handler fails."""

    def __call__(self, *, error: common_pb2.ErrorPB) -> _Resp_co: ...


#: The context gRPC hands a handler, for the call's request and response types (nyala's
#: handlers never use it: failures travel in the response's ``error``).
Context: TypeAlias = grpc.aio.ServicerContext

# The handlers each decorator takes (quoted: grpc's classes are generic only to the checker).
_Unary: TypeAlias = "Callable[[_S, _Req, Context[_Req, _Resp]], Awaitable[_Resp]]"
_ServerStream: TypeAlias = "Callable[[_S, _Req, Context[_Req, _Resp]], AsyncIterator[_Resp]]"
_BidiStream: TypeAlias = (
    "Callable[[_S, AsyncIterator[_Req], Context[_Req, _Resp]], AsyncIterator[_Resp]]"
)


def check_dest_uuid(dest_uuid: str, server_uuid: str, *, allow_empty: bool = False) -> None:
    """Refuses a request meant for another server (DESIGN.md §1).

    An empty ``dest_uuid`` is accepted only where the caller cannot know the UUID yet (Ping).
    """
    if not dest_uuid:
        if allow_empty:
            return
        raise InvalidArgumentError("request has no dest_uuid")
    if dest_uuid != server_uuid:
        raise WrongServerUuidError(
            f"request is for server {dest_uuid}, but this is server {server_uuid}"
        )


class RpcMetrics:
    """Request counts by method and outcome, and latency by method."""

    def __init__(self, registry: MetricsRegistry) -> None:
        self.requests = registry.counter(
            "nyala_rpc_requests_total",
            "RPCs handled, by method and result code",
            ("method", "code"),
        )
        self.duration = registry.histogram(
            "nyala_rpc_duration_seconds", "Time to handle an RPC, by method", ("method",)
        )

    def record(self, method: str, code: str, elapsed_s: float) -> None:
        """Counts one finished call."""
        self.requests.inc(method=method, code=code)
        self.duration.observe(elapsed_s, method=method)


class ServiceBase:
    """Base of every servicer: knows the server's UUID and where to record metrics."""

    def __init__(self, server_uuid: str, metrics: RpcMetrics) -> None:
        self.server_uuid = server_uuid
        self.rpc_metrics = metrics


def _error_response(response_cls: AnswerClass[_Resp], method: str, exc: BaseException) -> _Resp:
    if not isinstance(exc, NyalaError):
        # A bug, not a refusal: keep the traceback in the server log.
        log.exception("%s failed with an unexpected error", method, exc_info=exc)
    return response_cls(error=error_to_pb(exc))


def _code_name(response: Answer) -> str:
    if not response.HasField("error"):
        return "OK"
    return str(common_pb2.ErrorCode.Name(response.error.code))


def unary(
    response_cls: AnswerClass[_Resp], *, allow_empty_dest: bool = False
) -> Callable[[_Unary[_S, _Req, _Resp]], _Unary[_S, _Req, _Resp]]:
    """Decorates a unary handler ``async def M(self, request, context) -> response``."""

    def decorate(fn: _Unary[_S, _Req, _Resp]) -> _Unary[_S, _Req, _Resp]:
        method = fn.__name__

        @functools.wraps(fn)
        async def handle(self: _S, request: _Req, context: Context[_Req, _Resp]) -> _Resp:
            start_s = time.monotonic()
            try:
                check_dest_uuid(request.dest_uuid, self.server_uuid, allow_empty=allow_empty_dest)
                response = await fn(self, request, context)
            except Exception as exc:  # every failure becomes an answer
                response = _error_response(response_cls, method, exc)
            self.rpc_metrics.record(method, _code_name(response), time.monotonic() - start_s)
            return response

        return handle

    return decorate


_UnarySerialized: TypeAlias = "Callable[[_S, _Req, Context[_Req, bytes]], Awaitable[bytes]]"


def unary_serialized(
    response_cls: AnswerClass[_Resp], *, allow_empty_dest: bool = False
) -> Callable[[_UnarySerialized[_S, _Req]], _UnarySerialized[_S, _Req]]:
    """Decorates a unary handler that returns its response already serialized (a large
    ``bytes`` field put in place without protobuf's copies, ``nyala.rpc.pb_fields``); a failure
    is answered with ``response_cls``'s error, serialized here. Register the method with its
    response serializer replaced (``nyala.rpc.server.override_serializers``)."""

    def decorate(fn: _UnarySerialized[_S, _Req]) -> _UnarySerialized[_S, _Req]:
        method = fn.__name__

        @functools.wraps(fn)
        async def handle(self: _S, request: _Req, context: Context[_Req, bytes]) -> bytes:
            start_s = time.monotonic()
            try:
                check_dest_uuid(request.dest_uuid, self.server_uuid, allow_empty=allow_empty_dest)
                data = await fn(self, request, context)
                code = "OK"
            except Exception as exc:  # every failure becomes an answer
                response = _error_response(response_cls, method, exc)
                data, code = response.SerializeToString(), _code_name(response)
            self.rpc_metrics.record(method, code, time.monotonic() - start_s)
            return data

        return handle

    return decorate


def server_stream(
    response_cls: AnswerClass[_Resp],
) -> Callable[[_ServerStream[_S, _Req, _Resp]], _ServerStream[_S, _Req, _Resp]]:
    """Decorates a streaming handler; a failure ends the stream with one error message."""

    def decorate(fn: _ServerStream[_S, _Req, _Resp]) -> _ServerStream[_S, _Req, _Resp]:
        method = fn.__name__

        @functools.wraps(fn)
        async def handle(
            self: _S, request: _Req, context: Context[_Req, _Resp]
        ) -> AsyncIterator[_Resp]:
            start_s = time.monotonic()
            try:
                check_dest_uuid(request.dest_uuid, self.server_uuid)
                async for response in fn(self, request, context):
                    yield response
            except Exception as exc:  # every failure becomes an answer
                response = _error_response(response_cls, method, exc)
                # Recorded before the last yield: the client may act on the error at once.
                self.rpc_metrics.record(method, _code_name(response), time.monotonic() - start_s)
                yield response
                return
            self.rpc_metrics.record(method, "OK", time.monotonic() - start_s)

        return handle

    return decorate


def bidi_stream(
    response_cls: AnswerClass[_Resp],
) -> Callable[[_BidiStream[_S, _Req, _Resp]], _BidiStream[_S, _Req, _Resp]]:
    """Decorates a bidirectional-stream handler ``async def M(self, requests, context)``.

    Every request of the stream has its ``dest_uuid`` checked before the handler sees it; a
    failure ends the stream with one error message. Metrics count streams, not messages.
    """

    def decorate(fn: _BidiStream[_S, _Req, _Resp]) -> _BidiStream[_S, _Req, _Resp]:
        method = fn.__name__

        @functools.wraps(fn)
        async def handle(
            self: _S, requests: AsyncIterator[_Req], context: Context[_Req, _Resp]
        ) -> AsyncIterator[_Resp]:
            async def checked() -> AsyncIterator[_Req]:
                async for request in requests:
                    check_dest_uuid(request.dest_uuid, self.server_uuid)
                    yield request

            start_s = time.monotonic()
            try:
                async for response in fn(self, checked(), context):
                    yield response
            except Exception as exc:  # every failure becomes an answer
                response = _error_response(response_cls, method, exc)
                self.rpc_metrics.record(method, _code_name(response), time.monotonic() - start_s)
                yield response
                return
            self.rpc_metrics.record(method, "OK", time.monotonic() - start_s)

        return handle

    return decorate
