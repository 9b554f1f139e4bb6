"""Finding and talking to the leader master (DESIGN.md §1, seed 004).

``MasterConnection`` asks every configured master ``ConnectToMaster`` in parallel and keeps the
one that says it leads with its catalog loaded. Every master call goes to that leader with its
UUID as ``dest_uuid``; on ``NOT_THE_LEADER``, ``CATALOG_MANAGER_NOT_INITIALIZED``, an unreachable
or wrong server it rediscovers and retries with back-off until the call's deadline. A client
configured with masters that are not the cluster's (another count, or an address the cluster
does not list) is refused with ``InvalidArgumentError`` rather than half-working.

With ``unreachable_fail_ms`` (the command line sets it), discovery gives up early when no
master could be reached at all (nothing listens, no route) for that long, raising
``NetworkError`` with each master's own error ("Connection refused") instead of retrying until
the deadline; a master that answers, even as a follower, keeps the retries going.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from nyala import errors
from nyala._proto import master_pb2
from nyala.client.rpc import Backoff, ChannelPool, StubMethod
from nyala.rpc.credentials import handshake_refusal
from nyala.rpc.errors import join_host_port, split_host_port
from nyala.rpc.messages import Addressable, Answer

_Req = TypeVar("_Req", bound=Addressable)
_Resp = TypeVar("_Resp", bound=Answer)

#: How long one ConnectToMaster round may take, in milliseconds.
CONNECT_ROUND_TIMEOUT_MS = 2_000


@dataclass(frozen=True)
class LeaderMaster:
    """The master that answered as leader with a loaded catalog."""

    uuid: str
    addr: str
    term: int


def parse_masters(masters: str | Sequence[str]) -> list[str]:
    """``"h1:p1,h2:p2"`` or a list of addresses, validated and de-duplicated in order."""
    parts = masters.split(",") if isinstance(masters, str) else list(masters)
    addrs: list[str] = []
    for part in parts:
        addr = part.strip()
        if not addr:
            continue
        host, port = split_host_port(addr)
        normal = join_host_port(host, port)
        if normal not in addrs:
            addrs.append(normal)
    if not addrs:
        raise errors.InvalidArgumentError("no master addresses given")
    return addrs


class _NoLeader(errors.ServiceUnavailableError):
    """No master answered as a ready leader in one round; ``unreachable``: none answered."""

    def __init__(self, message: str, *, unreachable: bool) -> None:
        super().__init__(message)
        self.unreachable = unreachable


class MasterConnection:
    """The client's link to the leader master."""

    def __init__(
        self,
        masters: Sequence[str],
        pool: ChannelPool,
        *,
        timeout_ms: int,
        unreachable_fail_ms: int | None = None,
    ) -> None:
        self.masters = list(masters)
        self.pool = pool
        self.timeout_ms = timeout_ms
        self.unreachable_fail_ms = unreachable_fail_ms
        self._leader: LeaderMaster | None = None
        self._lock = threading.Lock()

    @property
    def leader(self) -> LeaderMaster | None:
        """The leader found last (None before the first discovery or after a failure)."""
        return self._leader

    def discover(self, deadline: float) -> LeaderMaster:
        """Asks every master until one leads with a loaded catalog or ``deadline`` passes."""
        backoff = Backoff(deadline)
        last: Exception | None = None
        unreachable_since: float | None = None
        while True:
            try:
                leader = self._discover_once(min(CONNECT_ROUND_TIMEOUT_MS, backoff.remaining_ms()))
                with self._lock:
                    self._leader = leader
                return leader
            except (errors.InvalidArgumentError, errors.NotAuthenticatedError):
                raise
            except _NoLeader as exc:
                last = exc
                now = time.monotonic()
                unreachable_since = (unreachable_since or now) if exc.unreachable else None
                limit_ms = self.unreachable_fail_ms
                if (
                    unreachable_since is not None
                    and limit_ms is not None
                    and (now - unreachable_since) * 1000 >= limit_ms
                ):
                    raise errors.NetworkError(f"no master could be reached: {exc}") from None
            except errors.NyalaError as exc:
                last = exc
            if backoff.expired():
                raise errors.TimedOutError(
                    f"no leader master among {','.join(self.masters)} before the deadline: {last}"
                )
            backoff.sleep()

    def _discover_once(self, timeout_ms: int) -> LeaderMaster:
        calls = []
        for addr in self.masters:
            stubs = self.pool.get(addr)
            request = master_pb2.ConnectToMasterRequestPB()
            calls.append((stubs, stubs.start(stubs.master.ConnectToMaster, request, timeout_ms)))
        problems: list[str] = []
        found: LeaderMaster | None = None
        unreachable = 0
        for stubs, future in calls:
            try:
                response = stubs.finish(future)
            except errors.NotAuthenticatedError:
                raise  # a master refused these credentials (revoked): no retry helps
            except errors.NyalaError as exc:
                unreachable += isinstance(exc, errors.NetworkError)
                problems.append(f"{stubs.addr}: {type(exc).__name__}: {_cause(exc)}")
                continue
            self._check_membership(stubs.addr, response)
            if response.role == master_pb2.ROLE_LEADER and response.catalog_ready:
                if found is None or response.term > found.term:
                    found = LeaderMaster(response.master_uuid, stubs.addr, response.term)
            else:
                problems.append(f"{stubs.addr}: not a ready leader")
        if found is None and unreachable == len(calls):
            refusal = handshake_refusal(self.masters[0], self.pool.settings.tls)
            if refusal is not None:
                raise errors.NotAuthenticatedError(f"{self.masters[0]}: {refusal}")
        if found is None:
            raise _NoLeader(
                "; ".join(problems) or "no master answered",
                unreachable=unreachable == len(calls),
            )
        return found

    def _check_membership(self, addr: str, response: master_pb2.ConnectToMasterResponsePB) -> None:
        cluster = sorted(
            join_host_port(m.rpc_addr.host, m.rpc_addr.port)
            for m in response.masters
            if m.rpc_addr.host
        )
        if not cluster:
            return
        configured = sorted(self.masters)
        if len(cluster) != len(configured) or not set(configured) <= set(cluster):
            raise errors.InvalidArgumentError(
                f"the configured masters {','.join(configured)} are not the cluster's masters "
                f"{','.join(cluster)} (as reported by {addr})"
            )

    def call(
        self,
        method: StubMethod[_Req, _Resp],
        request: _Req,
        *,
        timeout_ms: int | None = None,
    ) -> _Resp:
        """Sends ``request`` (its ``dest_uuid`` is filled in) to ``method(stubs)`` of the leader
        master, rediscovering and retrying on retriable errors until the deadline."""
        deadline = time.monotonic() + (timeout_ms or self.timeout_ms) / 1000
        backoff = Backoff(deadline)
        while True:
            leader = self._leader or self.discover(deadline)
            stubs = self.pool.get(leader.addr)
            request.dest_uuid = leader.uuid
            try:
                return stubs.call(method(stubs), request, backoff.remaining_ms())
            except errors.RETRIABLE as exc:
                with self._lock:
                    if self._leader == leader:
                        self._leader = None
                if backoff.expired():
                    raise errors.TimedOutError(
                        f"master call failed until the deadline: {exc}"
                    ) from exc
                backoff.sleep()


def _cause(exc: errors.NyalaError) -> str:
    """The useful end of a transport error: gRPC's last error ("Connection refused")."""
    text = " ".join(str(exc).split())
    _, sep, last = text.rpartition("last error: ")
    if sep:
        return last.rsplit(": ", 1)[-1] if ": " in last else last
    return text


__all__ = ["LeaderMaster", "MasterConnection", "parse_masters"]
