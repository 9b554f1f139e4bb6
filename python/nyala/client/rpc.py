"""The client's channels: one gRPC channel per server address, shared by every call, and the
retry policy (which errors are worth another attempt, and how long to wait between them).

Calls are blocking or futures (``stub.Method.future``), so one thread can have a Write in flight
to every tablet leader at once without an event loop in the user's program.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import TypeAlias, TypeVar

import grpc

from nyala import errors
from nyala._proto import consensus_pb2_grpc, master_pb2_grpc, tserver_pb2_grpc
from nyala.rpc.channel import open_blocking_channel
from nyala.rpc.errors import error_from_grpc, raise_for_response, split_host_port
from nyala.rpc.messages import Answer
from nyala.rpc.settings import RpcSettings

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp", bound=Answer)

#: First and largest pause between retries, in milliseconds (exponential with jitter).
RETRY_BACKOFF_MIN_MS = 20
RETRY_BACKOFF_MAX_MS = 1_000


class Stubs:
    """The generated stubs of the services a client calls, over one channel."""

    def __init__(self, addr: str, channel: grpc.Channel) -> None:
        self.addr = addr
        self.channel = channel
        self.master = master_pb2_grpc.MasterServiceStub(channel)
        self.tablet = tserver_pb2_grpc.TabletServiceStub(channel)
        self.consensus = consensus_pb2_grpc.ConsensusServiceStub(channel)

    def call(
        self, method: grpc.UnaryUnaryMultiCallable[_Req, _Resp], request: _Req, timeout_ms: int
    ) -> _Resp:
        """A blocking unary call; raises the mapped ``nyala.errors`` exception on failure."""
        try:
            response = method(request, timeout=timeout_ms / 1000)
        except grpc.RpcError as err:
            raise error_from_grpc(err, target=self.addr) from None
        return raise_for_response(response)

    def start(
        self, method: grpc.UnaryUnaryMultiCallable[_Req, _Resp], request: _Req, timeout_ms: int
    ) -> grpc.Future[_Resp]:
        """A unary call in flight; finish it with ``finish``."""
        return method.future(request, timeout=timeout_ms / 1000)

    def finish(self, future: grpc.Future[_Resp]) -> _Resp:
        """The answer of a call from ``start``; raises like ``call``."""
        try:
            response = future.result()
        except grpc.RpcError as err:
            raise error_from_grpc(err, target=self.addr) from None
        return raise_for_response(response)


#: Picks the method to call from the stubs of the server it is sent to
#: (``lambda s: s.master.CreateTable``). Quoted: grpc's classes are generic only to the type
#: checker.
StubMethod: TypeAlias = "Callable[[Stubs], grpc.UnaryUnaryMultiCallable[_Req, _Resp]]"


class ChannelPool:
    """One channel per address, created on first use and kept until ``close``."""

    def __init__(self, settings: RpcSettings | None = None) -> None:
        self.settings = settings or RpcSettings()
        self._stubs: dict[str, Stubs] = {}
        self._lock = threading.Lock()
        self._closed = False

    def get(self, addr: str) -> Stubs:
        """The stubs for ``addr`` (``InvalidArgumentError`` if it is not ``host:port``)."""
        with self._lock:
            if self._closed:
                raise errors.IllegalStateError("the client is closed")
            stubs = self._stubs.get(addr)
            if stubs is None:
                split_host_port(addr)
                channel = open_blocking_channel(addr, self.settings)
                stubs = Stubs(addr, channel)
                self._stubs[addr] = stubs
            return stubs

    def close(self) -> None:
        """Closes every channel; later calls fail with ``IllegalStateError``."""
        with self._lock:
            self._closed = True
            stubs, self._stubs = list(self._stubs.values()), {}
        for s in stubs:
            s.channel.close()


class Backoff:
    """Exponential back-off with full jitter inside a deadline (monotonic seconds)."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.attempt = 0

    def remaining_ms(self) -> int:
        """Milliseconds left before the deadline (at least 1)."""
        return max(1, int((self.deadline - time.monotonic()) * 1000))

    def expired(self) -> bool:
        """True once the deadline has passed."""
        return time.monotonic() >= self.deadline

    def sleep(self) -> None:
        """Waits before the next attempt (never past the deadline)."""
        cap_ms = min(RETRY_BACKOFF_MAX_MS, RETRY_BACKOFF_MIN_MS * (2**self.attempt))
        self.attempt += 1
        pause_s = random.uniform(cap_ms / 2, cap_ms) / 1000
        time.sleep(max(0.0, min(pause_s, self.deadline - time.monotonic())))


class ObservedTimestamp:
    """The latest hybrid timestamp a client has observed in any write or scan response
    (Kudu's timestamp propagation, docs/consistency.md). Sent with every request, it moves
    the server's clock past it, so a later write is stamped later and a read-your-writes
    scan sees everything this client wrote or read before. Thread-safe."""

    def __init__(self) -> None:
        self._latest = 0
        self._lock = threading.Lock()

    @property
    def latest(self) -> int:
        """The latest timestamp observed (0 before the first response)."""
        return self._latest

    def observe(self, timestamp: int) -> None:
        """Keeps ``timestamp`` if it is later than the latest one observed."""
        if timestamp > self._latest:
            with self._lock:
                self._latest = max(self._latest, timestamp)


__all__ = ["Backoff", "ChannelPool", "ObservedTimestamp", "StubMethod", "Stubs"]
