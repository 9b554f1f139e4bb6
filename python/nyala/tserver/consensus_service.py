"""The tablet server's ConsensusService: routes each call to the hosted replica's Raft.

Handlers only find the replica and hand the request to its ``GrpcTransport`` (which steps the
core and awaits its answer) or its ``RaftRuntime``. ChangeConfig and UnsafeChangeConfig belong
to the membership work and answer ``NOT_SUPPORTED`` here until it is wired in.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from nyala._proto import common_pb2, consensus_pb2, consensus_pb2_grpc
from nyala.consensus.runtime import RaftRuntime
from nyala.consensus.transport import GrpcTransport
from nyala.consensus.wal_log import WalEntryBatch
from nyala.errors import InvalidArgumentError, NotSupportedError, TabletNotRunningError
from nyala.rpc import RpcMetrics, ServiceBase, unary
from nyala.rpc.service import bidi_stream
from nyala.tablet import TabletManager
from nyala.tablet.replica import TabletReplica
from nyala.tserver.convert import config_to_pb


def _decode_batch(data: bytes) -> WalEntryBatch:
    return WalEntryBatch.from_wire(data)


class ConsensusService(ServiceBase, consensus_pb2_grpc.ConsensusServiceServicer):  # type: ignore[misc]
    """Raft traffic between the replicas of the tablets this server hosts."""

    def __init__(self, server_uuid: str, metrics: RpcMetrics, tablets: TabletManager) -> None:
        super().__init__(server_uuid, metrics)
        self._tablets = tablets

    def _raft(self, tablet_id: str) -> tuple[TabletReplica, RaftRuntime, GrpcTransport]:
        replica = self._tablets.replica(tablet_id)
        runtime, transport = replica.runtime, replica.transport
        if runtime is None or not isinstance(transport, GrpcTransport):
            raise TabletNotRunningError(f"tablet {tablet_id}: Raft is not running here")
        return replica, runtime, transport

    @unary(consensus_pb2.ConsensusResponsePB)
    async def UpdateConsensus(self, request: Any, context: Any) -> Any:
        _, _, transport = self._raft(request.tablet_id)
        return await transport.handle_update(request, _decode_batch)

    @bidi_stream(consensus_pb2.ConsensusResponsePB)
    async def UpdateConsensusStream(
        self, requests: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[Any]:
        # A stream carries one tablet (one per leader-follower pair): route by its first request.
        first = await anext(requests, None)
        if first is None:
            return
        _, _, transport = self._raft(first.tablet_id)

        async def rest() -> AsyncIterator[Any]:
            yield first
            async for request in requests:
                if request.tablet_id != first.tablet_id:
                    raise InvalidArgumentError("one UpdateConsensusStream carries one tablet")
                yield request

        async for response in transport.handle_stream(rest(), _decode_batch):
            yield response

    @unary(consensus_pb2.VoteResponsePB)
    async def RequestVote(self, request: Any, context: Any) -> Any:
        _, _, transport = self._raft(request.tablet_id)
        return await transport.handle_vote(request)

    @unary(consensus_pb2.RunLeaderElectionResponsePB)
    async def RunLeaderElection(self, request: Any, context: Any) -> Any:
        _, runtime, _ = self._raft(request.tablet_id)
        runtime.run_leader_election()
        return consensus_pb2.RunLeaderElectionResponsePB()

    @unary(consensus_pb2.LeaderStepDownResponsePB)
    async def LeaderStepDown(self, request: Any, context: Any) -> Any:
        _, runtime, _ = self._raft(request.tablet_id)
        if request.mode == consensus_pb2.GRACEFUL:
            runtime.transfer_leadership(request.new_leader_uuid or None)
        elif request.new_leader_uuid:
            raise InvalidArgumentError("new_leader_uuid needs mode GRACEFUL")
        else:
            runtime.step_down()
        return consensus_pb2.LeaderStepDownResponsePB()

    @unary(consensus_pb2.GetConsensusStateResponsePB)
    async def GetConsensusState(self, request: Any, context: Any) -> Any:
        response = consensus_pb2.GetConsensusStateResponsePB()
        wanted = list(request.tablet_ids) or [
            s.tablet_id for s in self._tablets.statuses() if s.state == "RUNNING"
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
    async def ChangeConfig(self, request: Any, context: Any) -> Any:
        raise NotSupportedError("ChangeConfig is not wired into the tablet server yet")

    @unary(consensus_pb2.UnsafeChangeConfigResponsePB)
    async def UnsafeChangeConfig(self, request: Any, context: Any) -> Any:
        raise NotSupportedError("UnsafeChangeConfig is not wired into the tablet server yet")
