"""A follower's native receive: a leader's AppendEntries appended and answered without the
request becoming Python objects (``_native.parse_append_request``, ``ParsedAppend.append``,
``GrpcTransport.follow_append``, ``RaftRuntime.follow_leader``).

Real WALs on disk and real sockets. The parse is checked against protobuf's reading of the
same bytes, the answer against the one the transport builds in Python, and each of the
runtime's conditions by a request it must refuse.
"""

from __future__ import annotations

import asyncio
import random
import socket
from pathlib import Path

import pytest
from socket_frames import frames_within

from nyala import _native
from nyala._proto import consensus_pb2
from nyala.common.clock import RealClock
from nyala.consensus import OpId, RaftConfig, RaftOptions, RaftPeer, bootstrap_cmeta
from nyala.consensus.messages import AppendRequest, AppendResponse, AppendStatus, Message
from nyala.consensus.runtime import RaftRuntime, RuntimeOptions, wire
from nyala.consensus.runtime.cmeta_store import FileCmetaStore
from nyala.consensus.runtime.transport import GrpcTransport, GrpcTransportOptions
from nyala.consensus.runtime.wal_log import WalEntryBatch, WalLog
from nyala.consensus.types import EntryKind, encode_config

TABLET = "t" * 32
LEADER, FOLLOWER = "a" * 32, "b" * 32


def _leader_log(root: Path, payloads: list[bytes], kind: EntryKind = EntryKind.WRITE) -> WalLog:
    log = WalLog(root / "leader", TABLET)
    log.append_many(3, kind, payloads, 1 << 20)
    return log


def _request(
    leader: WalLog, after: int = 0, *, committed: int = 0, quiesce: bool = False
) -> AppendRequest:
    batch = leader.read_batch(after, 1 << 20)
    assert batch is not None
    preceding = OpId(leader.term_at(after) or 0, after)
    return AppendRequest(LEADER, FOLLOWER, 3, preceding, batch, committed, 0, quiesce)


def _wire(request: AppendRequest, timestamps: tuple[int, int] = (0, 0)) -> bytes:
    return wire.request_bytes(wire.append_request_parts(request, TABLET, timestamps=timestamps))


def test_a_leaders_append_parses_as_protobuf_reads_it(tmp_path: Path) -> None:
    leader = _leader_log(tmp_path, [b"one", b"two", b"three"])
    try:
        request = _request(leader, 1, committed=1)
        data = _wire(request, timestamps=(2**63 + 5, 12345))
        parsed = _native.parse_append_request(data)
        assert parsed is not None
        expected = wire.append_request_from_pb(
            wire.append_request_from_wire(data), WalEntryBatch.from_wire
        )
        assert parsed.tablet_id == TABLET
        assert (parsed.dest_uuid, parsed.caller_uuid) == (expected.dest, expected.src)
        assert parsed.caller_term == expected.term == 3
        assert parsed.committed_index == expected.committed_index == 1
        assert OpId(*parsed.preceding) == expected.preceding == OpId(3, 1)
        assert expected.entries is not None
        assert OpId(*parsed.last) == expected.entries.last_op_id == OpId(3, 3)
        assert (parsed.leader_timestamp, parsed.safe_timestamp) == (2**63 + 5, 12345)
    finally:
        leader.close()


def test_what_the_native_path_does_not_take_parses_to_none(tmp_path: Path) -> None:
    """Heartbeats, quiescence, config changes, headers that disagree with their batch and
    malformed bytes all go the general way (which answers their errors)."""
    leader = _leader_log(tmp_path, [b"one", b"two"])
    config_leader = WalLog(tmp_path / "config", TABLET)
    try:
        request = _request(leader)
        good = _wire(request)
        assert _native.parse_append_request(good) is not None
        heartbeat = AppendRequest(LEADER, FOLLOWER, 3, OpId(3, 2), None, 2, 0)
        assert _native.parse_append_request(_wire(heartbeat)) is None
        assert _native.parse_append_request(_wire(_request(leader, quiesce=True))) is None
        config = RaftConfig((RaftPeer(LEADER, "a:1"), RaftPeer(FOLLOWER, "b:1")), opid_index=2)
        config_leader.append(3, EntryKind.WRITE, b"row")
        config_leader.append(3, EntryKind.CONFIG_CHANGE, encode_config(config))
        with_config = _request(config_leader)
        assert _native.parse_append_request(_wire(with_config)) is None

        def edited(**fields: object) -> bytes:
            pb = wire.append_request_to_pb(request, TABLET)
            for name, value in fields.items():
                if isinstance(value, tuple):
                    getattr(pb, name).term, getattr(pb, name).index = value
                else:
                    setattr(pb, name, value)
            return pb.SerializeToString()

        assert _native.parse_append_request(edited()) is not None
        assert _native.parse_append_request(edited(entry_count=3)) is None
        assert _native.parse_append_request(edited(first_entry_id=(3, 2))) is None
        assert _native.parse_append_request(edited(last_entry_id=(3, 1))) is None
        assert _native.parse_append_request(edited(preceding_id=(3, 1))) is None
        assert _native.parse_append_request(edited(caller_term=-1)) is None
        assert _native.parse_append_request(edited(committed_index=-5)) is None
        for cut in (1, 7, len(good) // 2, len(good) - 1):
            assert _native.parse_append_request(good[:cut]) is None
        # caller_term (4) as a length-delimited field: left to protobuf.
        assert _native.parse_append_request(good + b"\x22\x00") is None
        # leader_timestamp (15, fixed64) as a varint: likewise.
        assert _native.parse_append_request(good + b"\x78\x00") is None
        # A field this path does not read (99, a varint) is skipped.
        assert _native.parse_append_request(good + b"\x98\x06\x01") is not None
        assert _native.parse_append_request(b"") is None
        assert _native.parse_append_request(b"\xff" * 40) is None
        # Damage anywhere never raises: the request is taken whole or left to protobuf.
        rng = random.Random(28)
        for _ in range(2000):
            damaged = bytearray(good)
            for _ in range(rng.randint(1, 4)):
                damaged[rng.randrange(len(damaged))] = rng.randrange(256)
            parsed = _native.parse_append_request(bytes(damaged))
            if parsed is not None:
                assert OpId(*parsed.last).index == OpId(*parsed.preceding).index + 2
    finally:
        leader.close()
        config_leader.close()


def test_the_native_append_answers_as_the_transport_would(tmp_path: Path) -> None:
    leader = _leader_log(tmp_path, [b"one", b"two", b"three"])
    follower = WalLog(tmp_path / "follower", TABLET)
    ours, theirs = socket.socketpair()
    try:
        sink = _native.AnswerSink(ours.fileno())
        parsed = _native.parse_append_request(_wire(_request(leader)))
        assert parsed is not None
        handed = parsed.append(follower.native, sink, 7, FOLLOWER, 3)
        assert handed is not None
        assert follower.last_op_id() == OpId(3, 3)
        (frame,) = frames_within(theirs, 2.0)
        assert handed.sent()
        assert follower.durable_index() == 3
        ok = AppendResponse(FOLLOWER, LEADER, 3, AppendStatus.OK, OpId(3, 3), 0)
        python = consensus_pb2.ConsensusBatchResponsePB(
            call_ids=[7], responses=[wire.append_response_to_pb(ok, durable_index=3)]
        )
        assert consensus_pb2.ConsensusBatchResponsePB.FromString(frame) == python
        assert frame == python.SerializeToString()
        # The entries are the leader's, byte for byte.
        copy = follower.read_batch(0, 1 << 20)
        original = leader.read_batch(0, 1 << 20)
        assert copy is not None
        assert original is not None
        assert copy.to_wire() == original.to_wire()
    finally:
        leader.close()
        follower.close()
        ours.close()
        theirs.close()


def test_an_append_that_does_not_follow_the_logs_last_entry_does_nothing(tmp_path: Path) -> None:
    """A batch whose preceding entry is not the log's last (a gap, an overlap, another
    term) would need the general path's matching or truncation: nothing is appended and no
    answer is handed."""
    leader = _leader_log(tmp_path, [b"one", b"two", b"three"])
    follower = WalLog(tmp_path / "follower", TABLET)
    ours, theirs = socket.socketpair()
    try:
        sink = _native.AnswerSink(ours.fileno())
        gap = _native.parse_append_request(_wire(_request(leader, 1)))  # after entry 1
        assert gap is not None
        assert gap.append(follower.native, sink, 1, FOLLOWER, 3) is None
        assert follower.last_op_id() == OpId(0, 0)
        follower.append(2, EntryKind.NO_OP, b"")  # entry 1 of term 2: another term
        assert gap.append(follower.native, sink, 2, FOLLOWER, 3) is None
        first = _native.parse_append_request(_wire(_request(leader, 0)))
        assert first is not None
        assert first.append(follower.native, sink, 3, FOLLOWER, 3) is None  # an overlap
        assert follower.last_op_id() == OpId(2, 1)
        assert frames_within(theirs, 0.3) == []
    finally:
        leader.close()
        follower.close()
        ours.close()
        theirs.close()


def test_a_sync_slower_than_the_reply_timeout_takes_the_native_answer_back(
    tmp_path: Path,
) -> None:
    """As for an answer the transport hands over itself (test_answer_handoff): a sync that
    outlasts ``reply_timeout_ms`` gets the leader an answer from the event loop, saying
    nothing is durable yet, and the committer does not write one later."""
    leader = _leader_log(tmp_path, [b"one"])
    follower = WalLog(tmp_path / "follower", TABLET)
    ours, theirs = socket.socketpair()
    late: list[tuple[int, consensus_pb2.ConsensusResponsePB]] = []

    async def main() -> None:
        transport = GrpcTransport(
            FOLLOWER, TABLET, {}.get, options=GrpcTransportOptions(reply_timeout_ms=200)
        )
        transport.answer_when_durable = follower.answer_when_durable
        transport.native_log = follower.native

        def follow(term: int, leader_uuid: str, append: object, committed: int) -> bool:
            assert (term, leader_uuid) == (3, LEADER)
            assert callable(append)
            assert append() == OpId(3, 1)
            return True

        transport.follow_leader = follow
        stamps: list[tuple[int, int, int, int]] = []
        transport.on_timestamps = lambda *args: stamps.append(args)
        async with asyncio.TaskGroup() as group:
            runner = group.create_task(transport.run(lambda _: None))
            await asyncio.sleep(0)
            sink = _native.AnswerSink(ours.fileno())
            elsewhere = AppendRequest(
                LEADER, "c" * 32, 3, OpId(0, 0), _request(leader).entries, 0, 0
            )
            misrouted = _native.parse_append_request(_wire(elsewhere))
            assert misrouted is not None
            assert not transport.follow_append(misrouted, sink, 8, lambda *a: late.append(a))
            parsed = _native.parse_append_request(_wire(_request(leader), timestamps=(77, 66)))
            assert parsed is not None
            follower.native._inject_sync_delays(1, 1.0)
            assert transport.follow_append(parsed, sink, 9, lambda *a: late.append(a))
            assert transport.appends_followed == 1
            assert stamps == [(3, 77, 66, 0)]  # the leader's clock and safe time, once
            await asyncio.sleep(0.6)
            runner.cancel()

    try:
        asyncio.run(main())
        assert frames_within(theirs, 1.2) == []  # taken back: the committer writes nothing
        ((call_id, answer),) = late
        assert call_id == 9
        response = wire.append_response_from_pb(answer, dest=LEADER, seq=0)
        assert response.status is AppendStatus.OK
        assert response.last_received == OpId(3, 1)
        assert response.durable_index == 0
    finally:
        leader.close()
        follower.close()
        ours.close()
        theirs.close()


@pytest.fixture
def runtime_and_log(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A follower runtime ("b" of a, b, c) on a WAL, with a transport that delivers nothing
    (the test hands it messages itself)."""

    class Silent:
        async def run(self, deliver: object) -> None:
            await asyncio.get_running_loop().create_future()

        def send(self, message: Message) -> None:
            pass

    store = FileCmetaStore(tmp_path / "cmeta")
    peers = tuple(RaftPeer(u, f"{u}:1") for u in (LEADER, FOLLOWER, "c" * 32))
    bootstrap_cmeta(store, RaftConfig(peers))
    log = WalLog(tmp_path / "wal", FOLLOWER)
    runtime = RaftRuntime(
        FOLLOWER,
        log,
        store,
        Silent(),
        RealClock(),
        notifier=log,
        raft_options=RaftOptions(heartbeat_interval_ms=1000),
        options=RuntimeOptions(timer_slack_ms=5),
    )
    yield runtime, log
    log.close()


def test_the_runtime_appends_only_for_the_leader_it_follows_with_nothing_queued(
    runtime_and_log: tuple[RaftRuntime, WalLog],
) -> None:
    runtime, _log = runtime_and_log
    calls: list[int] = []

    def append() -> OpId:
        calls.append(1)
        return OpId(2, 0)

    async def main() -> None:
        async with asyncio.TaskGroup() as group:
            runtime.start(group)
            await asyncio.sleep(0.01)
            # Term 2 learned from leader a's heartbeat: the term goes to disk first.
            runtime.deliver(AppendRequest(LEADER, FOLLOWER, 2, OpId(0, 0), None, 0, 0))
            runtime._pump()
            assert runtime.core.follows(2, LEADER)
            assert runtime._writing is not None  # the new term is being written
            assert not runtime.follow_leader(2, LEADER, append, 0)  # effects are held
            for _ in range(200):
                await asyncio.sleep(0.005)
                if runtime._writing is None:
                    break
            assert runtime._writing is None
            assert not runtime._held
            assert not runtime.follow_leader(1, LEADER, append, 0)  # an older term
            assert not runtime.follow_leader(3, LEADER, append, 0)  # a newer one
            assert not runtime.follow_leader(2, "c" * 32, append, 0)  # not its leader
            runtime.deliver(AppendRequest(LEADER, FOLLOWER, 2, OpId(0, 0), None, 0, 0))
            assert not runtime.follow_leader(2, LEADER, append, 0)  # one is queued
            assert calls == []
            await asyncio.sleep(0.01)
            assert runtime.follow_leader(2, LEADER, append, 0)
            assert calls == [1]
            runtime.stop()

    asyncio.run(main())
