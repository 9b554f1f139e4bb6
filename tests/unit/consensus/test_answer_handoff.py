"""A follower's answer written by the WAL committer whose sync makes its entries durable.

``ReplicatedLog.answer_when_durable`` hands a frame to the log, which writes it to an
``AnswerSink`` (the follower's side of a plain peer channel connection) once everything
appended before is durable. ``GrpcTransport`` hands an AppendEntries' answer over that way
when the request came with an ``AnswerHandoff``, and takes it back if the sync outlasts the
reply timeout. Real WALs on disk, real sockets; the syncs are slowed or failed by the WAL's
fault injection, and the test plays the Raft core (as ``test_transport_answers`` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
from pathlib import Path

from socket_frames import frames_within

from nyala import _native
from nyala._proto import consensus_pb2
from nyala.common.clock import RealClock
from nyala.consensus import OpId, RaftConfig, RaftOptions, RaftPeer, Role, bootstrap_cmeta
from nyala.consensus.messages import (
    AppendRequest,
    AppendResponse,
    AppendStatus,
    Message,
    VoteResponse,
)
from nyala.consensus.runtime import RaftRuntime, RuntimeOptions, wire
from nyala.consensus.runtime.cmeta_store import FileCmetaStore
from nyala.consensus.runtime.peer_streams import _ServedStream
from nyala.consensus.runtime.transport import GrpcTransport, GrpcTransportOptions, _UpdateAnswer
from nyala.consensus.runtime.wal_log import WalLog
from nyala.consensus.types import EntryKind
from nyala.errors import DiskError
from nyala.testing.garbage import collector_off

TABLET = "t" * 32
REPLY_TIMEOUT_MS = 300


def _appended(log: WalLog, delay_s: float) -> None:
    """One entry appended while the next sync sleeps ``delay_s``."""
    log.native._inject_sync_delays(1, delay_s)
    log.append(1, EntryKind.NO_OP, b"")


def test_the_log_writes_a_handed_answer_once_its_sync_returned(tmp_path: Path) -> None:
    ours, theirs = socket.socketpair()
    log = WalLog(tmp_path, TABLET)
    try:
        sink = _native.AnswerSink(ours.fileno())
        now = log.answer_when_durable(sink, b"nothing pending")
        assert now.sent()  # nothing was waiting: written at once
        assert frames_within(theirs, 0.1) == [b"nothing pending"]

        _appended(log, 0.6)
        handed = log.answer_when_durable(sink, b"answer")
        assert frames_within(theirs, 0.3) == []  # the sync has not returned
        assert not handed.sent()
        assert frames_within(theirs, 5.0 - 0.3) == [b"answer"]
        assert handed.sent()
        assert not handed.cancel()  # too late to take back
        assert log.durable_index() == 1
    finally:
        log.close()
        ours.close()
        theirs.close()


def test_a_failed_sync_never_writes_the_answer(tmp_path: Path) -> None:
    ours, theirs = socket.socketpair()
    log = WalLog(tmp_path, TABLET)
    try:
        sink = _native.AnswerSink(ours.fileno())
        log.native._inject_sync_delays(1, 0.3)
        log.native._inject_sync_failures(1, errno.EIO)
        log.append(1, EntryKind.NO_OP, b"")
        handed = log.answer_when_durable(sink, b"answer")
        assert frames_within(theirs, 1.0) == []
        assert log.failure() is not None
        assert not handed.sent()
        assert handed.cancel()  # the loop answers instead, with what is durable
    finally:
        ours.close()
        theirs.close()


def _ok(request: AppendRequest, last: int) -> AppendResponse:
    """The core's OK answer to ``request``, its entries not yet durable."""
    return AppendResponse("b", "a", 1, AppendStatus.OK, OpId(1, last), 0, seq=request.seq)


def _scenario(tmp_path: Path, sync_delay_s: float) -> tuple[list[bytes], _ServedStream]:
    """Replica "b" receives an AppendEntries on a stream with a sink; the test's core appends
    its entry (the sync slowed by ``sync_delay_s``) and answers OK. Returns the frames on the
    connection within ``REPLY_TIMEOUT_MS`` plus a second, and the stream."""
    ours, theirs = socket.socketpair()
    log = WalLog(tmp_path, TABLET)

    async def main() -> _ServedStream:
        transport = GrpcTransport(
            "b", TABLET, {}.get, options=GrpcTransportOptions(reply_timeout_ms=REPLY_TIMEOUT_MS)
        )
        transport.answer_when_durable = log.answer_when_durable
        delivered: list[Message] = []
        async with asyncio.TaskGroup() as group:
            runner = group.create_task(transport.run(delivered.append))
            await asyncio.sleep(0)
            sink = _native.AnswerSink(ours.fileno())
            stream = _ServedStream(lambda _: transport, None, None, group, 8, sink)  # type: ignore[arg-type]
            heartbeat = AppendRequest("a", "b", 1, OpId(1, 0), None, 0, 0)
            stream._submit(7, wire.append_request_to_pb(heartbeat, TABLET).SerializeToString())
            (request,) = delivered
            assert isinstance(request, AppendRequest)
            _appended(log, sync_delay_s)
            transport.send(_ok(request, last=1))
            for _ in range(3):
                await asyncio.sleep(0)
            assert stream.unanswered == 0  # handed over (or answered)
            await asyncio.sleep(REPLY_TIMEOUT_MS / 1000 + 0.2)
            runner.cancel()
        return stream

    try:
        stream = asyncio.run(main())
        return frames_within(theirs, 1.0), stream
    finally:
        log.close()
        ours.close()
        theirs.close()


def test_a_followers_answer_goes_from_the_committer(tmp_path: Path) -> None:
    frames, stream = _scenario(tmp_path, sync_delay_s=0.05)
    (frame,) = frames
    batch = consensus_pb2.ConsensusBatchResponsePB.FromString(frame)
    assert list(batch.call_ids) == [7]
    answer = wire.append_response_from_pb(batch.responses[0], dest="a", seq=0)
    assert answer.status is AppendStatus.OK
    assert answer.durable_index == 1  # durable when it went
    assert not stream.ready  # nothing left for the event loop to send


def test_a_handed_answer_leaves_no_cycle_once_its_timer_fired(tmp_path: Path) -> None:
    """The reply timer of an answer the log wrote fires later and finds nothing to do; the
    fired handle keeps its callback, so it must not stay referenced by the answer it calls
    (a cycle per AppendEntries, kept until a full collection: servers run those rarely)."""
    with collector_off() as left:
        frames, _ = _scenario(tmp_path, sync_delay_s=0.05)
        assert len(frames) == 1  # written by the committer; then the timer fired
        assert left(_UpdateAnswer) == []


def test_a_sync_slower_than_the_reply_timeout_takes_the_answer_back(tmp_path: Path) -> None:
    frames, stream = _scenario(tmp_path, sync_delay_s=REPLY_TIMEOUT_MS / 1000 + 0.5)
    assert frames == []  # the committer did not write it once the sync returned
    ((call_id, answer),) = stream.ready  # the event loop's answer, as before
    assert call_id == 7
    assert wire.append_response_from_pb(answer, dest="a", seq=0).durable_index == 0


def test_a_quiet_log_does_not_signal_its_syncs_and_signals_once_turned_loud(
    tmp_path: Path,
) -> None:
    log = WalLog(tmp_path, TABLET)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        signals: list[int] = []

        def signalled() -> None:
            log.drain_notifications()
            signals.append(log.durable_index())

        stop = log.watch_durability(loop, signalled)
        try:
            await asyncio.sleep(0.05)
            signals.clear()  # the call made when watching starts
            log.set_quiet_durability(True)
            for _ in range(3):
                log.append(1, EntryKind.NO_OP, b"")
                await asyncio.to_thread(log.wait_durable, 5.0)
            await asyncio.sleep(0.1)
            assert signals == []  # three syncs, no wake-up
            assert log.durable_index() == 3
            log.set_quiet_durability(False)  # catches up once
            await asyncio.sleep(0.1)
            assert signals == [3]
            log.append(1, EntryKind.NO_OP, b"")
            await asyncio.to_thread(log.wait_durable, 5.0)
            await asyncio.sleep(0.1)
            assert signals[-1] == 4  # loud again: every sync signals
            told = len(signals)
            log.set_quiet_durability(True)
            log.set_quiet_durability(False)  # nothing went untold meanwhile: no signal
            await asyncio.sleep(0.1)
            assert len(signals) == told
            log.set_quiet_durability(True)
            before = len(signals)
            log.native._inject_sync_failures(1, errno.EIO)
            log.append(1, EntryKind.NO_OP, b"")
            await asyncio.sleep(0.3)
            assert log.failure() is not None
            assert len(signals) > before  # a failure signals even while quiet
        finally:
            stop()

    asyncio.run(main())
    with contextlib.suppress(DiskError):  # the log failed, as the test made it
        log.close()


def test_a_follower_keeps_its_log_quiet_unless_an_answer_waits_for_the_watch(
    tmp_path: Path,
) -> None:
    """A follower whose answers go from the committer keeps its log quiet; an answer on a
    connection without a sink waits for the core's durability ack, which needs the log's
    signal: the log is loud until that answer is done. A leader's log is never quiet."""
    log = WalLog(tmp_path, TABLET)
    said: list[bool] = []

    def quiet(value: bool) -> None:
        said.append(value)
        log.set_quiet_durability(value)

    async def main() -> None:
        transport = GrpcTransport(
            "b", TABLET, {}.get, options=GrpcTransportOptions(reply_timeout_ms=5000)
        )
        transport.answer_when_durable = log.answer_when_durable
        transport.quiet_durability = quiet
        delivered: list[Message] = []
        async with asyncio.TaskGroup() as group:
            runner = group.create_task(transport.run(delivered.append))
            await asyncio.sleep(0)
            transport.syncs_unwatched(True)
            assert said == [True]
            # No sink (a TLS connection, the gRPC stream): the answer waits for the watch.
            stream = _ServedStream(lambda _: transport, None, None, group, 8, None)  # type: ignore[arg-type]
            heartbeat = AppendRequest("a", "b", 1, OpId(1, 0), None, 0, 0)
            stream._submit(7, wire.append_request_to_pb(heartbeat, TABLET).SerializeToString())
            (request,) = delivered
            assert isinstance(request, AppendRequest)
            log.append(1, EntryKind.NO_OP, b"")
            transport.send(_ok(request, last=1))
            await asyncio.sleep(0)
            assert said == [True, False]  # loud while the answer waits
            assert not stream.ready
            # The core, told of the sync, acks it: the watch moves and the answer goes.
            transport.send(AppendResponse("b", "a", 1, AppendStatus.OK, OpId(1, 1), 1))
            for _ in range(3):
                await asyncio.sleep(0)
            ((call_id, answer),) = stream.ready
            assert call_id == 7
            assert wire.append_response_from_pb(answer, dest="a", seq=0).durable_index == 1
            assert said == [True, False, True]  # nothing waits: quiet again
            transport.syncs_unwatched(False)  # a candidate, a leader waiting for its log
            assert said == [True, False, True, False]
            runner.cancel()

    try:
        asyncio.run(main())
    finally:
        log.close()


def test_a_leader_whose_follower_answered_first_hears_of_its_own_sync(tmp_path: Path) -> None:
    """A leader's log is quiet while its commit does not wait for it, loud while it does
    (``RaftCore.awaits_own_durability``): an entry a follower acknowledged before the
    leader's own sync returned commits when that sync returns, not at the next heartbeat.
    Leader "a" runs; its followers b and c are played by the test (c stays silent)."""
    log = WalLog(tmp_path / "wal", "a")
    store = FileCmetaStore(tmp_path / "cmeta")
    bootstrap_cmeta(store, RaftConfig(tuple(RaftPeer(u, f"{u}:1") for u in "abc")))
    said: list[bool] = []

    class Peers:
        """The runtime's transport: keeps what it sends, and the log quiet when told so."""

        def __init__(self) -> None:
            self.sent: list[Message] = []

        async def run(self, deliver: object) -> None:
            await asyncio.get_running_loop().create_future()

        def send(self, message: Message) -> None:
            self.sent.append(message)

        def syncs_unwatched(self, unwatched: bool) -> None:
            if not said or said[-1] is not unwatched:
                said.append(unwatched)
                log.set_quiet_durability(unwatched)

    peers = Peers()
    runtime = RaftRuntime(
        "a",
        log,
        store,
        peers,
        RealClock(),
        notifier=log,
        # No heartbeat (so no timer pass) within the test: only the log's signal commits.
        raft_options=RaftOptions(heartbeat_interval_ms=20_000),
        options=RuntimeOptions(timer_slack_ms=5),
    )

    def answer_appends() -> None:
        """b acknowledges, durable, everything sent to it so far."""
        for message in list(peers.sent):
            if isinstance(message, AppendRequest) and message.dest == "b":
                last = message.entries.last_op_id if message.entries else message.preceding
                runtime.deliver(
                    AppendResponse(
                        "b", "a", message.term, AppendStatus.OK, last, last.index, seq=message.seq
                    )
                )
        peers.sent.clear()

    async def main() -> None:
        async with asyncio.TaskGroup() as group:
            runtime.start(group)
            await asyncio.sleep(0.01)
            runtime.campaign()
            for pre in (True, False):
                await asyncio.sleep(0.05)
                term = runtime.core.term + (1 if pre else 0)
                runtime.deliver(VoteResponse("b", "a", term, True, pre))
            await asyncio.sleep(0.05)
            assert runtime.role is Role.LEADER
            await asyncio.to_thread(log.wait_durable, 5.0)
            answer_appends()  # the no-op
            await asyncio.sleep(0.05)
            assert runtime.core.commit_index == 1
            assert said[-1] is True  # nothing waits for the leader's log: quiet
            log.native._inject_sync_delays(1, 0.3)
            proposal = asyncio.ensure_future(runtime.propose(b"row"))
            await asyncio.sleep(0.05)
            answer_appends()  # b's answer comes while the leader's sync sleeps
            await asyncio.sleep(0.05)
            assert not proposal.done()
            assert said[-1] is False  # the commit waits for the leader's own log: loud
            async with asyncio.timeout(2.0):
                assert (await proposal).index == 2
            runtime.stop()

    try:
        asyncio.run(main())
    finally:
        log.close()
