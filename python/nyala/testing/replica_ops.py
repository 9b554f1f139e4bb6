"""Replica inspection helpers for tests of replica management (issue 10): a replica's committed
config as its server reports it, its voters, and the data state of every replica on a server."""

from __future__ import annotations

from nyala._proto import consensus_pb2, metadata_pb2, tserver_admin_pb2
from nyala.errors import NyalaError
from nyala.testing.mini_cluster import ServerProcess


def committed_config(ts: ServerProcess, tablet_id: str) -> metadata_pb2.RaftConfigPB | None:
    """``tablet_id``'s committed config as ``ts`` reports it (None: not answered)."""
    request = consensus_pb2.GetConsensusStateRequestPB(
        dest_uuid=ts.uuid or "", tablet_ids=[tablet_id]
    )
    try:
        with ts.proxy() as proxy:
            answer = proxy.call(proxy.consensus.GetConsensusState, request, timeout_ms=2_000)
    except NyalaError:
        return None
    return answer.tablets[0].cstate.committed_config if answer.tablets else None


def voters(config: metadata_pb2.RaftConfigPB | None) -> set[str]:
    """The VOTER uuids of a config (empty for None)."""
    if config is None:
        return set()
    return {p.permanent_uuid for p in config.peers if p.member_type == metadata_pb2.VOTER}


def tablet_states(ts: ServerProcess) -> dict[str, int]:
    """tablet id -> data state of every replica ``ts`` holds."""
    with ts.proxy() as proxy:
        answer = proxy.call(
            proxy.admin.ListTablets, tserver_admin_pb2.ListTabletsRequestPB(dest_uuid=ts.uuid or "")
        )
    return {s.tablet_status.tablet_id: s.tablet_status.data_state for s in answer.status_and_schema}
