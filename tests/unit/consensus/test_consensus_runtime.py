"""``RaftRuntime``: three replicas on one event loop over an in-memory network, with real
WAL-backed logs (and the in-memory log, which must behave the same to the runtime).

Timers are short (heartbeat 30 ms) so elections happen in tens of milliseconds; every wait
has a deadline, and a test fails rather than hangs when the cluster does not converge.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nyala._proto import consensus_pb2, consensus_pb2_grpc
from nyala.common.clock import RealClock
from nyala.consensus import (
    MemoryLog,
    OpId,
    RaftConfig,
    RaftOptions,
    RaftPeer,
    Role,
    bootstrap_cmeta,
)
from nyala.consensus.messages import AppendRequest, Message, VoteRequest, VoteResponse
from nyala.consensus.runtime import DurabilityNotifier, RaftRuntime, RuntimeOptions
from nyala.consensus.runtime.cmeta_store import FileCmetaStore
from nyala.consensus.runtime.peer_channel import PeerChannelServer
from nyala.consensus.runtime.peer_streams import PeerStreams
from nyala.consensus.runtime.transport import GrpcTransport, InMemoryNetwork
from nyala.errors import AbortedError, NotLeaderError
from nyala.rpc import RpcServer, RpcSettings

UUIDS = ("a", "b", "c")
RAFT_OPTIONS = RaftOptions(heartbeat_interval_ms=30, missed_heartbeats_before_election=3)
RUNTIME_OPTIONS = RuntimeOptions(timer_slack_ms=5)
# For a test that must not see an election from a scheduling hiccup of a loaded machine.
SLOW_RAFT_OPTIONS = RaftOptions(heartbeat_interval_ms=100, missed_heartbeats_before_election=3)
WAIT_S = 10.0

LogFactory = Callable[[Path, str], tuple[Any, DurabilityNotifier | None]]


def memory_log(_directory: Path, _uuid: str) -> tuple[Any, DurabilityNotifier | None]:
    return MemoryLog(sync_on_append=True), None


def wal_log(directory: Path, uuid: str) -> tuple[Any, DurabilityNotifier | None]:
    wal_log_module = pytest.importorskip("nyala.consensus.runtime.wal_log")
    log = wal_log_module.WalLog(directory / "wal", uuid)
    return log, log


async def eventually(predicate: Callable[[], bool]) -> None:
    """Polls ``predicate`` until it holds; fails the test after ``WAIT_S``."""
    async with asyncio.timeout(WAIT_S):
        while True:
            if predicate():
                return
            await asyncio.sleep(0.002)


@dataclass
class Replica:
    uuid: str
    runtime: RaftRuntime
    log: Any
    applied: list[tuple[int, int]]  # Apply ranges, in order


class Cluster:
    def __init__(self, root: Path, make_log: LogFactory) -> None:
        self.network = InMemoryNetwork()
        self.replicas: dict[str, Replica] = {}
        config = RaftConfig(tuple(RaftPeer(u, f"{u}:7050") for u in UUIDS))
        for uuid in UUIDS:
            directory = root / uuid
            directory.mkdir()
            store = FileCmetaStore(directory / "cmeta")
            bootstrap_cmeta(store, config)
            log, notifier = make_log(directory, uuid)
            applied: list[tuple[int, int]] = []
            runtime = RaftRuntime(
                uuid,
                log,
                store,
                self.network.transport(uuid),
                RealClock(),
                notifier=notifier,
                raft_options=RAFT_OPTIONS,
                options=RUNTIME_OPTIONS,
                rng=random.Random(uuid),
                on_apply=lambda a, out=applied: out.append((a.first_index, a.last_index)),
            )
            self.replicas[uuid] = Replica(uuid, runtime, log, applied)

    def start(self, group: asyncio.TaskGroup) -> None:
        for replica in self.replicas.values():
            replica.runtime.start(group)

    def close(self) -> None:
        for replica in self.replicas.values():
            close = getattr(replica.log, "close", None)
            if close is not None:
                close()

    def live(self) -> list[RaftRuntime]:
        return [r.runtime for r in self.replicas.values() if r.runtime.running]

    async def leader(self, *, excluding: str | None = None, min_term: int = 0) -> RaftRuntime:
        """The one leader among live, connected replicas, once there is exactly one."""
        async with asyncio.timeout(WAIT_S):
            while True:
                leaders = [
                    r
                    for r in self.live()
                    if r.role is Role.LEADER and r.uuid != excluding and r.core.term >= min_term
                ]
                if len(leaders) == 1:
                    return leaders[0]
                await asyncio.sleep(0.005)

    async def stop(self, uuid: str) -> None:
        self.replicas[uuid].runtime.stop()
        await eventually(lambda: not self.replicas[uuid].runtime.running)


@asynccontextmanager
async def cluster_of_three(root: Path, make_log: LogFactory) -> AsyncIterator[Cluster]:
    cluster = Cluster(root, make_log)
    try:
        async with asyncio.TaskGroup() as group:
            cluster.start(group)
            yield cluster
            for replica in cluster.replicas.values():
                replica.runtime.stop()
    finally:
        cluster.close()


@pytest.fixture(params=[wal_log, memory_log], ids=["wal", "memory"])
def make_log(request: pytest.FixtureRequest) -> LogFactory:
    factory: LogFactory = request.param
    return factory


def applied_indexes(replica: Replica) -> list[int]:
    out: list[int] = []
    for first, last in replica.applied:
        out.extend(range(first, last + 1))
    return out


async def wait_applied(cluster: Cluster, uuids: tuple[str, ...], index: int) -> None:
    await eventually(
        lambda: all(cluster.replicas[u].runtime.core.last_applied >= index for u in uuids)
    )


def test_elects_a_leader_and_commits_concurrent_proposals(
    tmp_path: Path, make_log: LogFactory
) -> None:
    async def scenario() -> None:
        async with cluster_of_three(tmp_path, make_log) as cluster:
            leader = await cluster.leader()
            op_ids = await asyncio.gather(*(leader.propose(b"op-%d" % i) for i in range(50)))
            indexes = [op.index for op in op_ids]
            assert len(set(indexes)) == 50
            assert all(op.term == leader.core.term for op in op_ids)
            assert leader.core.commit_index >= max(indexes)
            await wait_applied(cluster, UUIDS, max(indexes))
            for replica in cluster.replicas.values():
                # Every replica applied 1..max exactly once, in order.
                applied = applied_indexes(replica)
                assert applied[: max(indexes)] == list(range(1, max(indexes) + 1))

    asyncio.run(scenario())


def test_survives_a_leader_crash(tmp_path: Path, make_log: LogFactory) -> None:
    async def scenario() -> None:
        async with cluster_of_three(tmp_path, make_log) as cluster:
            first = await cluster.leader()
            await first.propose(b"before")
            await cluster.stop(first.uuid)
            with pytest.raises(Exception, match="not running"):
                await first.propose(b"on a stopped replica")
            second = await cluster.leader(excluding=first.uuid, min_term=first.core.term + 1)
            op_id = await second.propose(b"after")
            assert op_id.term > 1
            others = tuple(u for u in UUIDS if u != first.uuid)
            await wait_applied(cluster, others, op_id.index)

    asyncio.run(scenario())


def test_proposal_on_a_deposed_leader_fails_with_not_leader(
    tmp_path: Path, make_log: LogFactory
) -> None:
    async def scenario() -> None:
        async with cluster_of_three(tmp_path, make_log) as cluster:
            old = await cluster.leader()
            await old.propose(b"committed")
            cluster.network.isolate(old.uuid)
            # Appended on the isolated leader, this entry can never reach a majority.
            pending = asyncio.ensure_future(old.propose(b"stranded"))
            new = await cluster.leader(excluding=old.uuid, min_term=old.core.term + 1)
            await new.propose(b"overwrites")
            assert not pending.done()
            cluster.network.heal()
            with pytest.raises((NotLeaderError, AbortedError)):
                async with asyncio.timeout(WAIT_S):
                    await pending
            await eventually(lambda: old.role is not Role.LEADER)
            with pytest.raises(NotLeaderError) as raised:
                await old.propose(b"too late")
            assert raised.value.leader_uuid in (None, new.uuid)

    asyncio.run(scenario())


def test_read_waits_for_leadership_confirmation(tmp_path: Path, make_log: LogFactory) -> None:
    async def scenario() -> None:
        async with cluster_of_three(tmp_path, make_log) as cluster:
            leader = await cluster.leader()
            op_id = await leader.propose(b"x")
            index = await asyncio.wait_for(leader.read_index(), WAIT_S)
            assert index >= op_id.index
            cluster.network.isolate(leader.uuid)
            read = asyncio.ensure_future(leader.read_index())
            # Without a majority answering a heartbeat round, the read must not be served,
            # however long it waits (several election timeouts here).
            await asyncio.sleep(RAFT_OPTIONS.election_timeout_base_ms * 4 / 1000)
            assert not read.done()
            await cluster.leader(excluding=leader.uuid, min_term=leader.core.term + 1)
            cluster.network.heal()
            with pytest.raises(NotLeaderError):
                await asyncio.wait_for(read, WAIT_S)

    asyncio.run(scenario())


class ConsensusServicer(consensus_pb2_grpc.ConsensusServiceServicer):  # type: ignore[misc]
    """The minimum of a tablet server's ConsensusService, for one replica: enough to run the
    gRPC transport end to end (the real handlers live in the tablet server)."""

    def __init__(self, transport: GrpcTransport, streams: PeerStreams, decode_batch: Any) -> None:
        self.transport = transport
        self.streams = streams
        self.decode_batch = decode_batch
        self.runtime: RaftRuntime | None = None
        self.channel: PeerChannelServer | None = None  # the peer channel, when served

    def serve_batches(self, batches: AsyncIterator[Any], sink: Any = None) -> AsyncIterator[Any]:
        return self.streams.serve(
            batches,
            lambda _tablet: self.transport,
            self.decode_batch,
            self.transport.handle_vote,
            sink,
        )

    async def GetPeerChannel(self, _request: Any, _context: Any) -> Any:
        port = 0 if self.channel is None else self.channel.port
        return consensus_pb2.PeerChannelResponsePB(port=port)

    async def ConsensusPeerStream(
        self, requests: AsyncIterator[Any], _context: Any
    ) -> AsyncIterator[Any]:
        async for answers in self.serve_batches(requests):
            yield answers

    async def RunLeaderElection(self, _request: Any, _context: Any) -> Any:
        assert self.runtime is not None
        self.runtime.run_leader_election()
        return consensus_pb2.RunLeaderElectionResponsePB()


@pytest.mark.parametrize("channel", [False, True], ids=["grpc-stream", "peer-channel"])
def test_replicates_over_grpc_streams(tmp_path: Path, channel: bool) -> None:
    """Three replicas behind real RPC servers: elections, replication, reads and a transfer,
    the batches on the gRPC streams or on the peer channels (``peer_channel``)."""
    wal_log_module = pytest.importorskip("nyala.consensus.runtime.wal_log")

    async def scenario() -> None:
        servers = {u: RpcServer("127.0.0.1:0", RpcSettings()) for u in UUIDS}
        addresses: dict[str, str] = {}
        servicers: dict[str, ConsensusServicer] = {}
        for uuid, server in servers.items():
            streams = PeerStreams(uuid)  # the server's, shared by its replicas' transports
            transport = GrpcTransport(uuid, "t" * 32, addresses.get, peer_streams=streams)
            servicer = ConsensusServicer(transport, streams, wal_log_module.WalEntryBatch.from_wire)
            servicers[uuid] = servicer
            server.add_service(consensus_pb2_grpc.add_ConsensusServiceServicer_to_server, servicer)
            await server.start()
            if channel:
                servicer.channel = PeerChannelServer(
                    uuid, servicer.serve_batches, frame_bytes_max=1 << 26
                )
                await servicer.channel.start("127.0.0.1", 0)
            addresses[uuid] = server.address
        config = RaftConfig(tuple(RaftPeer(u, addresses[u]) for u in UUIDS))
        logs = []
        try:
            async with asyncio.TaskGroup() as group:
                stream_tasks = [group.create_task(s.streams.run()) for s in servicers.values()]
                runtimes = []
                for uuid in UUIDS:
                    store = FileCmetaStore(tmp_path / f"{uuid}.cmeta")
                    bootstrap_cmeta(store, config)
                    log = wal_log_module.WalLog(tmp_path / uuid, uuid)
                    logs.append(log)
                    # Answers on the peer channel go from the WAL committer (AnswerHandoff).
                    servicers[uuid].transport.answer_when_durable = log.answer_when_durable
                    # ... and on the peer channel a leader's entries are appended natively.
                    servicers[uuid].transport.native_log = log.native
                    runtime = RaftRuntime(
                        uuid,
                        log,
                        store,
                        servicers[uuid].transport,
                        RealClock(),
                        notifier=log,
                        raft_options=RAFT_OPTIONS,
                        options=RUNTIME_OPTIONS,
                        rng=random.Random(uuid),
                    )
                    servicers[uuid].runtime = runtime
                    runtime.start(group)
                    runtimes.append(runtime)
                leader = runtimes[0]
                await eventually(lambda: all(r.running for r in runtimes))
                leader.campaign()
                await eventually(lambda: leader.role is Role.LEADER)
                op_ids = await asyncio.gather(*(leader.propose(b"%d" % i) for i in range(40)))
                last = max(op.index for op in op_ids)
                await eventually(lambda: all(r.core.last_applied >= last for r in runtimes))
                assert await leader.read_index() >= last
                # Leadership transfer uses RunLeaderElection over the wire.
                successor = leader.transfer_leadership("b")
                await eventually(lambda: runtimes[1].role is Role.LEADER)
                assert successor == "b"
                await runtimes[1].propose(b"after transfer")
                # Every batch went where the peers said: the channel when they serve one.
                sent = {
                    way: sum(s.streams.requests_sent[way] for s in servicers.values())
                    for way in ("channel", "grpc")
                }
                used, unused = ("channel", "grpc") if channel else ("grpc", "channel")
                assert sent[used] > 0, sent
                assert sent[unused] == 0, sent
                # Followers appended the leaders' entries natively only on the channel (the
                # gRPC stream has no sink for the committer to answer on).
                followed = sum(s.transport.appends_followed for s in servicers.values())
                assert (followed > 0) is channel, followed
                for runtime in runtimes:
                    runtime.stop()
                for task in stream_tasks:
                    task.cancel()
        finally:
            for server in servers.values():
                await server.stop(0)
            for servicer in servicers.values():
                if servicer.channel is not None:
                    servicer.channel.close()
            for log in logs:
                log.close()

    asyncio.run(scenario())


@asynccontextmanager
async def lone_follower(root: Path) -> AsyncIterator[tuple[RaftRuntime, Any, list[Message]]]:
    """One real follower ("b"); its leader ("a", the transport yielded) and the third voter
    ("c") are played by the test. Yields the follower, the leader's transport and every
    message the follower sent."""
    network = InMemoryNetwork()
    store = FileCmetaStore(root / "cmeta")
    bootstrap_cmeta(store, RaftConfig(tuple(RaftPeer(u, f"{u}:7050") for u in UUIDS)))
    follower = RaftRuntime(
        "b",
        MemoryLog(sync_on_append=True),
        store,
        network.transport("b"),
        RealClock(),
        raft_options=SLOW_RAFT_OPTIONS,
        options=RUNTIME_OPTIONS,
        rng=random.Random(7),
    )
    heard: list[Message] = []
    leader, third = network.transport("a"), network.transport("c")
    async with asyncio.TaskGroup() as group:
        peers = [group.create_task(t.run(heard.append)) for t in (leader, third)]
        follower.start(group)
        yield follower, leader, heard
        follower.stop()
        for task in peers:
            task.cancel()


def test_a_follower_whose_deadline_passed_in_a_stall_waits_for_the_queued_heartbeat(
    tmp_path: Path,
) -> None:
    # The whole loop blocks (time.sleep) for five election timeouts; the leader's next
    # heartbeat is handled just after the stall, as one queued behind it would be. The
    # follower's long-overdue timer must not start a campaign in between.
    async def scenario() -> None:
        seq = itertools.count(1)
        async with lone_follower(tmp_path) as (follower, leader, heard):

            async def heartbeats(duration_s: float) -> None:
                interval_s = SLOW_RAFT_OPTIONS.heartbeat_interval_ms / 1000
                for _ in range(int(duration_s / interval_s)):
                    leader.send(AppendRequest("a", "b", 1, OpId(0, 0), None, 0, next(seq)))
                    await asyncio.sleep(interval_s)

            await heartbeats(1.0)
            assert follower.core.leader_uuid == "a"
            heard.clear()  # a campaign before the first heartbeat arrived is not the point
            time.sleep(5 * SLOW_RAFT_OPTIONS.election_timeout_base_ms / 1000)  # noqa: ASYNC251
            await asyncio.sleep(0.05)  # the loop runs again; the heartbeat is not handled yet
            await heartbeats(1.0)
        assert [m for m in heard if isinstance(m, VoteRequest)] == []
        assert (follower.core.term, follower.core.leader_uuid) == (1, "a")

    asyncio.run(scenario())


def test_a_follower_woken_by_its_leaders_silence_campaigns_even_after_a_stall(
    tmp_path: Path,
) -> None:
    # A quiesced follower whose leader's server went silent wakes; a stall of the loop past
    # its new election deadline is not excused again (the silence check excused it): it
    # campaigns as soon as the loop runs.
    async def scenario() -> None:
        async with lone_follower(tmp_path) as (follower, leader, heard):
            for seq in range(1, 6):  # heartbeats, the last one quiescing
                quiesce = seq == 5
                leader.send(AppendRequest("a", "b", 1, OpId(0, 0), None, 0, seq, quiesce=quiesce))
                await asyncio.sleep(0.05)
            assert follower.quiesced
            heard.clear()
            follower.server_silent("a")
            await asyncio.sleep(0)  # the timer task arms the woken follower's deadline
            time.sleep(5 * SLOW_RAFT_OPTIONS.election_timeout_base_ms / 1000)  # noqa: ASYNC251
            await asyncio.sleep(0.05)
        assert [m.dest for m in heard if isinstance(m, VoteRequest)] == ["a", "c"]

    asyncio.run(scenario())


class _SlowFileStore(FileCmetaStore):
    """A cmeta file on a slow disk: each write takes ``delay_s`` longer (so that a message sent
    before its term or vote is durable would be seen by the checking transport below)."""

    def __init__(self, path: Path, delay_s: float) -> None:
        super().__init__(path)
        self.delay_s = delay_s
        self.writes = 0

    def save(self, meta: Any) -> None:
        time.sleep(self.delay_s)
        super().save(meta)
        self.writes += 1


class _DurabilityCheckingTransport:
    """Sends through the in-memory network, first checking the sender's cmeta file: no message
    may carry a term the file does not hold yet, and no granted vote a vote it does not."""

    def __init__(self, inner: Any, store: FileCmetaStore, violations: list[str]) -> None:
        self._inner = inner
        self._store = store
        self._violations = violations
        self.checked_terms: set[int] = set()

    async def run(self, deliver: Any) -> None:
        await self._inner.run(deliver)

    def send(self, message: Message) -> None:
        pre_vote = getattr(message, "pre_election", False)
        if not pre_vote:  # a pre-vote changes nothing, so nothing of it must be durable
            durable = self._store.load()
            if message.term > durable.current_term:
                on_disk = durable.current_term
                self._violations.append(f"{message!r} sent with term {on_disk} on disk")
            granted = isinstance(message, VoteResponse) and message.granted
            if granted and durable.voted_for != message.dest:
                self._violations.append(f"{message!r} sent with vote {durable.voted_for} on disk")
            self.checked_terms.add(message.term)
        self._inner.send(message)


def test_nothing_leaves_before_the_term_and_vote_it_depends_on_are_durable(
    tmp_path: Path,
) -> None:
    """Cmeta is written off the event loop; what the core produced meanwhile (vote requests,
    votes, a new leader's AppendEntries) is held until the write is durable. Every message of
    several elections is checked against the sender's file as it leaves."""

    async def scenario() -> None:
        network = InMemoryNetwork()
        config = RaftConfig(tuple(RaftPeer(u, f"{u}:7050") for u in UUIDS))
        violations: list[str] = []
        runtimes: dict[str, RaftRuntime] = {}
        stores: dict[str, _SlowFileStore] = {}
        transports: dict[str, _DurabilityCheckingTransport] = {}
        for uuid in UUIDS:
            (tmp_path / uuid).mkdir()
            store = stores[uuid] = _SlowFileStore(tmp_path / uuid / "cmeta", delay_s=0.01)
            bootstrap_cmeta(store, config)
            transport = transports[uuid] = _DurabilityCheckingTransport(
                network.transport(uuid), store, violations
            )
            runtimes[uuid] = RaftRuntime(
                uuid,
                MemoryLog(sync_on_append=True),
                store,
                transport,
                RealClock(),
                raft_options=RAFT_OPTIONS,
                options=RUNTIME_OPTIONS,
                rng=random.Random(uuid),
            )

        async def leader(min_term: int) -> RaftRuntime:
            async with asyncio.timeout(WAIT_S):
                while True:
                    leaders = [
                        r
                        for u, r in runtimes.items()
                        if r.role is Role.LEADER
                        and r.core.term >= min_term
                        and u not in network._isolated
                    ]
                    if len(leaders) == 1:
                        return leaders[0]
                    await asyncio.sleep(0.005)

        async with asyncio.TaskGroup() as group:
            for runtime in runtimes.values():
                runtime.start(group)
            current = await leader(1)
            await current.propose(b"first")
            for _ in range(3):  # three more elections: the leader is cut off each time
                network.isolate(current.uuid)
                current = await leader(current.core.term + 1)
                await current.propose(b"after an election")
                network.heal()
            for runtime in runtimes.values():
                runtime.stop()
        assert violations == []
        # Not vacuous: terms rose, written slowly, and messages of those terms were checked.
        assert len(set().union(*(t.checked_terms for t in transports.values()))) >= 4
        assert all(s.writes >= 3 for s in stores.values())

    asyncio.run(scenario())


@dataclass
class _Hosted:
    """What ``ServerHeartbeats`` reads of a hosted replica."""

    tablet_id: str
    runtime: RaftRuntime


class _Hosting:
    """The tablet manager of a server hosting the given replicas (``ServerHeartbeats`` only
    lists them)."""

    def __init__(self, *replicas: _Hosted) -> None:
        self._replicas = list(replicas)

    def replicas(self) -> list[_Hosted]:
        return self._replicas


def test_a_repeated_server_heartbeat_vouches_for_replicas_that_quiesced_since_and_restamps(
    tmp_path: Path,
) -> None:
    # Server "b" hosts the follower; server "a" (the test) leads and sends the same server
    # heartbeat again and again. The follower is awake at the first one, quiesces, and then
    # must be vouched for by the repeats (its leader contact stays fresh), though they are
    # identical to the one that found it awake: its quiescing is a local change that makes
    # the next repeat a full check, and every repeat after that re-stamps it. Likewise what
    # "b" sends "a" names the follower as soon as it quiesced.
    from nyala.server.server_heartbeats import ServerHeartbeats

    tablet = "t" * 32
    gap_s = 0.4  # several heartbeat intervals of the follower

    async def scenario() -> None:
        async with lone_follower(tmp_path) as (follower, leader, _):
            hosting = _Hosting(_Hosted(tablet, follower))
            beats = ServerHeartbeats(
                "b",
                lambda: hosting,  # type: ignore[arg-type,return-value]
                RealClock(),
                interval_ms=100,
                silent_after_ms=300,
                rpc_settings=RpcSettings(),
            )
            follower.on_liveness_change = beats.note_change
            await eventually(lambda: follower.running)
            leader.send(AppendRequest("a", "b", 1, OpId(0, 0), None, 0, 1))
            await eventually(lambda: follower.core.leader_uuid == "a")
            request = consensus_pb2.ServerHeartbeatRequestPB(dest_uuid="b", caller_uuid="a")
            request.leading.add(tablet_id=tablet, term=1, commit_index=0)
            beats.handle(request)  # the follower is awake: nothing to vouch for
            assert list(beats._peers()["a"].request.following) == []  # nor to tell "a"
            leader.send(AppendRequest("a", "b", 1, OpId(0, 0), None, 0, 2, quiesce=True))
            await eventually(lambda: follower.quiesced)
            # What "b" tells "a" names it at once (not when the cached heartbeat expires).
            told = beats._peers()["a"].request.following
            assert [(f.tablet_id, f.leader_uuid, f.term) for f in told] == [(tablet, "a", 1)]
            for _ in range(3):
                await asyncio.sleep(gap_s)
                beats.handle(request)
                contact = follower.core.leader_contact()
                assert contact is not None
                assert contact.age_ms < gap_s * 1000 / 2, "the repeat did not vouch for it"
                assert follower.quiesced

    asyncio.run(scenario())
