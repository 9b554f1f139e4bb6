"""Tombstoned voting: how a replica without a running Raft (``TOMBSTONED`` or ``COPYING``)
answers RequestVote (seed 000, "Should a server be allowed to vote if it ... is DELETED?").

Such a replica has no log, but it keeps its cmeta and the last OpId its log held
(``Superblock.tombstone_last_logged_opid``), which is all Raft's vote rule needs: it grants a
vote only to a candidate whose log is at least as up to date, and it never votes twice in a
term. The term and the vote are saved before the answer is returned, as the core does. A
replica that crashed mid-copy comes back ``TOMBSTONED`` with the same OpId and votes the same.

The function runs on the server's event loop, as do the copy job's cmeta merge and the whole
vote; so no two cmeta read-modify-writes of one tablet interleave.
"""

from __future__ import annotations

from nyala.consensus.messages import VoteDenial, VoteRequest, VoteResponse
from nyala.consensus.metadata import ConsensusMetadata
from nyala.consensus.runtime.cmeta_store import FileCmetaStore
from nyala.errors import NotFoundError, TabletNotFoundError
from nyala.tablet.replica import TabletReplica
from nyala.tablet.superblock import DataState

VOTING_DATA_STATES = frozenset({DataState.TOMBSTONED, DataState.COPYING})


def tombstoned_vote(replica: TabletReplica, request: VoteRequest) -> VoteResponse:
    """Answers ``request`` for a TOMBSTONED or COPYING replica; saves term and vote first.

    ``TabletNotFoundError`` if the replica is in another state or has no cmeta (a copy that
    crashed before its cmeta merge never voted as this tablet and has nothing to vote with).
    """
    if replica.superblock.data_state not in VOTING_DATA_STATES:
        raise TabletNotFoundError(f"tablet {replica.tablet_id} is not on this server")
    store = FileCmetaStore(replica.paths.cmeta)
    try:
        meta = store.load()
    except NotFoundError:
        raise TabletNotFoundError(
            f"tablet {replica.tablet_id} is {replica.superblock.data_state.value} without cmeta"
        ) from None
    last_logged = replica.last_logged_op_id()
    me = request.dest

    def deny(term: int, denial: VoteDenial) -> VoteResponse:
        return VoteResponse(me, request.src, term, False, request.pre_election, denial)

    if request.term < meta.current_term:
        return deny(meta.current_term, VoteDenial.TERM_TOO_OLD)
    if request.pre_election:
        # A pre-vote changes nothing here; it only says how a real vote would go.
        if request.term == meta.current_term and meta.voted_for not in (None, request.src):
            return deny(meta.current_term, VoteDenial.ALREADY_VOTED)
        if request.last_op_id < last_logged:
            return deny(meta.current_term, VoteDenial.LAST_OPID_TOO_OLD)
        return VoteResponse(me, request.src, request.term, True, True)
    if request.term > meta.current_term:
        meta = ConsensusMetadata(request.term, None, meta.committed_config)
        store.save(meta)  # the new term is durable before anything is answered
    if meta.voted_for not in (None, request.src):
        return deny(meta.current_term, VoteDenial.ALREADY_VOTED)
    if request.last_op_id < last_logged:
        return deny(meta.current_term, VoteDenial.LAST_OPID_TOO_OLD)
    if meta.voted_for is None:
        store.save(ConsensusMetadata(meta.current_term, request.src, meta.committed_config))
    return VoteResponse(me, request.src, request.term, True, False)
