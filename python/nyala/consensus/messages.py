"""The messages replicas of one tablet exchange: votes, AppendEntries (UpdateConsensus), and
the leadership-transfer nudge. Frozen values; the transport serializes them, the core never does.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from nyala.consensus.log import EntryBatch
from nyala.consensus.types import OpId


class VoteDenial(enum.Enum):
    """Why a vote was refused."""

    TERM_TOO_OLD = "TERM_TOO_OLD"
    ALREADY_VOTED = "ALREADY_VOTED"
    LAST_OPID_TOO_OLD = "LAST_OPID_TOO_OLD"  # the candidate's log is behind the voter's
    LEADER_IS_ALIVE = "LEADER_IS_ALIVE"  # the voter heard a live leader recently (withholding)


class AppendStatus(enum.Enum):
    """The outcome of an AppendEntries request on the follower."""

    OK = "OK"
    LOG_MISMATCH = "LOG_MISMATCH"  # the preceding OpId is not in the follower's log
    TERM_TOO_OLD = "TERM_TOO_OLD"  # the sender is a deposed leader


@dataclass(frozen=True, slots=True)
class VoteRequest:
    """RequestVote, or a pre-vote when ``pre_election`` (which changes nothing on the voter)."""

    src: str
    dest: str
    term: int  # the candidate's term; for a pre-vote, the term it would campaign in
    last_op_id: OpId
    pre_election: bool = False
    ignore_live_leader: bool = False  # set by leadership transfer and RunLeaderElection


@dataclass(frozen=True, slots=True)
class VoteResponse:
    """The answer to a ``VoteRequest``."""

    src: str
    dest: str
    term: int  # the request's term when granted, else the voter's current term
    granted: bool
    pre_election: bool
    denial: VoteDenial | None = None


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """AppendEntries / UpdateConsensus: entries after ``preceding``, or a heartbeat if none."""

    src: str
    dest: str
    term: int
    preceding: OpId  # the entry just before ``entries`` in the leader's log
    entries: EntryBatch | None  # opaque to consensus except for its OpIds, size, config entries
    committed_index: int
    seq: int  # leader's heartbeat round, echoed back; confirms leadership for ReadIndex
    # The leader's last heartbeat before it quiesces: a follower that has everything up to
    # the leader's commit index stops its election timer (see ``RaftCore`` "Quiescence").
    quiesce: bool = False

    def with_seq(self, seq: int) -> AppendRequest:
        """This request with another ``seq``: what ``dataclasses.replace`` makes, at a fifth
        of its cost (a follower's transport stamps every request it receives)."""
        return AppendRequest(
            self.src,
            self.dest,
            self.term,
            self.preceding,
            self.entries,
            self.committed_index,
            seq,
            self.quiesce,
        )


@dataclass(frozen=True, slots=True)
class AppendResponse:
    """The follower's answer to an ``AppendRequest``, or an unsolicited durability ack."""

    src: str
    dest: str
    term: int
    status: AppendStatus
    # OK: the last entry known to match the leader's log; LOG_MISMATCH: the follower's last entry.
    last_received: OpId
    durable_index: int  # entries <= this match the leader's log and are durable (OK only)
    hint_index: int = 0  # LOG_MISMATCH: the leader should retry from no later than this index
    seq: int = 0


@dataclass(frozen=True, slots=True)
class TimeoutNow:
    """Leadership transfer: the leader tells a caught-up VOTER to run an election now."""

    src: str
    dest: str
    term: int


Message = VoteRequest | VoteResponse | AppendRequest | AppendResponse | TimeoutNow
