"""How replicas of one tablet reach each other: the ``Transport`` protocol the ``RaftRuntime``
drives, an in-memory network (benchmarks and tests of the runtime), and the gRPC transport
(``GrpcTransport``: AppendEntries and vote requests on the server's one stream per peer
server, ``PeerStreams``; unary ``RunLeaderElection``; plus the reply routing the server's
``ConsensusService`` handlers use). Delivery is best effort: Raft tolerates loss, duplication is
not produced.

A transport owns its connections and tasks; it never interprets a message beyond routing it
and never touches the log or the core. ``run`` is started by the runtime inside its task group
and ends by cancellation (STYLE.md 15).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeAlias, TypeVar

from nyala import _native
from nyala._proto import common_pb2, consensus_pb2
from nyala.consensus.messages import (
    AppendRequest,
    AppendResponse,
    AppendStatus,
    Message,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from nyala.consensus.runtime import wire
from nyala.consensus.runtime.peer_streams import (
    AnswerHandoff,
    AnswerWhenDurable,
    LateAnswer,
    PeerStreams,
)
from nyala.consensus.types import OpId
from nyala.errors import NyalaError, ServiceUnavailableError
from nyala.rpc.channel import ServerProxy
from nyala.rpc.errors import raise_for_response
from nyala.rpc.settings import RpcSettings

log = logging.getLogger(__name__)

_T = TypeVar("_T")

Deliver = Callable[[Message], None]
"""The runtime's inbound callback: queues a message, never blocks."""


class Transport(Protocol):
    """One replica's connection to its peers."""

    async def run(self, deliver: Deliver) -> None:
        """Hands inbound messages to ``deliver`` until cancelled."""
        ...

    def send(self, message: Message) -> None:
        """Queues ``message`` for ``message.dest``; never blocks; may drop it."""
        ...


class InMemoryNetwork:
    """Replicas in one process and one event loop; messages keep their Python objects.

    Each destination gets one delivery callback per loop turn for everything queued to it, so
    a burst of sends costs one scheduling, not one per message. ``isolate`` drops everything
    to and from a replica (a crash or a partition, as the caller sees fit).
    """

    def __init__(self) -> None:
        self._endpoints: dict[str, Deliver] = {}
        self._queues: dict[str, deque[Message]] = {}
        self._flush_scheduled: set[str] = set()
        self._isolated: set[str] = set()
        self.messages_sent = 0
        self.messages_dropped = 0

    def transport(self, uuid: str) -> InMemoryTransport:
        """The transport of replica ``uuid``."""
        return InMemoryTransport(self, uuid)

    def isolate(self, uuid: str) -> None:
        """Drops every message to or from ``uuid`` until ``heal``."""
        self._isolated.add(uuid)

    def heal(self, uuid: str | None = None) -> None:
        """Ends the isolation of ``uuid`` (of everybody when None)."""
        if uuid is None:
            self._isolated.clear()
        else:
            self._isolated.discard(uuid)

    def _attach(self, uuid: str, deliver: Deliver) -> None:
        self._endpoints[uuid] = deliver
        self._queues.setdefault(uuid, deque())

    def _detach(self, uuid: str) -> None:
        self._endpoints.pop(uuid, None)
        queue = self._queues.get(uuid)
        if queue:
            self.messages_dropped += len(queue)
            queue.clear()

    def _post(self, message: Message) -> None:
        dest = message.dest
        if dest not in self._endpoints or {dest, message.src} & self._isolated:
            self.messages_dropped += 1
            return
        self.messages_sent += 1
        self._queues[dest].append(message)
        if dest not in self._flush_scheduled:
            self._flush_scheduled.add(dest)
            asyncio.get_running_loop().call_soon(self._flush, dest)

    def _flush(self, dest: str) -> None:
        self._flush_scheduled.discard(dest)
        deliver = self._endpoints.get(dest)
        queue = self._queues[dest]
        if deliver is None:
            self.messages_dropped += len(queue)
            queue.clear()
            return
        while queue:
            deliver(queue.popleft())


class InMemoryTransport:
    """One replica's end of an ``InMemoryNetwork``."""

    def __init__(self, network: InMemoryNetwork, uuid: str) -> None:
        self._network = network
        self.uuid = uuid

    async def run(self, deliver: Deliver) -> None:
        """Attaches to the network until cancelled; a detached replica receives nothing."""
        self._network._attach(self.uuid, deliver)
        try:
            await asyncio.get_running_loop().create_future()  # until cancelled
        finally:
            self._network._detach(self.uuid)

    def send(self, message: Message) -> None:
        """Queues ``message``; dropped if its destination is not attached or isolated."""
        assert message.src == self.uuid, (message.src, self.uuid)
        if self.uuid not in self._network._endpoints:
            self._network.messages_dropped += 1
            return
        self._network._post(message)


@dataclass(frozen=True, slots=True)
class GrpcTransportOptions:
    """Limits of the gRPC transport, with their units."""

    # RunLeaderElection deadline. (Vote requests go on the peer streams, which have no
    # deadline per request: an answer comes, or the stream breaks.)
    election_nudge_timeout_ms: int = 2_000
    reply_timeout_ms: int = 5_000  # how long a server handler waits for the core's answer


#: How often the answers ``follow_append`` handed to the log are looked at.
_HANDED_CHECK_S = 0.1

FollowLeader: TypeAlias = Callable[[int, str, Callable[[], OpId | None], int], bool]
"""``RaftRuntime.follow_leader``: (term, leader, append, committed index) -> appended."""


@dataclass(frozen=True, slots=True)
class _Handed:
    """An answer ``follow_append`` handed to the log, until written or taken back."""

    deadline: float  # time.monotonic()
    answer: _native.DurableAnswer
    call_id: int
    last: OpId
    term: int
    late: LateAnswer


@dataclass(frozen=True, slots=True)
class _PendingAppend:
    """An AppendEntries handed to the core (``seq`` stamped by the transport) and the future
    of the core's answer to it."""

    request: AppendRequest
    answer: asyncio.Future[AppendResponse]


class _DurableWatch:
    """What the core last said is durable for one leader, and the handlers waiting for more."""

    def __init__(self) -> None:
        self.index = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def moved(self, index: int) -> None:
        """The core reported ``index`` durable (lower than before after a truncation)."""
        self.index = index
        if not self._waiters:
            return
        waiting = []
        for target, future in self._waiters:
            if future.done():
                continue  # its handler gave up
            if target <= index:
                future.set_result(None)
            else:
                waiting.append((target, future))
        self._waiters = waiting

    def reached(self, target: int) -> asyncio.Future[None]:
        """A future that completes once ``target`` is reported durable."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.index >= target:
            future.set_result(None)
        else:
            self._waiters.append((target, future))
        return future


UpdateReply = Callable[[consensus_pb2.ConsensusResponsePB | NyalaError], None]
"""Where ``GrpcTransport.answer_update`` hands an AppendEntries' answer, or the error."""


class _UpdateAnswer:
    """One received AppendEntries on its way to its answer (``GrpcTransport.answer_update``):
    first the core's answer (within ``reply_timeout_ms``, or the error), then, for an OK
    answer, the durability of what it appended (within another ``reply_timeout_ms``; then the
    answer says what is durable). Given an ``AnswerHandoff`` and a log that takes answers, an
    OK answer not yet durable goes to the log instead, which writes it once durable; the
    first timer then takes it back if the log has not written it by then."""

    __slots__ = (
        "_answer",
        "_durable",
        "_handed",
        "_handoff",
        "_pending",
        "_reply",
        "_timer",
        "_transport",
    )

    def __init__(
        self,
        transport: GrpcTransport,
        pending: _PendingAppend,
        reply: UpdateReply,
        handoff: AnswerHandoff | None,
    ) -> None:
        self._transport = transport
        self._pending: _PendingAppend | None = pending
        self._reply: UpdateReply | None = reply
        self._handoff = handoff
        self._handed: _native.DurableAnswer | None = None
        self._answer: AppendResponse | None = None
        self._durable: asyncio.Future[None] | None = None
        self._timer = self._arm()
        pending.answer.add_done_callback(self._answered)

    def _arm(self) -> asyncio.TimerHandle:
        """``_timed_out`` after ``reply_timeout_ms`` from now."""
        timeout_s = self._transport._opts.reply_timeout_ms / 1000
        return asyncio.get_running_loop().call_later(timeout_s, self._timed_out)

    def _finish(self, answer: consensus_pb2.ConsensusResponsePB | NyalaError) -> None:
        reply, self._reply = self._reply, None
        self._timer.cancel()
        if reply is not None:
            reply(answer)

    def _answered(self, future: asyncio.Future[AppendResponse]) -> None:
        transport = self._transport
        assert self._pending is not None
        transport._append_waiters.pop(self._pending.request.seq, None)
        if self._reply is None:
            return  # timed out already
        if future.cancelled():
            self._finish(ServiceUnavailableError(f"replica {transport.uuid} stopped"))
            return
        answer = future.result()
        if answer.status is not AppendStatus.OK:
            self._finish(wire.append_response_to_pb(answer))
            return
        watch = transport._durable_watch(answer.dest)
        if watch.index >= answer.last_received.index:
            self._finish_durable(answer, watch)
            return
        self._answer = answer
        if self._hand_off(answer):
            return
        self._timer.cancel()
        self._timer = self._arm()  # the second wait: for durability
        transport._watch_wanted(1)  # the log must tell the core of its syncs meanwhile
        self._durable = watch.reached(answer.last_received.index)
        self._durable.add_done_callback(self._made_durable)

    def _hand_off(self, answer: AppendResponse) -> bool:
        """Hands the answer to the log, to go from the committer once durable; the timer
        armed for the core's answer stays, to take it back if the sync takes that long."""
        handoff = self._handoff
        answer_when_durable = self._transport.answer_when_durable
        if handoff is None or answer_when_durable is None:
            return False
        frame = wire.append_response_to_pb(answer, durable_index=answer.last_received.index)
        handed = handoff.send(frame, answer_when_durable)
        if handed is None:
            return False
        self._handed = handed
        self._reply = handoff.late  # if taken back: no longer counted as unanswered
        self._pending = None  # its entries need not stay in memory until the timer
        return True

    def _made_durable(self, _: asyncio.Future[None]) -> None:
        self._transport._watch_wanted(-1)  # reached, or cancelled by the timer
        answer = self._answer
        if self._reply is not None and answer is not None:
            self._finish_durable(answer, self._transport._durable_watch(answer.dest))

    def _finish_durable(self, answer: AppendResponse, watch: _DurableWatch) -> None:
        durable = min(watch.index, answer.last_received.index)
        self._finish(wire.append_response_to_pb(answer, durable_index=durable))

    def _timed_out(self) -> None:
        # A fired handle keeps its callback (this method): cancelled, it lets go of this
        # object, which holds it (a cycle per AppendEntries otherwise).
        self._timer.cancel()
        if self._reply is None:
            return
        handed = self._handed
        if handed is not None and not handed.cancel():
            self._reply = None  # the log wrote it
            return
        answer = self._answer
        if answer is None:  # the core never answered
            assert self._pending is not None
            self._transport._append_waiters.pop(self._pending.request.seq, None)
            self._pending.answer.cancel()
            self._finish(
                ServiceUnavailableError(
                    f"replica {self._transport.uuid} did not answer AppendRequest in time"
                )
            )
            return
        if self._durable is not None:
            self._durable.cancel()  # the watch forgets it
        self._finish_durable(answer, self._transport._durable_watch(answer.dest))


class GrpcTransport:
    """One replica's gRPC side for one tablet.

    Client half (``send``): AppendEntries go to the peer's server on the one stream this
    server keeps to it (``PeerStreams``, shared by every tablet; a transport without a server
    runs a private one); each answer comes back to a callback that knows its request's
    heartbeat ``seq`` (the wire does not carry it). Vote requests go on the same stream;
    leadership-transfer nudges are unary calls. Failed calls lose their messages; Raft
    retries.

    Server half (``submit_update`` then ``answer_update``, or ``handle_update``;
    ``handle_vote``): the server's ConsensusService hands a request in and gets the core's
    answer to it. An AppendEntries is answered once the entries it appended are durable (the
    wire has no slot for a later durability ack).
    """

    def __init__(
        self,
        uuid: str,
        tablet_id: str,
        addresses: Callable[[str], str | None],
        *,
        settings: RpcSettings | None = None,
        options: GrpcTransportOptions | None = None,
        peer_streams: PeerStreams | None = None,
    ) -> None:
        self.uuid = uuid
        self.tablet_id = tablet_id
        self._addresses = addresses  # peer uuid -> "host:port" (the active config's)
        self._settings = settings or RpcSettings()
        self._opts = options or GrpcTransportOptions()
        # The server's streams to its peers; None: this transport runs its own in ``run``.
        self._shared_streams = peer_streams
        self._streams = peer_streams
        # By (address, UUID): a channel checks the peer's certificate names the UUID.
        self._proxies: dict[tuple[str, str], ServerProxy] = {}
        # Server half: vote handlers awaiting the core's answer, by (answer type, asker), FIFO.
        self._waiters: dict[tuple[type, str], deque[asyncio.Future[Message]]] = {}
        # AppendEntries handed to the core, by the stamp put in their ``seq`` (never 0).
        self._stamps = itertools.count(1)
        self._append_waiters: dict[int, asyncio.Future[AppendResponse]] = {}
        # Per leader: what the core last reported durable (answers and durability acks).
        self._durable: dict[str, _DurableWatch] = {}
        self._group: asyncio.TaskGroup | None = None
        self._deliver: Deliver | None = None
        self.messages_dropped = 0
        # Told the uuid of a peer whose stream was refused with TABLET_NOT_FOUND (the runtime's
        # ``peer_needs_copy``: auto-vivification by tablet copy).
        self.on_tablet_not_found: Callable[[str], None] | None = None
        # Told (uuid, reason) of a peer whose stream was refused with TABLET_FAILED (the
        # runtime's ``peer_failed``: its health report says FAILED_UNRECOVERABLE).
        self.on_tablet_failed: Callable[[str, str], None] | None = None
        # Told (uuid, term, last index) of an AppendEntries with entries that will not be
        # answered: its stream broke, it could not be queued, or the peer answered an error
        # (the runtime's ``append_lost``: the batch is sent again without waiting it out).
        self.on_append_lost: Callable[[str, int, int], None] | None = None
        # Hybrid time riding on AppendEntries (docs/consistency.md), which the Raft core does
        # not see: as a leader, the (clock, safe time) put on each request (told the request's
        # commit index); as a follower,
        # told (leader's term, its clock, its safe time, its commit index) of each request.
        self.timestamps: Callable[[int], tuple[int, int]] | None = None
        self.on_timestamps: Callable[[int, int, int, int], None] | None = None
        # The log's ``answer_when_durable`` (set by a replica on a WAL): answers to requests
        # served with an ``AnswerHandoff`` then go from the committer that makes them durable.
        self.answer_when_durable: AnswerWhenDurable | None = None
        # The log's ``set_quiet_durability`` (set with it): a follower whose answers all go
        # from the committer keeps its log quiet, and is not woken by every sync for nothing.
        self.quiet_durability: Callable[[bool], None] | None = None
        # The native log (set with ``answer_when_durable``) and the runtime's
        # ``follow_leader`` (set by the runtime): with both, ``follow_append`` appends a
        # leader's entries without handing the request to the core.
        self.native_log: _native.ReplicatedLog | None = None
        self.follow_leader: FollowLeader | None = None
        # Answers ``follow_append`` handed to the log, oldest first, until written or taken
        # back (``_check_handed``): (deadline, handle, call id, last index, late reply).
        self._handed: deque[_Handed] = deque()
        self._handed_timer: asyncio.TimerHandle | None = None
        self.appends_followed = 0  # requests ``follow_append`` appended (tests, benches)
        self._syncs_unwatched = False  # as the runtime last said (``syncs_unwatched``)
        self._watching = 0  # answers waiting for the watch, which the core's acks move
        self._quiet = False

    # --- quiet durability --------------------------------------------------------------------

    def syncs_unwatched(self, unwatched: bool) -> None:
        """The runtime says (after every pass) whether its core can do without hearing of
        each sync of the log: a follower (its answers say what is durable), or a leader whose
        commit index does not wait for its own log (``RaftCore.awaits_own_durability``)."""
        if unwatched is not self._syncs_unwatched:
            self._syncs_unwatched = unwatched
            self._update_quiet()

    def _watch_wanted(self, delta: int) -> None:
        """An answer starts (+1) or stops (-1) waiting for the watch: while any does, the
        log signals its syncs, so that the core learns of them and its acks move the watch."""
        self._watching += delta
        self._update_quiet()

    def _update_quiet(self) -> None:
        # A candidate, or a leader whose commit waits for its own log, acts on its syncs; an
        # answer waiting for the watch needs the core to hear of them. Without a log that
        # writes answers there is nothing to gain.
        quiet = (
            self._syncs_unwatched
            and not self._watching
            and self.answer_when_durable is not None
            and self.quiet_durability is not None
        )
        if quiet is not self._quiet:
            self._quiet = quiet
            if self.quiet_durability is not None:
                self.quiet_durability(quiet)

    # --- a leader's entries appended here ----------------------------------------------------

    def follow_append(
        self, parsed: _native.ParsedAppend, sink: _native.AnswerSink, call_id: int, late: LateAnswer
    ) -> bool:
        """Appends a received AppendEntries (``_native.parse_append_request``: entries, no
        config change, a header that agrees with them) and hands its answer to the log to
        write to ``sink`` once durable, if the runtime says this replica follows its sender
        in its term and its core has nothing else to take first (``RaftRuntime
        .follow_leader``), and the log's last entry is the one before them. Returns whether
        it did; if not, nothing was done and the request goes the usual way
        (``submit_update``). An answer the log has not written within ``reply_timeout_ms``
        is taken back and given to ``late`` with what is durable then, as
        ``_UpdateAnswer`` does."""
        follow, log = self.follow_leader, self.native_log
        if (
            follow is None
            or log is None
            or self.answer_when_durable is None
            or parsed.dest_uuid != self.uuid
        ):
            return False
        term = parsed.caller_term
        handed: list[_native.DurableAnswer] = []

        def append() -> OpId | None:
            answer = parsed.append(log, sink, call_id, self.uuid, term)
            if answer is None:
                return None
            handed.append(answer)
            # The leader's clock and safe time, before the core commits and applies (as
            # ``submit_update`` gives them before the core steps the request).
            if self.on_timestamps is not None and parsed.leader_timestamp:
                self.on_timestamps(
                    term, parsed.leader_timestamp, parsed.safe_timestamp, parsed.committed_index
                )
            return OpId(*parsed.last)

        if not follow(term, parsed.caller_uuid, append, parsed.committed_index):
            return False
        self.appends_followed += 1  # appended: ``append`` handed the answer over
        deadline = time.monotonic() + self._opts.reply_timeout_ms / 1000
        self._handed.append(_Handed(deadline, handed[0], call_id, OpId(*parsed.last), term, late))
        if self._handed_timer is None:
            self._arm_handed()
        return True

    def _arm_handed(self) -> None:
        # Soon, not at the oldest deadline: the answers written meanwhile are forgotten in
        # a pass every ``_HANDED_CHECK_S``, which keeps the queue to that much traffic.
        wait_s = min(self._handed[0].deadline - time.monotonic(), _HANDED_CHECK_S)
        self._handed_timer = asyncio.get_running_loop().call_later(
            max(0.0, wait_s), self._check_handed
        )

    def _check_handed(self) -> None:
        """Forgets the handed answers the log wrote; takes back those it has not written by
        their deadline and answers them from the event loop with what is durable (a sync
        that hangs still gets the leader an answer, as ``_UpdateAnswer`` does)."""
        self._handed_timer = None
        now = time.monotonic()
        handed = self._handed
        while handed and (handed[0].answer.sent() or handed[0].deadline <= now):
            one = handed.popleft()
            if one.answer.sent() or not one.answer.cancel():
                continue  # the log wrote it
            log = self.native_log
            durable = 0 if log is None else min(log.durable_index(), one.last.index)
            response = AppendResponse(self.uuid, "", one.term, AppendStatus.OK, one.last, durable)
            one.late(one.call_id, wire.append_response_to_pb(response))
        if handed:
            self._arm_handed()

    # --- Transport ------------------------------------------------------------------------

    async def run(self, deliver: Deliver) -> None:
        """Serves until cancelled; closes every channel on the way out."""
        self._deliver = deliver
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                if self._shared_streams is None:
                    self._streams = PeerStreams(self.uuid, settings=self._settings)
                    group.create_task(self._streams.run(), name=f"streams-{self.tablet_id}")
                await asyncio.get_running_loop().create_future()  # until cancelled
        finally:
            self._group = None
            self._deliver = None
            self._streams = self._shared_streams
            if self._handed_timer is not None:
                self._handed_timer.cancel()
                self._handed_timer = None
            self._handed.clear()  # the log writes them if it makes them durable
            proxies, self._proxies = self._proxies, {}
            for proxy in proxies.values():
                await proxy.close()

    def send(self, message: Message) -> None:
        """Routes ``message``: requests go out, answers go to the handler awaiting them."""
        group = self._group
        if group is None:
            self.messages_dropped += 1
            return
        match message:
            case AppendRequest():
                self._push(message)
            case VoteRequest():
                self._request_vote(message)
            case TimeoutNow():
                group.create_task(self._run_leader_election(message))
            case AppendResponse() | VoteResponse():
                self._answer(message)

    # --- client half ------------------------------------------------------------------------

    def _push(self, request: AppendRequest) -> None:
        address = self._addresses(request.dest)
        streams = self._streams
        if address is None or streams is None:
            self.messages_dropped += 1
            return
        stamps = (0, 0) if self.timestamps is None else self.timestamps(request.committed_index)
        data = wire.append_request_parts(request, self.tablet_id, timestamps=stamps)
        # What the answer needs of the request, not the request: its entries are not kept
        # alive until the answer comes.
        last = None if request.entries is None else request.entries.last_op_id.index
        answered = functools.partial(
            self._on_append_answer, request.dest, request.seq, request.term, last
        )
        streams.send(request.dest, address, data, answered)

    def _on_append_answer(
        self,
        peer_uuid: str,
        seq: int,
        term: int,
        last_index: int | None,
        answer: consensus_pb2.ConsensusResponsePB | BaseException,
    ) -> None:
        """The peer's answer to one AppendEntries (or why there is none: it is lost; one that
        carried entries up to ``last_index`` is then reported to ``on_append_lost``)."""
        if isinstance(answer, BaseException):
            self.messages_dropped += 1
            self._lost(peer_uuid, term, last_index)
            return
        if answer.HasField("error"):
            code = answer.error.code
            if code == common_pb2.TABLET_NOT_FOUND and self.on_tablet_not_found is not None:
                self.on_tablet_not_found(peer_uuid)
            if code == common_pb2.TABLET_FAILED and self.on_tablet_failed is not None:
                self.on_tablet_failed(peer_uuid, answer.error.message)
            self.messages_dropped += 1
            self._lost(peer_uuid, term, last_index)
            return
        self._inbound(wire.append_response_from_pb(answer, dest=self.uuid, seq=seq))

    def _lost(self, peer_uuid: str, term: int, last_index: int | None) -> None:
        if last_index is not None and self.on_append_lost is not None:
            self.on_append_lost(peer_uuid, term, last_index)

    def _proxy(self, address: str, peer_uuid: str) -> ServerProxy:
        if self._shared_streams is not None:
            return self._shared_streams.proxy(address, peer_uuid)  # the server's channel
        proxy = self._proxies.get((address, peer_uuid))
        if proxy is None:
            proxy = ServerProxy(address, self._settings, server_uuid=peer_uuid)
            self._proxies[(address, peer_uuid)] = proxy
        return proxy

    def _request_vote(self, request: VoteRequest) -> None:
        """Sends a vote request on the server's stream to the voter's server (with every
        other tablet's votes and AppendEntries to it); its answer, or nothing if it is lost,
        comes back to the core."""
        address = self._addresses(request.dest)
        streams = self._streams
        if address is None or streams is None:
            self.messages_dropped += 1
            return

        def answered(answer: consensus_pb2.VoteResponsePB | BaseException) -> None:
            if isinstance(answer, BaseException):  # lost with its stream
                self._vote_lost(request, answer)
                return
            try:
                raise_for_response(answer)  # refused
                response = wire.vote_response_from_pb(answer, request)  # or unreadable
            except NyalaError as e:
                self._vote_lost(request, e)
                return
            self._inbound(response)

        pb = wire.vote_request_to_pb(request, self.tablet_id)
        streams.send_vote(request.dest, address, pb, answered)

    def _vote_lost(self, request: VoteRequest, why: BaseException) -> None:
        log.debug("vote request to %s failed: %r", request.dest, why)
        self.messages_dropped += 1

    async def _run_leader_election(self, message: TimeoutNow) -> None:
        address = self._addresses(message.dest)
        if address is None:
            self.messages_dropped += 1
            return
        proxy = self._proxy(address, message.dest)
        try:
            await proxy.call(
                proxy.consensus.RunLeaderElection,
                wire.timeout_now_to_pb(message, self.tablet_id),
                timeout_ms=self._opts.election_nudge_timeout_ms,
            )
        except NyalaError as e:
            log.debug("leadership transfer nudge to %s failed: %r", message.dest, e)
            self.messages_dropped += 1

    def _inbound(self, message: Message) -> None:
        if self._deliver is not None:
            self._deliver(message)

    # --- server half ------------------------------------------------------------------------

    async def handle_update(
        self, pb: wire.ReceivedRequest, decode_batch: wire.BatchDecoder
    ) -> consensus_pb2.ConsensusResponsePB:
        """Steps an UpdateConsensus request and returns the ``ConsensusResponsePB``, sent once
        the entries it appended are durable (or ``reply_timeout_ms`` passed)."""
        return await self.settle_update(self.submit_update(pb, decode_batch))

    def submit_update(
        self, pb: wire.ReceivedRequest, decode_batch: wire.BatchDecoder
    ) -> _PendingAppend:
        """Hands an AppendEntries to the core now (requests of one stream reach it in their
        order); ``settle_update`` gives its answer."""
        request = wire.append_request_from_pb(pb, decode_batch)
        if self.on_timestamps is not None:
            header = wire.request_header(pb)
            if header.leader_timestamp:
                self.on_timestamps(
                    header.caller_term,
                    header.leader_timestamp,
                    header.safe_timestamp,
                    header.committed_index,
                )
        return self._submit(request)

    async def settle_update(self, pending: _PendingAppend) -> consensus_pb2.ConsensusResponsePB:
        """The ``ConsensusResponsePB`` of a submitted AppendEntries, once what it appended is
        durable (or ``reply_timeout_ms`` passed)."""
        future: asyncio.Future[consensus_pb2.ConsensusResponsePB | NyalaError] = (
            asyncio.get_running_loop().create_future()
        )

        def reply(answer: consensus_pb2.ConsensusResponsePB | NyalaError) -> None:
            if not future.done():
                future.set_result(answer)

        self.answer_update(pending, reply)
        answer = await future
        if isinstance(answer, NyalaError):
            raise answer
        return answer

    def answer_update(
        self, pending: _PendingAppend, reply: UpdateReply, handoff: AnswerHandoff | None = None
    ) -> None:
        """Calls ``reply`` with the ``ConsensusResponsePB`` of a submitted AppendEntries once
        what it appended is durable (or ``reply_timeout_ms`` passed: then with what is
        durable), or with the error that kept the core from answering. Callbacks and timer
        handles only, no task: a server with thousands of replicas receives thousands of
        AppendEntries a second, and a task per request was a third of its event loop."""
        _UpdateAnswer(self, pending, reply, handoff)

    async def handle_vote(self, pb: consensus_pb2.VoteRequestPB) -> consensus_pb2.VoteResponsePB:
        """Steps a RequestVote and returns the ``VoteResponsePB``."""
        request = wire.vote_request_from_pb(pb)
        deliver = self._require_deliver()
        future = self._expect_vote(request.src)
        deliver(request)
        answer = await self._await_answer(future, request)
        assert isinstance(answer, VoteResponse)
        return wire.vote_response_to_pb(answer)

    def _require_deliver(self) -> Deliver:
        deliver = self._deliver
        if deliver is None:
            raise ServiceUnavailableError(f"replica {self.uuid} is not running")
        return deliver

    def _submit(self, request: AppendRequest) -> _PendingAppend:
        """Delivers an AppendEntries to the core, stamped so that its answer is told apart
        from the core's unsolicited durability acks (which carry ``seq`` 0)."""
        deliver = self._require_deliver()
        stamp = next(self._stamps)
        request = request.with_seq(stamp)
        future: asyncio.Future[AppendResponse] = asyncio.get_running_loop().create_future()
        self._append_waiters[stamp] = future
        deliver(request)
        return _PendingAppend(request, future)

    async def _await_answer(self, future: asyncio.Future[_T], request: Message) -> _T:
        try:
            async with asyncio.timeout(self._opts.reply_timeout_ms / 1000):
                return await future
        except TimeoutError:
            raise ServiceUnavailableError(
                f"replica {self.uuid} did not answer {type(request).__name__} in time"
            ) from None

    def _expect_vote(self, asker: str) -> asyncio.Future[Message]:
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault((VoteResponse, asker), deque()).append(future)
        return future

    def _durable_watch(self, leader: str) -> _DurableWatch:
        watch = self._durable.get(leader)
        if watch is None:
            watch = self._durable[leader] = _DurableWatch()
        return watch

    def _answer(self, message: AppendResponse | VoteResponse) -> None:
        if isinstance(message, AppendResponse):
            self._answer_append(message)
            return
        waiters = self._waiters.get((VoteResponse, message.dest))
        while waiters:
            future = waiters.popleft()
            if not future.done():
                future.set_result(message)
                return
        self.messages_dropped += 1  # nobody asks (its handler timed out)

    def _answer_append(self, message: AppendResponse) -> None:
        # Every answer reflects the follower's log when the core produced it, and the core
        # produces them in order: the latest one says what is durable now (it can go down
        # after a truncation, which is why this is not a maximum).
        if message.status is AppendStatus.OK:
            self._durable_watch(message.dest).moved(message.durable_index)
        if message.seq == 0:
            return  # an unsolicited durability ack: it only moves the watch
        future = self._append_waiters.pop(message.seq, None)
        if future is None or future.done():
            self.messages_dropped += 1  # its handler timed out
            return
        future.set_result(message)
