"""Every server's ConsensusService (tservers and masters alike): routes each call to the hosted
replica's Raft.

Handlers only find the replica and hand the request to its ``GrpcTransport`` (which steps the
core and awaits its answer) or its ``RaftRuntime``. Membership rules (leader only, one change at
a time, CAS on the committed config's op index) stay with the core; ChangeConfig answers once
the change is appended, so its commit shows in GetConsensusState's ``committed_config``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Callable

import grpc

from nyala import _native
from nyala._proto import common_pb2, consensus_pb2, consensus_pb2_grpc, metadata_pb2
from nyala.consensus.membership import ChangeType, ConfigChange, PeerChange
from nyala.consensus.runtime import RaftRuntime, wire
from nyala.consensus.runtime.peer_streams import PeerStreams
from nyala.consensus.runtime.transport import GrpcTransport
from nyala.consensus.runtime.wal_log import WalEntryBatch
from nyala.consensus.types import MemberType
from nyala.errors import InvalidArgumentError, TabletNotRunningError
from nyala.rpc import Context, RpcMetrics, ServiceBase, unary
from nyala.rpc.service import bidi_stream, check_dest_uuid
from nyala.server.convert import config_to_pb, peer_from_pb
from nyala.server.server_heartbeats import ServerHeartbeats
from nyala.tablet import TabletManager
from nyala.tablet.copy_vote import VOTING_DATA_STATES, tombstoned_vote
from nyala.tablet.replica import TabletReplica

log = logging.getLogger(__name__)

_CHANGE_TYPES = {
    consensus_pb2.ADD_PEER: ChangeType.ADD_PEER,
    consensus_pb2.REMOVE_PEER: ChangeType.REMOVE_PEER,
    consensus_pb2.MODIFY_PEER: ChangeType.MODIFY_PEER,
}


def _decode_batch(data: bytes, start: int, end: int) -> WalEntryBatch:
    return WalEntryBatch.from_wire(data, start, end)


def add_consensus_service(servicer: ConsensusService, server: grpc.aio.Server) -> None:
    """Registers the ConsensusService."""
    consensus_pb2_grpc.add_ConsensusServiceServicer_to_server(servicer, server)


class ConsensusService(ServiceBase, consensus_pb2_grpc.ConsensusServiceServicer):
    """Raft traffic between the replicas of the tablets this server hosts."""

    def __init__(
        self,
        server_uuid: str,
        metrics: RpcMetrics,
        tablets: TabletManager,
        peer_streams: Callable[[], PeerStreams | None],
        server_heartbeats: Callable[[], ServerHeartbeats | None] = lambda: None,
        peer_channel_port: Callable[[], int] = lambda: 0,
    ) -> None:
        super().__init__(server_uuid, metrics)
        self._tablets = tablets
        self._peer_streams = peer_streams
        self._server_heartbeats = server_heartbeats
        self._peer_channel_port = peer_channel_port

    def _raft(self, tablet_id: str) -> tuple[TabletReplica, RaftRuntime, GrpcTransport]:
        replica = self._tablets.replica(tablet_id)
        runtime, transport = replica.runtime, replica.transport
        if runtime is None or not isinstance(transport, GrpcTransport):
            raise TabletNotRunningError(f"tablet {tablet_id}: Raft is not running here")
        return replica, runtime, transport

    @unary(consensus_pb2.ServerHeartbeatResponsePB)
    async def ServerHeartbeat(
        self,
        request: consensus_pb2.ServerHeartbeatRequestPB,
        context: Context[
            consensus_pb2.ServerHeartbeatRequestPB, consensus_pb2.ServerHeartbeatResponsePB
        ],
    ) -> consensus_pb2.ServerHeartbeatResponsePB:
        heartbeats = self._server_heartbeats()
        if heartbeats is not None:  # else nothing here quiesces: nothing to vouch for
            heartbeats.handle(request)
        return consensus_pb2.ServerHeartbeatResponsePB()

    @unary(consensus_pb2.ConsensusResponsePB)
    async def UpdateConsensus(
        self,
        request: consensus_pb2.ConsensusRequestPB,
        context: Context[consensus_pb2.ConsensusRequestPB, consensus_pb2.ConsensusResponsePB],
    ) -> consensus_pb2.ConsensusResponsePB:
        _, _, transport = self._raft(request.tablet_id)
        return await transport.handle_update(request, _decode_batch)

    @bidi_stream(consensus_pb2.ConsensusBatchResponsePB)
    async def ConsensusPeerStream(
        self,
        requests: AsyncIterator[consensus_pb2.ConsensusBatchRequestPB],
        context: Context[
            consensus_pb2.ConsensusBatchRequestPB, consensus_pb2.ConsensusBatchResponsePB
        ],
    ) -> AsyncIterator[consensus_pb2.ConsensusBatchResponsePB]:
        async for answers in self.serve_peer_batches(requests):
            yield answers

    def serve_peer_batches(
        self, batches: AsyncIterator[wire.PeerBatch], sink: _native.AnswerSink | None = None
    ) -> AsyncIterator[consensus_pb2.ConsensusBatchResponsePB]:
        """Answers one peer's consensus batches (whose ``dest_uuid`` the caller checks), from
        ConsensusPeerStream or from the peer channel (``peer_channel``, which may give its
        connection's ``sink`` for tablets to write answers to themselves)."""
        streams = self._peer_streams()
        if streams is None:
            raise TabletNotRunningError(f"server {self.server_uuid} runs no consensus yet")

        def route(tablet_id: str) -> GrpcTransport:
            return self._raft(tablet_id)[2]

        async def vote(request: consensus_pb2.VoteRequestPB) -> consensus_pb2.VoteResponsePB:
            check_dest_uuid(request.dest_uuid, self.server_uuid)  # as RequestVote's is
            return await self._vote(request)

        return streams.serve(batches, route, _decode_batch, vote, sink)

    @unary(consensus_pb2.PeerChannelResponsePB)
    async def GetPeerChannel(
        self,
        request: consensus_pb2.PeerChannelRequestPB,
        context: Context[consensus_pb2.PeerChannelRequestPB, consensus_pb2.PeerChannelResponsePB],
    ) -> consensus_pb2.PeerChannelResponsePB:
        return consensus_pb2.PeerChannelResponsePB(port=self._peer_channel_port())

    @unary(consensus_pb2.VoteResponsePB)
    async def RequestVote(
        self,
        request: consensus_pb2.VoteRequestPB,
        context: Context[consensus_pb2.VoteRequestPB, consensus_pb2.VoteResponsePB],
    ) -> consensus_pb2.VoteResponsePB:
        return await self._vote(request)

    async def _vote(self, request: consensus_pb2.VoteRequestPB) -> consensus_pb2.VoteResponsePB:
        """A vote request's answer, asked by RequestVote or on a peer's consensus stream
        (where servers send theirs)."""
        replica = self._tablets.lookup(request.tablet_id)
        if replica is not None and replica.superblock.data_state in VOTING_DATA_STATES:
            # Tombstoned voting (seed 000): no Raft runs, cmeta and last-logged OpId answer.
            answer = tombstoned_vote(replica, wire.vote_request_from_pb(request))
            return wire.vote_response_to_pb(answer)
        _, _, transport = self._raft(request.tablet_id)
        return await transport.handle_vote(request)

    @unary(consensus_pb2.RunLeaderElectionResponsePB)
    async def RunLeaderElection(
        self,
        request: consensus_pb2.RunLeaderElectionRequestPB,
        context: Context[
            consensus_pb2.RunLeaderElectionRequestPB, consensus_pb2.RunLeaderElectionResponsePB
        ],
    ) -> consensus_pb2.RunLeaderElectionResponsePB:
        _, runtime, _ = self._raft(request.tablet_id)
        runtime.run_leader_election()
        return consensus_pb2.RunLeaderElectionResponsePB()

    @unary(consensus_pb2.LeaderStepDownResponsePB)
    async def LeaderStepDown(
        self,
        request: consensus_pb2.LeaderStepDownRequestPB,
        context: Context[
            consensus_pb2.LeaderStepDownRequestPB, consensus_pb2.LeaderStepDownResponsePB
        ],
    ) -> consensus_pb2.LeaderStepDownResponsePB:
        _, runtime, _ = self._raft(request.tablet_id)
        if request.mode == consensus_pb2.GRACEFUL:
            runtime.transfer_leadership(request.new_leader_uuid or None)
        elif request.new_leader_uuid:
            raise InvalidArgumentError("new_leader_uuid needs mode GRACEFUL")
        else:
            runtime.step_down()
        return consensus_pb2.LeaderStepDownResponsePB()

    @unary(consensus_pb2.GetConsensusStateResponsePB)
    async def GetConsensusState(
        self,
        request: consensus_pb2.GetConsensusStateRequestPB,
        context: Context[
            consensus_pb2.GetConsensusStateRequestPB, consensus_pb2.GetConsensusStateResponsePB
        ],
    ) -> consensus_pb2.GetConsensusStateResponsePB:
        response = consensus_pb2.GetConsensusStateResponsePB()
        wanted = list(request.tablet_ids) or [
            s.tablet_id for s in self._tablets.statuses(sizes=False) if s.state == "RUNNING"
        ]
        for tablet_id in wanted:
            _, runtime, _ = self._raft(tablet_id)
            status = runtime.status()
            info = response.tablets.add(tablet_id=tablet_id, committed_index=status.commit_index)
            info.cstate.current_term = status.term
            info.cstate.leader_uuid = status.leader_uuid or ""
            info.cstate.committed_config.CopyFrom(config_to_pb(status.committed_config))
            if status.pending_config is not None:
                info.cstate.pending_config.CopyFrom(config_to_pb(status.pending_config))
            info.last_logged.CopyFrom(
                common_pb2.OpIdPB(term=status.last_op_id.term, index=status.last_op_id.index)
            )
        return response

    @unary(consensus_pb2.ChangeConfigResponsePB)
    async def ChangeConfig(
        self,
        request: consensus_pb2.ChangeConfigRequestPB,
        context: Context[consensus_pb2.ChangeConfigRequestPB, consensus_pb2.ChangeConfigResponsePB],
    ) -> consensus_pb2.ChangeConfigResponsePB:
        _, runtime, _ = self._raft(request.tablet_id)
        first = _peer_change(request.type, request.server if request.HasField("server") else None)
        more = tuple(
            _peer_change(item.type, item.server if item.HasField("server") else None)
            for item in request.more_changes
        )
        cas = request.cas_config_opid_index if request.HasField("cas_config_opid_index") else None
        runtime.change_config(
            ConfigChange(first.change_type, first.peer, cas_config_opid_index=cas, more=more)
        )
        status = runtime.status()
        new_config = status.pending_config or status.committed_config
        return consensus_pb2.ChangeConfigResponsePB(new_config=config_to_pb(new_config))

    @unary(consensus_pb2.UnsafeChangeConfigResponsePB)
    async def UnsafeChangeConfig(
        self,
        request: consensus_pb2.UnsafeChangeConfigRequestPB,
        context: Context[
            consensus_pb2.UnsafeChangeConfigRequestPB, consensus_pb2.UnsafeChangeConfigResponsePB
        ],
    ) -> consensus_pb2.UnsafeChangeConfigResponsePB:
        _, runtime, _ = self._raft(request.tablet_id)
        if not runtime.running:
            raise TabletNotRunningError(f"tablet {request.tablet_id}: Raft is not running here")
        voters = [p.permanent_uuid for p in request.new_config.peers]
        log.warning(
            "UNSAFE config change of tablet %s requested by %r: forcing VOTERs %s, bypassing"
            " Raft (entries only the dropped replicas had are lost)",
            request.tablet_id,
            request.caller_id,
            voters,
        )
        # The runtime executes the core's effects and re-arms its timer (the new term's
        # election: at once when this replica is left as the sole voter).
        runtime.unsafe_change_config(voters)
        return consensus_pb2.UnsafeChangeConfigResponsePB()


def _peer_change(
    kind: consensus_pb2.ChangeConfigType.ValueType, server: metadata_pb2.RaftPeerPB | None
) -> PeerChange:
    """One change of a ChangeConfig request, checked."""
    change_type = _CHANGE_TYPES.get(kind)
    if change_type is None:
        raise InvalidArgumentError(f"unknown ChangeConfig type {kind}")
    if server is None:
        raise InvalidArgumentError("ChangeConfig needs the server it changes")
    unset_type = server.member_type == metadata_pb2.MEMBER_TYPE_UNKNOWN
    if change_type is ChangeType.ADD_PEER and unset_type:
        # The default policy: a new peer learns the log as a NON_VOTER, promoted once caught
        # up, so a slow copy never holds up the majority.
        peer = peer_from_pb(server, default_member_type=MemberType.NON_VOTER)
        return PeerChange(change_type, dataclasses.replace(peer, promote=True))
    # REMOVE_PEER uses only the uuid: any member type will do.
    default = MemberType.VOTER if change_type is ChangeType.REMOVE_PEER else None
    return PeerChange(change_type, peer_from_pb(server, default_member_type=default))
