"""``RaftCore``: the sans-I/O Raft state machine of one tablet replica.

Inputs are messages (``step``), clock ticks (``tick``), durability reports
(``on_log_durable``) and requests (``propose``, ``read``, ``transfer_leadership``,
``change_config``, ...). Outputs are ``Effect``s collected with ``drain_effects``. The core
reads time only from its injected ``Clock``, randomness only from its injected ``Random``, and
touches storage only through its ``RaftLog`` and ``CmetaStore``; the runtime does all network
I/O. Role dispatch lives in ``step`` (``_step_leader``/``_step_follower``/``_step_candidate``);
each message kind has one ``_on_<message>`` handler.

Safety rules enforced here (DESIGN.md §7): term and vote are saved before any message that
depends on them is emitted (``_send`` flushes cmeta first); a leader commits only entries of its
own term, counting VOTERs' *durable* match indexes; committed entries are applied in order,
each once; one config change at a time, only after an op of the leader's term committed.

Quiescence (``RaftOptions.quiesce_after_idle_heartbeats``; CockroachDB's quiesced ranges,
TiKV's hibernating regions). A leader whose log is committed, durable and matched by every
follower, with nothing pending (no read, transfer, config change, copy), counts idle
heartbeat rounds; after enough it sends one last heartbeat marked ``quiesce`` and stops
heartbeating. A follower that has everything up to that heartbeat's commit index stops its
election timer. Liveness then travels outside the group, in one heartbeat per pair of servers
that names the quiesced replicas each side holds: the runtime reports them with
``vouched_by_leader`` (a follower's leader is alive at the same term and commit index: the
follower keeps withholding its vote, Raft's "heard from a live leader") and
``vouched_by_peer`` (a leader's follower still has everything). Anything else wakes the
replica (``wake``): a proposal, a read, a config change or transfer, a vote request reaching
the leader, an answer that is not a match, a vouch that does not match, or the runtime's word
that the other server went silent. A woken follower's election deadline counts from the last
time its leader was heard or vouched for, so a dead leader is replaced within about one
election timeout of its last sign of life; the followers' first campaigns go in an order
drawn per group, so that two of them do not split the vote (``_wake``). Safety does not
depend on quiescence: votes and terms follow the rules above, and a quiesced replica only
stops *timers*.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from nyala.common.clock import Clock
from nyala.consensus import membership
from nyala.consensus.effects import (
    Apply,
    ConfigCommitted,
    Effect,
    LogTruncated,
    ReadFailed,
    ReadReady,
    RoleChanged,
    Send,
    StartTabletCopy,
)
from nyala.consensus.log import RaftLog
from nyala.consensus.membership import ConfigChange
from nyala.consensus.messages import (
    AppendRequest,
    AppendResponse,
    AppendStatus,
    Message,
    TimeoutNow,
    VoteDenial,
    VoteRequest,
    VoteResponse,
)
from nyala.consensus.metadata import CmetaStore, ConsensusMetadata
from nyala.consensus.options import RaftOptions
from nyala.consensus.progress import PeerHealth, PeerProgress
from nyala.consensus.types import (
    MIN_OP_ID,
    EntryKind,
    MemberType,
    OpId,
    RaftConfig,
    Role,
    decode_config,
    encode_config,
)
from nyala.errors import (
    CasFailedError,
    IllegalStateError,
    InvalidArgumentError,
    NotFoundError,
    NotLeaderError,
    ServiceUnavailableError,
    WrongServerUuidError,
)


@dataclass(slots=True)
class _Election:
    """A (pre-)election this replica runs."""

    term: int  # the term campaigned for (current + 1 for a pre-election)
    pre: bool
    granted: set[str] = field(default_factory=set)
    denied: set[str] = field(default_factory=set)
    # A voter denied for another reason than LEADER_IS_ALIVE (``_check_election``).
    denied_otherwise: bool = False


@dataclass(slots=True)
class _Transfer:
    """A graceful leadership transfer in progress."""

    target: str
    deadline_ms: int
    nudged: bool = False  # TimeoutNow was sent


@dataclass(slots=True)
class _PendingRead:
    """A ReadIndex read waiting for its heartbeat round and for apply."""

    read_id: int
    seq: int  # confirmed once a majority answered a heartbeat of this round or later
    index: int | None  # the commit index to serve at; None until an own-term op committed


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    """A snapshot of a replica's consensus state."""

    uuid: str
    role: Role
    term: int
    leader_uuid: str | None
    voted_for: str | None
    last_op_id: OpId
    durable_index: int
    commit_index: int
    last_applied: int
    committed_config: RaftConfig
    pending_config: RaftConfig | None
    transfer_target: str | None
    quiesced: bool = False
    #: When this replica became leader, on its clock (None unless it leads).
    leader_since_ms: int | None = None


@dataclass(frozen=True, slots=True)
class LeaderContact:
    """Follower reads (DESIGN.md §5): the last time this replica held everything its leader
    had committed when the leader sent its message, measured on this replica's clock."""

    term: int
    leader_uuid: str
    #: The leader's commit index in that message; this replica had it committed then.
    commit_index: int
    #: Milliseconds since the message arrived (transit time is not counted).
    age_ms: int


def bootstrap_cmeta(store: CmetaStore, config: RaftConfig) -> None:
    """Writes the first cmeta of a new replica (term 0, no vote, ``config`` committed)."""
    store.save(ConsensusMetadata(current_term=0, voted_for=None, committed_config=config))


class RaftCore:
    """The Raft state machine of one replica (see the module docstring)."""

    def __init__(
        self,
        uuid: str,
        log: RaftLog,
        store: CmetaStore,
        clock: Clock,
        rng: random.Random,
        options: RaftOptions | None = None,
        *,
        last_applied_index: int = 0,
        group_id: str = "",
    ) -> None:
        meta = store.load()
        self.uuid = uuid
        # Names the Raft group (the tablet). It seeds the group's campaign order
        # (``_campaign_key``): the voters' first campaigns after a quiesced leader goes
        # silent, and which of two overlapping pre-elections gives way.
        self._group_id = group_id
        self._log = log
        self._store = store
        self._clock = clock
        self._rng = rng
        self._opts = options or RaftOptions()
        self._term = meta.current_term
        self._voted_for = meta.voted_for  # the vote cast in _term; saved before it is sent
        self._committed_config = meta.committed_config
        self._pending_config = self._pending_from_log()  # appended, not committed, newest
        self._meta_dirty = False  # _term/_voted_for/_committed_config differ from the store
        self._stopped: Exception | None = None  # a cmeta write failed: this core is unusable
        self._effects: list[Effect] = []
        assert last_applied_index <= log.last_op_id().index
        self._commit_index = last_applied_index  # invariant: last_applied <= commit_index
        self._last_applied = last_applied_index
        self._leader: str | None = None
        self._role = self._passive_role()
        self._leader_since_ms: int | None = None
        self._announced: tuple[Role, int, str | None] | None = None
        self._last_leader_contact_ms: int | None = None
        # Follower reads: (term, leader, leader's commit index, time) of the last
        # AppendEntries after which this replica had everything that leader had committed.
        self._caught_up: tuple[int, str, int, int] | None = None
        self._failed_elections = 0
        # A pre-election lost only to voters that still heard the leader was retried soon,
        # once, since a leader was last heard or this replica last led (``_check_election``).
        self._lease_retried = False
        self._election: _Election | None = None
        self._election_deadline_ms = 0
        self._reset_election_timer()
        # Follower side: entries <= _leader_match match the current leader's log.
        self._leader_match = 0
        self._reported_durable = 0
        # Leader side.
        self._progress: dict[str, PeerProgress] = {}
        self._seq = 0
        self._next_heartbeat_ms = 0
        # When idle followers are told the commit index (``RaftOptions.commit_notice_delay_ms``).
        self._commit_notice_ms: int | None = None
        self._own_term_committed = False
        self._transfer: _Transfer | None = None
        self._reads: list[_PendingRead] = []
        # Quiescence (module docstring): no heartbeats (leader) or election timer (others).
        self._quiesced = False
        self._quiesced_since_ms = 0  # when this replica last became quiescent
        self._idle_rounds = 0  # leader: consecutive heartbeat rounds that found nothing to do
        self._announce_role()

    # --- read-only state --------------------------------------------------------------------

    @property
    def options(self) -> RaftOptions:
        """The timing and flow-control limits this replica runs with."""
        return self._opts

    @property
    def role(self) -> Role:
        """This replica's role."""
        return self._role

    @property
    def term(self) -> int:
        """The current term."""
        return self._term

    @property
    def leader_uuid(self) -> str | None:
        """The leader of the current term, if known."""
        return self._leader

    @property
    def commit_index(self) -> int:
        """Highest index known committed."""
        return self._commit_index

    @property
    def last_applied(self) -> int:
        """Highest index handed to the state machine (``Apply``)."""
        return self._last_applied

    @property
    def all_replicated_index(self) -> int:
        """Leader: the highest index every peer has received (Kudu's all-replicated
        watermark); entries up to it need not stay in memory for replication. Other roles:
        the last index, as no peer reads this replica's log."""
        last = self._log.last_op_id().index
        if self._role is not Role.LEADER:
            return last
        return min((p.match_index for p in self._progress.values()), default=last)

    @property
    def active_config(self) -> RaftConfig:
        """The config in use: the pending one if any, else the committed one."""
        return self._pending_config or self._committed_config

    @property
    def committed_config(self) -> RaftConfig:
        """The committed config (the one in cmeta)."""
        return self._committed_config

    @property
    def pending_config(self) -> RaftConfig | None:
        """An appended but uncommitted config, if any."""
        return self._pending_config

    def status(self) -> ReplicaStatus:
        """A snapshot of the state."""
        return ReplicaStatus(
            uuid=self.uuid,
            role=self._role,
            term=self._term,
            leader_uuid=self._leader,
            voted_for=self._voted_for,
            last_op_id=self._log.last_op_id(),
            durable_index=self._log.durable_index(),
            commit_index=self._commit_index,
            last_applied=self._last_applied,
            committed_config=self._committed_config,
            pending_config=self._pending_config,
            transfer_target=self._transfer.target if self._transfer else None,
            quiesced=self._quiesced,
            leader_since_ms=self._leader_since_ms,
        )

    def leader_contact(self) -> LeaderContact | None:
        """When this replica last had all its current leader had committed (follower reads);
        None if never in this term, or if this replica is the leader."""
        caught_up = self._caught_up
        if caught_up is None or self._role is Role.LEADER:
            return None
        term, leader, commit_index, at_ms = caught_up
        if term != self._term or leader != self._leader:
            return None
        return LeaderContact(term, leader, commit_index, self._clock.now_ms() - at_ms)

    @property
    def election_deadline_ms(self) -> int:
        """When the failure detector fires next (meaningless for a leader)."""
        return self._election_deadline_ms

    @property
    def quiesced(self) -> bool:
        """Whether this replica is quiescent (no heartbeats as leader, no election timer)."""
        return self._quiesced

    def next_timer_ms(self) -> int | None:
        """When ``tick`` next has something to do (None: nothing until an input arrives)."""
        if self._stopped is not None:
            return None
        if self._role is Role.LEADER:
            deadlines = [] if self._quiesced else [self._next_heartbeat_ms]
            if self._commit_notice_ms is not None:
                deadlines.append(self._commit_notice_ms)
            if self._transfer is not None:
                deadlines.append(self._transfer.deadline_ms)
            return min(deadlines, default=None)
        return None if self._quiesced else self._election_deadline_ms

    @property
    def failed_elections(self) -> int:
        """Elections lost or timed out since a leader was last heard (drives the back-off)."""
        return self._failed_elections

    def peer_progress(self, uuid: str) -> PeerProgress | None:
        """The leader's replication state for ``uuid`` (None when not leader)."""
        return self._progress.get(uuid)

    def drain_effects(self) -> list[Effect]:
        """The effects produced since the last call, in the order they must be executed.

        After a failed cmeta write nothing is returned: effects queued after the failure may
        depend on state that never became durable. Restart the replica from disk instead.
        """
        if self._stopped is None:
            self._flush_meta()
        out, self._effects = self._effects, []
        return [] if self._stopped is not None else out

    # --- inputs -----------------------------------------------------------------------------

    def tick(self) -> None:
        """Lets timers fire: heartbeats and transfer deadline (leader), elections (others)."""
        self._check_running()
        now = self._clock.now_ms()
        if self._role is Role.LEADER:
            if self._commit_notice_ms is not None and now >= self._commit_notice_ms:
                self._notice_commit()
            if not self._quiesced and now >= self._next_heartbeat_ms:
                self._heartbeat_round(now)
            if self._transfer is not None and now >= self._transfer.deadline_ms:
                self._transfer = None  # give up; writes resume
        elif self._quiesced:
            pass  # the leader's server vouches for it; the runtime wakes us otherwise
        elif now >= self._election_deadline_ms:
            if self._can_campaign():
                if self._election is not None:
                    self._failed_elections += 1
                self._start_pre_election()
            else:
                self._reset_election_timer()
        self._flush_meta()

    def step(self, msg: Message) -> None:
        """Handles one message from another replica."""
        self._check_running()
        if msg.dest != self.uuid:
            raise WrongServerUuidError(f"message for {msg.dest} delivered to {self.uuid}")
        if self._admit_term(msg):
            if self._role is Role.LEADER:
                self._step_leader(msg)
            elif self._role is Role.CANDIDATE:
                self._step_candidate(msg)
            else:
                self._step_follower(msg)
        self._flush_meta()

    def peer_needs_copy(self, uuid: str) -> None:
        """The runtime reports that follower ``uuid`` has no replica to update
        (TABLET_NOT_FOUND: absent, tombstoned or being copied). Leader only; else ignored."""
        self._check_running()
        progress = self._progress.get(uuid)
        if self._role is Role.LEADER and progress is not None:
            progress.last_contact_ms = self._clock.now_ms()
            self._wake()
            progress.reported_last = None  # it has no log to report
            self._need_copy(progress)
        self._flush_meta()

    def wake(self) -> None:
        """Leaves quiescence: a leader heartbeats at its next tick, a follower's election timer
        runs again from the last time its leader was heard or vouched for (the runtime calls
        this when the other server went silent or stopped naming this replica)."""
        self._check_running()
        self._wake()
        self._flush_meta()

    def vouched_by_leader(self, leader: str, term: int, commit_index: int) -> bool:
        """A server heartbeat from ``leader``'s server names its quiesced leadership of this
        tablet at ``term`` with ``commit_index``. A quiesced follower of that leader with that
        commit index counts it as hearing from the leader (vote withholding, follower reads);
        anything else wakes it (after a heartbeat interval of grace, see ``not_vouched``).
        Returns whether this replica stays quiesced."""
        self._check_running()
        now = self._clock.now_ms()
        holds = (
            self._quiesced
            and self._role is not Role.LEADER
            and self._leader == leader
            and self._term == term
            and self._commit_index == commit_index
        )
        if holds:
            self._vouched(leader, now)
        else:
            self._wake_if_settled()
        self._flush_meta()
        return holds

    def vouched_by_peer(self, peer: str, term: int, commit_index: int) -> bool:
        """A server heartbeat from ``peer``'s server names its quiesced replica of this tablet
        following this leader at ``term`` with ``commit_index``: the quiesced leader counts it
        as an answer (peer health, live majority for config changes). Anything else wakes the
        leader (after a heartbeat interval of grace, see ``not_vouched``). Returns whether this
        replica stays quiesced."""
        self._check_running()
        progress = self._progress.get(peer)
        holds = (
            self._quiesced
            and self._role is Role.LEADER
            and progress is not None
            and self._term == term
            and self._commit_index == commit_index
            and progress.match_index == commit_index
        )
        if holds:
            self._vouched(peer, self._clock.now_ms())
        else:
            self._wake_if_settled()
        self._flush_meta()
        return holds

    def vouched_again(self, server: str, now_ms: int) -> bool:
        """``server``'s heartbeat says the same of this tablet as its last one, for which
        ``vouched_by_leader`` or ``vouched_by_peer`` held, and nothing of this replica changed
        since (its server checked both, ``ServerHeartbeats``): the leader (or follower) is
        heard from again at ``now_ms`` (read from this core's clock, once for the many
        replicas a heartbeat names), with what those record. False, recording nothing, if
        this replica is no longer quiesced (the caller then asks the full question)."""
        if not self._quiesced:
            return False
        if self._role is Role.LEADER:
            if server not in self._progress:
                return False
        elif self._leader != server:
            return False
        self._vouched(server, now_ms)
        return True

    def _vouched(self, server: str, now_ms: int) -> None:
        """What a vouch that holds records: a quiesced follower heard from its leader
        (``server``) with everything it had committed; a quiesced leader heard from its
        follower on ``server``."""
        if self._role is Role.LEADER:
            progress = self._progress[server]
            progress.last_ack_ms = progress.last_contact_ms = now_ms
        else:
            self._last_leader_contact_ms = now_ms
            self._lease_retried = False
            self._caught_up = (self._term, server, self._commit_index, now_ms)

    def not_vouched(self) -> None:
        """A server heartbeat that should have named this quiesced replica's leader (or
        follower) did not: it wakes, unless it quiesced within the last heartbeat interval (the
        other server may have spoken before it saw the quiescing heartbeat)."""
        self._check_running()
        self._wake_if_settled()
        self._flush_meta()

    def append_lost(self, uuid: str, term: int, last_index: int) -> None:
        """The runtime reports that an AppendEntries with entries up to ``last_index``, sent to
        follower ``uuid`` in ``term``, will not be answered (its stream broke, the queue to the
        peer was full, the peer refused it). If it was one of the batches in flight, the
        follower is probed again from the oldest unanswered one: at once if a proposal comes,
        else at the next heartbeat round (not here: an unreachable peer would be retried in a
        tight loop). Leader only; else ignored."""
        self._check_running()
        progress = self._progress.get(uuid)
        if self._role is not Role.LEADER or term != self._term or progress is None:
            return
        if progress.inflight and progress.inflight[0][0] <= last_index:
            progress.lost()

    def peer_failed(self, uuid: str, reason: str) -> None:
        """The runtime reports that follower ``uuid`` cannot be caught up by waiting: it
        answered that its replica is FAILED, or it refused the tablet copy it needs. Its health
        is ``FAILED_UNRECOVERABLE`` until it answers with a log. Leader only; else ignored."""
        progress = self._progress.get(uuid)
        if self._role is Role.LEADER and progress is not None:
            progress.last_contact_ms = self._clock.now_ms()
            progress.unrecoverable = reason

    def peer_health(self, failed_after_ms: int) -> dict[str, PeerHealth]:
        """Leader only: the health of every other peer of the active config (empty when not
        leader), for the tablet report to the master; ``failed_after_ms`` is the time without
        any answer after which a peer is ``FAILED``."""
        if self._role is not Role.LEADER:
            return {}
        now = self._clock.now_ms()
        return {u: p.health(now, failed_after_ms) for u, p in sorted(self._progress.items())}

    def on_log_durable(self, index: int) -> None:
        """The runtime reports that the log is durable up to ``index``."""
        self._check_running()
        assert index <= self._log.durable_index()
        if self._role is Role.LEADER:
            self._leader_update_commit()
        elif self._leader is not None:
            self._send_durable_ack()
        self._flush_meta()

    def propose(self, payload: bytes) -> OpId:
        """Appends a WRITE (opaque ``payload``) as leader; ``Apply`` reports its commit."""
        return self.propose_many((payload,))[0]

    def propose_many(self, payloads: Sequence[bytes]) -> list[OpId]:
        """``propose`` for several WRITEs at once: followers get them in one batch, not one
        AppendEntries per proposal (the runtime gathers the proposals of one loop turn)."""
        self._require_leader()
        self._wake()
        if self._transfer is not None:
            raise ServiceUnavailableError(
                f"leadership transfer to {self._transfer.target} in progress; writes paused"
            )
        op_ids = self._log.append_many(
            self._term, EntryKind.WRITE, payloads, self._opts.batch_bytes_max
        )
        self._replicate_all()
        self._flush_meta()
        return op_ids

    def read(self, read_id: int) -> None:
        """Starts a linearizable read (ReadIndex): ``ReadReady`` or ``ReadFailed`` follows."""
        self._require_leader()
        self._wake()
        self._seq += 1
        index = self._commit_index if self._own_term_committed else None
        self._reads.append(_PendingRead(read_id, self._seq, index))
        for progress in self._progress.values():
            self._send_heartbeat(progress)
        self._check_reads()
        self._flush_meta()

    def campaign(self) -> None:
        """Starts an election now, as if the failure detector fired (pre-vote first)."""
        self._check_running()
        if self._role is Role.LEADER:
            return
        self._require_can_campaign()
        self._start_pre_election()
        self._flush_meta()

    def run_leader_election(self) -> None:
        """RunLeaderElection: a real election now, asking voters to ignore a live leader."""
        self._check_running()
        if self._role is Role.LEADER:
            return
        self._require_can_campaign()
        self._start_election(ignore_live_leader=True)
        self._flush_meta()

    def step_down(self) -> None:
        """Abrupt step-down: advance the term, become follower, snooze the failure detector."""
        self._require_leader()
        self._become_follower(self._term + 1, None)
        self._reset_election_timer(snooze_ms=self._opts.step_down_snooze_ms)
        self._flush_meta()

    def transfer_leadership(self, target: str | None = None) -> str:
        """Graceful transfer to ``target`` or the most caught-up VOTER; returns the successor.

        Writes are refused until the transfer ends (successor elected, or the timeout passed).
        """
        self._require_leader()
        self._wake()
        if self._transfer is not None:
            raise IllegalStateError(
                f"a leadership transfer to {self._transfer.target} is already in progress"
            )
        successor = self._choose_successor(target)
        deadline = self._clock.now_ms() + self._opts.transfer_timeout_ms
        self._transfer = _Transfer(successor, deadline)
        self._replicate(self._progress[successor])
        self._check_transfer()
        self._flush_meta()
        return successor

    def change_config(self, change: ConfigChange) -> OpId:
        """ChangeConfig on the leader: validates, appends the new config, returns its OpId."""
        self._require_leader()
        self._wake()
        if self._transfer is not None:
            raise ServiceUnavailableError("leadership transfer in progress")
        if not self._own_term_committed:
            raise ServiceUnavailableError(
                f"leader has not committed an op of term {self._term} yet; retry"
            )
        if self._pending_config is not None:
            raise ServiceUnavailableError(
                f"config change at index {self._pending_config.opid_index} is still pending;"
                " retry once it commits"
            )
        committed_index = self._committed_config.opid_index
        cas = change.cas_config_opid_index
        if cas is not None and cas != committed_index:
            raise CasFailedError(
                f"committed config is at op index {committed_index}, request expected {cas}",
                committed_opid_index=committed_index,
            )
        new = membership.apply_change(self._committed_config, change)
        if not new.is_voter(self.uuid):
            self._step_aside_for(change)
        self._check_voter_change(new)
        op_id = self._append_config(new)
        self._flush_meta()
        return op_id

    def unsafe_change_config(self, voter_uuids: Sequence[str]) -> OpId:
        """UnsafeChangeConfig (DANGEROUS; see ``membership.unsafe_config``): this replica adopts
        a config of only ``voter_uuids`` via a synthetic config entry at term + 1."""
        self._check_running()
        if self.uuid not in voter_uuids:
            raise InvalidArgumentError(f"the unsafe config must include this replica {self.uuid}")
        new = membership.unsafe_config(self._committed_config, voter_uuids)
        self._become_follower(self._term + 1, None)
        index = self._log.last_op_id().index + 1
        config = new.with_opid_index(index)
        op_id = self._log.append(self._term, EntryKind.CONFIG_CHANGE, encode_config(config))
        assert op_id.index == index
        self._pending_config = config
        self._refresh_passive_role()
        self._reset_election_timer()  # a survivor left as the sole voter campaigns at once
        self._flush_meta()
        return op_id

    # --- term handling and role dispatch ------------------------------------------------------

    def _admit_term(self, msg: Message) -> bool:
        """Applies Raft's term rules; returns whether the message is processed further."""
        if msg.term > self._term:
            if isinstance(msg, VoteRequest):
                if msg.pre_election:
                    return True  # a pre-vote never changes the voter's term
                if self._withholds_vote(msg):
                    self._deny_vote(msg, VoteDenial.LEADER_IS_ALIVE)
                    return False
            if isinstance(msg, VoteResponse) and msg.granted:
                return True  # a granted pre-vote echoes the term campaigned for
            leader = msg.src if isinstance(msg, AppendRequest) else None
            self._become_follower(msg.term, leader)
            return True
        if msg.term < self._term:
            if isinstance(msg, AppendRequest):
                self._send(self._append_response(msg, AppendStatus.TERM_TOO_OLD))
            elif isinstance(msg, VoteRequest):
                self._deny_vote(msg, VoteDenial.TERM_TOO_OLD)
            return False
        return True

    def _step_leader(self, msg: Message) -> None:
        match msg:
            case AppendResponse():
                self._on_append_response(msg)
            case VoteRequest():
                if self.active_config.peer(msg.src) is not None:
                    self._wake()  # a member that campaigns is not quiesced: heartbeat it
                self._on_vote_request(msg)
            case AppendRequest():
                raise AssertionError(f"two leaders in term {self._term}: {self.uuid}, {msg.src}")
            case VoteResponse() | TimeoutNow():
                pass  # stale: this replica already won

    def _step_candidate(self, msg: Message) -> None:
        match msg:
            case AppendRequest():
                self._become_follower(msg.term, msg.src)  # someone else won this term
                self._on_append_request(msg)
            case VoteRequest():
                self._on_vote_request(msg)
            case VoteResponse():
                self._on_vote_response(msg)
            case TimeoutNow():
                self._on_timeout_now(msg)
            case AppendResponse():
                pass

    def _step_follower(self, msg: Message) -> None:
        match msg:
            case AppendRequest():
                self._on_append_request(msg)
            case VoteRequest():
                self._on_vote_request(msg)
            case TimeoutNow():
                self._on_timeout_now(msg)
            case VoteResponse() | AppendResponse():
                pass  # answers to a role this replica no longer has

    # --- elections --------------------------------------------------------------------------

    def _on_vote_request(self, req: VoteRequest) -> None:
        denial = self._vote_denial(req)
        if denial is not None:
            self._deny_vote(req, denial)
            return
        if not req.pre_election:
            self._voted_for = req.src
            self._meta_dirty = True
            self._reset_election_timer()
        elif self._role is not Role.LEADER:
            # The pre-candidate granted here campaigns as soon as it has a majority: its vote
            # request follows within a round trip. A pre-election of this replica's own in the
            # meantime would be granted by it if it is still pre-campaigning and ranks behind
            # (``_yields_pre_vote``), both would campaign for the same term, split it, and
            # back off a doubled timeout: with hundreds of groups failing over, some timers
            # always fall that close. So this replica's own campaign waits a heartbeat
            # interval at least (safety does not depend on it; a pre-candidate that never
            # follows up delays it by that much).
            hold_until = self._clock.now_ms() + self._opts.heartbeat_interval_ms
            self._election_deadline_ms = max(self._election_deadline_ms, hold_until)
        self._send(VoteResponse(self.uuid, req.src, req.term, True, req.pre_election))

    def _vote_denial(self, req: VoteRequest) -> VoteDenial | None:
        # No check of our own member type: a candidate only asks the VOTERs of its config and
        # only counts those, and a replica that has not yet seen its promotion must still be
        # able to vote, or a leader lost right after promoting it leaves no electable majority.
        if self._withholds_vote(req):
            return VoteDenial.LEADER_IS_ALIVE
        if req.term == self._term and self._voted_for not in (None, req.src):
            return VoteDenial.ALREADY_VOTED
        if req.last_op_id < self._log.last_op_id():
            return VoteDenial.LAST_OPID_TOO_OLD
        if self._yields_pre_vote(req):
            return VoteDenial.ALREADY_VOTED
        return None

    def _yields_pre_vote(self, req: VoteRequest) -> bool:
        """Two pre-elections for the same term that overlap would each be granted by the
        other, and both candidates would then split the term's vote and back off a whole
        timeout (under load, with hundreds of tablets failing over at once, their messages
        overlap often). So a pre-candidate refuses the pre-vote of a peer that ranks behind
        it in this group's order (``_campaign_key``) when that peer's log is no newer than
        its own; the peer grants this one's pre-vote, and this one goes on to win the
        term. Only a pre-election that may still win holds another back: not one that a
        voter refused already (typically a follower that heard the old leader later than
        this one did, whose own timer then fires a little later), and not against a newer
        log."""
        election = self._election
        return (
            req.pre_election
            and election is not None
            and election.pre
            and not election.denied
            and req.term == election.term
            and req.last_op_id == self._log.last_op_id()
            and self._campaign_key(self.uuid) < self._campaign_key(req.src)
        )

    def _withholds_vote(self, req: VoteRequest) -> bool:
        if req.ignore_live_leader:
            return False
        if self._role is Role.LEADER:
            return True
        heard = self._last_leader_contact_ms
        return heard is not None and (
            self._clock.now_ms() - heard < self._opts.election_timeout_min_ms
        )

    def _deny_vote(self, req: VoteRequest, denial: VoteDenial) -> None:
        self._send(VoteResponse(self.uuid, req.src, self._term, False, req.pre_election, denial))

    def _on_vote_response(self, resp: VoteResponse) -> None:
        election = self._election
        if election is None or resp.pre_election != election.pre:
            return
        if resp.granted:
            if resp.term == election.term:
                election.granted.add(resp.src)
        else:
            election.denied.add(resp.src)
            election.denied_otherwise |= resp.denial is not VoteDenial.LEADER_IS_ALIVE
        self._check_election()

    def _on_timeout_now(self, msg: TimeoutNow) -> None:
        if self._can_campaign():
            self._start_election(ignore_live_leader=True)

    def _start_pre_election(self) -> None:
        self._quiesced = False
        self._election = _Election(term=self._term + 1, pre=True, granted={self.uuid})
        self._set_role(Role.CANDIDATE, None)
        self._reset_election_timer()
        self._request_votes(pre=True, ignore_live_leader=False)
        self._check_election()

    def _start_election(self, *, ignore_live_leader: bool) -> None:
        self._quiesced = False
        self._term += 1
        self._voted_for = self.uuid
        self._meta_dirty = True
        self._election = _Election(term=self._term, pre=False, granted={self.uuid})
        self._leader_match = 0
        self._set_role(Role.CANDIDATE, None)
        self._reset_election_timer()
        self._request_votes(pre=False, ignore_live_leader=ignore_live_leader)
        self._check_election()

    def _request_votes(self, *, pre: bool, ignore_live_leader: bool) -> None:
        assert self._election is not None
        last = self._log.last_op_id()
        for voter in self.active_config.voters():
            if voter != self.uuid:
                self._send(
                    VoteRequest(
                        self.uuid, voter, self._election.term, last, pre, ignore_live_leader
                    )
                )

    def _check_election(self) -> None:
        election = self._election
        assert election is not None
        config = self.active_config
        voters = set(config.voters())
        if len(election.granted & voters) >= config.majority():
            if election.pre:
                self._start_election(ignore_live_leader=False)
            else:
                self._become_leader()
        elif len(election.denied & voters) >= config.majority():
            self._election = None
            self._set_role(self._passive_role(), None)
            if election.pre and not election.denied_otherwise and not self._lease_retried:
                # The voters still heard the leader: each heard it last a little later than
                # this replica did (this one waited the minimum timeout since its own last
                # contact), by at most about a heartbeat interval (the leader's last
                # heartbeats, or its server's, reached the followers at different moments).
                # Backing off a doubled timeout would cost a failover a whole extra timeout
                # (with vote requests on the peer streams they arrive within milliseconds,
                # before such a voter's own minimum has passed); one retry after a heartbeat
                # interval finds the lease over if the leader is gone. Only once: a replica
                # cut off from a leader its peers still hear backs off as usual.
                self._lease_retried = True
                slot_ms = self._opts.election_jitter_range_ms
                snooze = self._opts.heartbeat_interval_ms + self._rng.uniform(0, slot_ms / 2)
                self._reset_election_timer(snooze_ms=int(snooze))
            else:
                self._failed_elections += 1
                self._reset_election_timer()

    def _can_campaign(self) -> bool:
        # A VOTER of the committed config may campaign even if an uncommitted config demotes
        # it: it may hold the only copy of that entry (the leader lost its non-durable tail),
        # and without it no candidate could win. Votes are still counted in the newest config.
        me = self.uuid
        return self.active_config.is_voter(me) or self._committed_config.is_voter(me)

    def _election_timeout_ms(self) -> int:
        base = self._opts.election_timeout_base_ms
        cap = max(base, self._opts.election_backoff_max_ms)
        backoff = min(base * (2 ** min(self._failed_elections, 20)), cap)
        jitter = self._opts.election_jitter_fraction
        return int(backoff * self._rng.uniform(1.0 - jitter, 1.0 + jitter))

    def _sole_voter(self) -> bool:
        """Whether this replica is the only VOTER of its newest config (it needs no votes)."""
        return self.active_config.voters() == (self.uuid,)

    def _reset_election_timer(self, *, snooze_ms: int | None = None) -> None:
        # A sole voter elects itself at once (Kudu: the initial single-node election): its
        # election needs nobody else, so waiting out a failure detector only delays writes.
        if snooze_ms is not None:
            delay = snooze_ms
        elif self._sole_voter():
            delay = 0
        else:
            delay = self._election_timeout_ms()
        self._election_deadline_ms = self._clock.now_ms() + delay

    # --- role transitions -------------------------------------------------------------------

    def _become_follower(self, term: int, leader: str | None) -> None:
        assert term >= self._term
        if term > self._term:
            self._term = term
            self._voted_for = None
            self._meta_dirty = True
        if self._role is Role.LEADER:
            self._stop_leading()
        self._quiesced = False
        if leader != self._leader or self._election is not None:
            self._leader_match = 0
            self._reported_durable = 0
        self._election = None
        self._set_role(self._passive_role(), leader)
        self._reset_election_timer()

    def _become_leader(self) -> None:
        self._quiesced = False
        self._idle_rounds = 0
        self._election = None
        self._failed_elections = 0
        self._lease_retried = False
        self._own_term_committed = False
        self._transfer = None
        self._commit_notice_ms = None
        self._progress = {}
        self._seq = 0
        self._set_role(Role.LEADER, self.uuid)
        self._sync_progress()
        self._log.append(self._term, EntryKind.NO_OP, b"")
        self._next_heartbeat_ms = self._clock.now_ms() + self._opts.heartbeat_interval_ms
        self._replicate_all()
        self._leader_update_commit()

    def _stop_leading(self) -> None:
        for read in self._reads:
            self._effects.append(ReadFailed(read.read_id, "NOT_THE_LEADER"))
        self._reads = []
        self._progress = {}
        self._transfer = None
        self._commit_notice_ms = None
        self._own_term_committed = False

    def _passive_role(self) -> Role:
        me = self.active_config.peer(self.uuid)
        if me is None:
            return Role.NON_PARTICIPANT
        return Role.FOLLOWER if me.is_voter else Role.LEARNER

    def _refresh_passive_role(self) -> None:
        if self._role not in (Role.LEADER, Role.CANDIDATE):
            self._set_role(self._passive_role(), self._leader)

    def _set_role(self, role: Role, leader: str | None) -> None:
        if role is not Role.LEADER:
            self._leader_since_ms = None
        elif self._role is not Role.LEADER:
            self._leader_since_ms = self._clock.now_ms()
        self._role = role
        self._leader = leader
        self._announce_role()

    def _announce_role(self) -> None:
        now = (self._role, self._term, self._leader)
        if now != self._announced:
            self._announced = now
            self._effects.append(RoleChanged(*now))

    # --- follower: UpdateConsensus ------------------------------------------------------------

    def _on_append_request(self, req: AppendRequest) -> None:
        if self._leader != req.src:
            self._leader_match = 0
            self._reported_durable = 0
            self._set_role(self._role, req.src)
        contact_ms = self._heard_from_leader()
        result = self._log.append_replicated(req.preceding, req.entries, self._commit_index)
        if result.truncated_from is not None:
            self._on_truncated(result.truncated_from)
        if not result.matched:
            self._quiesced = False
            self._send(self._append_response(req, AppendStatus.LOG_MISMATCH, result.hint_index))
            return
        if req.entries is not None:
            self._adopt_config_entries(req.entries.config_entries(), result.last_received.index)
        self._matched_through(result.last_received, req.src, req.committed_index, contact_ms)
        quiesced = req.quiesce and self._has_everything(req.committed_index)
        if quiesced and not self._quiesced:
            self._quiesced_since_ms = contact_ms
        self._quiesced = quiesced
        durable = self._note_durable()
        self._send(
            AppendResponse(
                self.uuid,
                req.src,
                self._term,
                AppendStatus.OK,
                result.last_received,
                durable,
                seq=req.seq,
            )
        )

    def follows(self, term: int, leader: str) -> bool:
        """Whether this replica follows ``leader`` in ``term`` (a follower or a learner of
        that term that knows it as its leader): an AppendEntries from it in that term is
        handled by ``_on_append_request`` alone."""
        return (
            self._term == term
            and self._leader == leader
            and (self._role is Role.FOLLOWER or self._role is Role.LEARNER)
        )

    def appended_from_leader(self, last_received: OpId, committed_index: int) -> None:
        """The runtime appended an AppendEntries of the leader this replica ``follows``
        itself (``RaftRuntime.follow_leader``): its entries, none a config change, came
        right after the log's last entry, and their answer went to the log to write once
        they are durable. Does what ``_on_append_request`` does after such an append, the
        answer apart."""
        self._check_running()
        leader = self._leader
        assert leader is not None, "a replica that follows knows its leader"
        contact_ms = self._heard_from_leader()
        self._matched_through(last_received, leader, committed_index, contact_ms)
        self._quiesced = False  # the request did not ask for it
        self._note_durable()
        self._flush_meta()

    def _heard_from_leader(self) -> int:
        """The current leader was heard from now (returned): no election for a while."""
        contact_ms = self._last_leader_contact_ms = self._clock.now_ms()
        self._failed_elections = 0
        self._lease_retried = False
        self._reset_election_timer()
        return contact_ms

    def _matched_through(
        self, last_received: OpId, leader: str, committed_index: int, contact_ms: int
    ) -> None:
        """The log matches ``leader``'s through ``last_received``, whose commit index is
        ``committed_index``: commits what both say is committed."""
        self._leader_match = max(self._leader_match, last_received.index)
        self._advance_commit(min(committed_index, last_received.index))
        if self._commit_index >= committed_index:
            self._caught_up = (self._term, leader, committed_index, contact_ms)

    def _note_durable(self) -> int:
        """What this replica can tell its leader is durable now, noted as told."""
        durable = min(self._log.durable_index(), self._leader_match)
        self._reported_durable = max(self._reported_durable, durable)
        return durable

    def _has_everything(self, leader_commit_index: int) -> bool:
        """Follower: the log matches the leader's through its end, which is committed here up
        to the leader's commit index (what a quiescing leader's last heartbeat asks)."""
        last = self._log.last_op_id().index
        return self._leader_match == last == self._commit_index == leader_commit_index

    def _append_response(
        self, req: AppendRequest, status: AppendStatus, hint_index: int = 0
    ) -> AppendResponse:
        # A mismatch reports this log's last entry (the leader hands it to a tablet copy).
        last = self._log.last_op_id() if status is AppendStatus.LOG_MISMATCH else MIN_OP_ID
        return AppendResponse(
            self.uuid, req.src, self._term, status, last, 0, hint_index, seq=req.seq
        )

    def _on_truncated(self, from_index: int) -> None:
        self._effects.append(LogTruncated(from_index))
        self._leader_match = min(self._leader_match, from_index - 1)
        self._reported_durable = min(self._reported_durable, from_index - 1)
        pending = self._pending_config
        if pending is not None and pending.opid_index >= from_index:
            self._pending_config = None  # back to the committed config
            self._refresh_passive_role()

    def _adopt_config_entries(self, entries: Sequence[tuple[OpId, bytes]], up_to: int) -> None:
        for op_id, payload in entries:
            if self._committed_config.opid_index < op_id.index <= up_to:
                config = decode_config(payload)
                assert config.opid_index == op_id.index, (config.opid_index, op_id)
                self._pending_config = config
        self._refresh_passive_role()

    def _send_durable_ack(self) -> None:
        durable = min(self._log.durable_index(), self._leader_match)
        if durable <= self._reported_durable or self._leader is None:
            return
        self._reported_durable = durable
        term_at = self._log.term_at(self._leader_match)
        assert term_at is not None
        last = OpId(term_at, self._leader_match)
        self._send(
            AppendResponse(self.uuid, self._leader, self._term, AppendStatus.OK, last, durable)
        )

    # --- commit and apply -------------------------------------------------------------------

    def _advance_commit(self, index: int) -> None:
        if index <= self._commit_index:
            return
        assert index <= self._log.last_op_id().index
        self._commit_index = index
        pending = self._pending_config
        if pending is not None and pending.opid_index <= index:
            self._committed_config = pending
            self._pending_config = None
            self._meta_dirty = True
            self._effects.append(ConfigCommitted(pending))
        self._effects.append(Apply(self._last_applied + 1, index))
        self._last_applied = index

    def _leader_update_commit(self) -> None:
        config = self.active_config
        durable = sorted((self._durable_index_of(voter) for voter in config.voters()), reverse=True)
        candidate = durable[config.majority() - 1]
        if candidate <= self._commit_index or self._log.term_at(candidate) != self._term:
            return  # Raft: only entries of the leader's own term commit by counting
        self._advance_commit(candidate)
        self._own_term_committed = True
        for read in self._reads:
            if read.index is None:
                read.index = self._commit_index
        self._check_reads()
        notice_delay_ms = self._opts.commit_notice_delay_ms
        for progress in self._progress.values():
            if not progress.inflight:
                if not notice_delay_ms:
                    self._send_heartbeat(progress)  # tell followers the new commit index now
                elif self._commit_notice_ms is None:
                    self._commit_notice_ms = self._clock.now_ms() + notice_delay_ms
            self._maybe_promote(progress)
        committed = self._committed_config
        if not committed.is_voter(self.uuid) and committed.voters() and self._transfer is None:
            self.transfer_leadership()  # a leader outside its committed config hands over

    def _notice_commit(self) -> None:
        """Tells each idle follower the commit index, unless a batch sent since did. A follower
        with a batch in flight is left out, as it is when the notice goes at once: it hears
        the commit index from the next batch, or from the next heartbeat round."""
        self._commit_notice_ms = None
        for progress in self._progress.values():
            told = min(self._commit_index, progress.match_index)
            if not progress.inflight and progress.commit_sent < told:
                self._send_heartbeat(progress)

    def awaits_own_durability(self) -> bool:
        """Leader: whether its commit index waits for its own log to become durable (it would
        move, were the log durable through its last entry). Otherwise its syncs change
        nothing until a follower answers, and that answer's step reads the log's durable
        index itself: the runtime need not be told of each sync. Any other role: False."""
        if self._role is not Role.LEADER:
            return False
        last = self._log.last_op_id().index
        durable = self._log.durable_index()
        if durable >= last or last <= self._commit_index:
            return False
        config = self.active_config
        if not config.is_voter(self.uuid):
            return False  # its own log does not count
        others = sorted(
            (self._durable_index_of(voter) for voter in config.voters() if voter != self.uuid),
            reverse=True,
        )
        # The majority-th highest durable index, counting this log at its last entry: the
        # others' (majority - 1)-th highest, or its own last if that is lower.
        needed = config.majority() - 1
        reached = last if needed == 0 else min(last, others[needed - 1]) if others else 0
        return reached > max(durable, self._commit_index)

    def _durable_index_of(self, uuid: str) -> int:
        if uuid == self.uuid:
            return self._log.durable_index()
        progress = self._progress.get(uuid)
        return progress.durable_index if progress else 0

    # --- leader: replication ----------------------------------------------------------------

    def _on_append_response(self, resp: AppendResponse) -> None:
        progress = self._progress.get(resp.src)
        if progress is None:
            return  # no longer a member
        progress.last_ack_ms = progress.last_contact_ms = self._clock.now_ms()
        progress.unrecoverable = None  # it answers with a log: its replica runs
        progress.acked_seq = max(progress.acked_seq, resp.seq)
        progress.copy_needed = False  # it answered with a log: a copy, if any, is over
        last = self._log.last_op_id().index
        if resp.status is not AppendStatus.OK or resp.last_received.index < last:
            self._wake()
        progress.reported_last = None
        if resp.status is AppendStatus.LOG_MISMATCH:
            progress.reported_last = resp.last_received
            progress.mismatched(resp.hint_index)
        elif resp.status is AppendStatus.OK:
            progress.acked(resp.last_received.index, resp.durable_index)
        self._replicate(progress)
        self._leader_update_commit()
        self._check_reads()
        self._check_transfer()
        self._maybe_promote(progress)

    def _replicate_all(self) -> None:
        for progress in self._progress.values():
            self._replicate(progress)

    def _replicate(self, progress: PeerProgress) -> bool:
        """Sends batches to one follower while its window allows; returns whether any went."""
        sent = False
        now = self._clock.now_ms()
        if progress.copy_needed:
            return False  # no updates while it copies; the heartbeat round probes it
        while not (progress.probing and progress.inflight):
            if progress.inflight_bytes >= self._opts.peer_inflight_bytes_max:
                break
            if len(progress.inflight) >= self._opts.peer_inflight_batches_max:
                break  # what is proposed meanwhile goes out in one batch with the next answer
            after = progress.next_index - 1
            preceding_term = self._log.term_at(after)
            # GC removes a prefix, so entry ``after`` present means ``after + 1`` is too, except
            # at 0, whose term is always known.
            if preceding_term is None or (after == 0 and self._first_entry_gone()):
                self._need_copy(progress)  # what it needs was GC'd: only a copy helps
                return sent
            try:
                batch = self._log.read_batch(after, self._opts.batch_bytes_max)
            except NotFoundError:
                # GC runs beside the core: it may take ``after + 1`` between the two calls.
                self._need_copy(progress)
                return sent
            if batch is None and not (progress.probing and after > progress.match_index):
                break  # caught up; an unconfirmed position is probed even with nothing new
            self._send(
                AppendRequest(
                    self.uuid,
                    progress.uuid,
                    self._term,
                    OpId(preceding_term, after),
                    batch,
                    self._commit_index,
                    self._seq,
                )
            )
            progress.commit_sent = max(progress.commit_sent, self._commit_index)
            if batch is None:
                progress.sent(after, 0, now)
                return True
            progress.sent(batch.last_op_id.index, batch.size_bytes, now)
            sent = True
        return sent

    def _send_heartbeat(self, progress: PeerProgress, *, quiesce: bool = False) -> None:
        """An empty AppendEntries at the known match point: never a spurious mismatch."""
        if progress.copy_needed:
            return  # probed by the heartbeat round only
        match_term = self._log.term_at(progress.match_index)
        if match_term is None:
            self._need_copy(progress)  # its match point was GC'd
            return
        preceding = OpId(match_term, progress.match_index)
        committed = min(self._commit_index, progress.match_index)
        progress.commit_sent = max(progress.commit_sent, committed)
        self._send(
            AppendRequest(
                self.uuid,
                progress.uuid,
                self._term,
                preceding,
                None,
                committed,
                self._seq,
                quiesce,
            )
        )

    def _first_entry_gone(self) -> bool:
        return self._log.last_op_id().index > 0 and self._log.term_at(1) is None

    def _need_copy(self, progress: PeerProgress) -> None:
        """Puts ``progress`` in copy mode: what it held is forgotten (a copied replica has
        another log) and the runtime is asked to start a tablet copy on it."""
        if not progress.copy_needed:
            progress.start_copy(self._log.last_op_id().index + 1)
            self._effects.append(StartTabletCopy(progress.uuid, self._term, progress.reported_last))

    def _probe_copying(self, progress: PeerProgress) -> None:
        """Once per heartbeat interval: ask again for the copy (the target answers
        ALREADY_INPROGRESS while it runs) and probe at the leader's last entry. Once the copy is
        done the follower answers with a log (LOG_MISMATCH with its position, or OK), which
        ends copy mode; while it copies, the probe fails with TABLET_NOT_FOUND."""
        self._effects.append(StartTabletCopy(progress.uuid, self._term, progress.reported_last))
        preceding = self._log.last_op_id()
        self._send(
            AppendRequest(self.uuid, progress.uuid, self._term, preceding, None, 0, self._seq)
        )

    def _heartbeat_round(self, now: int) -> None:
        self._next_heartbeat_ms = now + self._opts.heartbeat_interval_ms
        rounds_max = self._opts.quiesce_after_idle_heartbeats
        self._idle_rounds = self._idle_rounds + 1 if self._quiescable(now) else 0
        if rounds_max and self._idle_rounds >= rounds_max:
            for progress in self._progress.values():
                self._send_heartbeat(progress, quiesce=True)
            self._quiesced = True
            self._quiesced_since_ms = now
            return
        resend_after_ms = self._opts.unanswered_resend_after_ms or self._opts.heartbeat_interval_ms
        for progress in self._progress.values():
            if progress.copy_needed:
                self._probe_copying(progress)
                continue
            oldest = progress.oldest_inflight_ms()
            if oldest is not None and now - oldest >= resend_after_ms:
                progress.lost()
            if not self._replicate(progress):
                self._send_heartbeat(progress)

    def _quiescable(self, now: int) -> bool:
        """Leader: nothing to replicate, commit, confirm or change, and every follower has
        everything and answered within the minimum election timeout."""
        last = self._log.last_op_id().index
        if not (
            self._own_term_committed
            and self._transfer is None
            and not self._reads
            and self._pending_config is None
            and self._commit_index == last == self._log.durable_index()
        ):
            return False
        recent_ms = self._opts.election_timeout_min_ms
        return all(
            p.match_index == p.durable_index == last
            and not p.inflight
            and not p.copy_needed
            and p.unrecoverable is None
            and p.last_ack_ms is not None
            and now - p.last_ack_ms < recent_ms
            for p in self._progress.values()
        )

    def _wake_if_settled(self) -> None:
        """``_wake`` unless quiescence began less than a heartbeat interval ago."""
        settled_ms = self._quiesced_since_ms + self._opts.heartbeat_interval_ms
        if self._clock.now_ms() >= settled_ms:
            self._wake()

    def _wake(self) -> None:
        """Leaves quiescence (see ``wake``)."""
        self._idle_rounds = 0
        if not self._quiesced:
            return
        self._quiesced = False
        if self._role is Role.LEADER:
            self._next_heartbeat_ms = self._clock.now_ms()
            return
        # Every follower of a silent leader wakes at about the same moment, and a server's
        # silence wakes all its tablets at once: each survivor then runs hundreds of
        # elections, and its messages wait behind them. Two followers whose random timeouts
        # fell closer than that wait both pass pre-vote and split the vote, and the retry
        # backs off a whole timeout. So the first campaigns go in a rank order (one slot of
        # the jitter range apart), which differs between groups so that leaders spread over
        # the survivors. A later rank campaigns only if the earlier ones did not win in time;
        # after a failed election the usual random timeouts apply.
        now = self._clock.now_ms()
        heard = self._last_leader_contact_ms
        slot_ms = self._opts.election_jitter_range_ms
        delay = self._campaign_rank() * slot_ms + self._rng.uniform(0, slot_ms / 2)
        deadline = (now if heard is None else heard) + self._opts.election_timeout_min_ms
        self._election_deadline_ms = int(max(deadline, now) + delay)

    def _campaign_rank(self) -> int:
        """This replica's place among the voters that may replace its silent leader, in the
        group's campaign order (0 for a replica that is not a voter)."""
        voters = [v for v in self.active_config.voters() if v != self._leader]
        if self.uuid not in voters:
            return 0
        voters.sort(key=self._campaign_key)
        return voters.index(self.uuid)

    def _campaign_key(self, uuid: str) -> tuple[int, str]:
        """Orders replicas of this group for campaigning (the first is ahead); the order
        differs between groups."""
        return zlib.crc32(f"{self._group_id}/{uuid}".encode()), uuid

    def _sync_progress(self) -> None:
        """Tracks exactly the peers of the active config (a removed peer gets nothing more)."""
        members = {p.uuid for p in self.active_config.peers if p.uuid != self.uuid}
        for uuid in list(self._progress):
            if uuid not in members:
                del self._progress[uuid]
        next_index = self._log.last_op_id().index + 1
        for uuid in sorted(members - self._progress.keys()):
            self._progress[uuid] = PeerProgress(
                uuid=uuid, next_index=next_index, tracked_since_ms=self._clock.now_ms()
            )

    # --- leader: reads and transfer ---------------------------------------------------------

    def _check_reads(self) -> None:
        if not self._reads:
            return
        config = self.active_config
        acked = sorted(
            (
                self._seq if voter == self.uuid else self._acked_seq_of(voter)
                for voter in config.voters()
            ),
            reverse=True,
        )
        confirmed_seq = acked[config.majority() - 1]
        waiting = []
        for read in self._reads:
            if (
                read.seq <= confirmed_seq
                and read.index is not None
                and read.index <= self._last_applied
            ):
                self._effects.append(ReadReady(read.read_id, read.index))
            else:
                waiting.append(read)
        self._reads = waiting

    def _acked_seq_of(self, uuid: str) -> int:
        progress = self._progress.get(uuid)
        return progress.acked_seq if progress else 0

    def _choose_successor(self, target: str | None) -> str:
        config = self.active_config
        if target is not None:
            peer = config.peer(target)
            if peer is None:
                raise NotFoundError(f"transfer target {target} is not in the config")
            if target == self.uuid:
                raise InvalidArgumentError(f"{target} is already the leader")
            if not peer.is_voter:
                raise InvalidArgumentError(f"transfer target {target} is a NON_VOTER")
            return target
        voters = [v for v in config.voters() if v != self.uuid]
        if not voters:
            raise IllegalStateError("no other VOTER to transfer leadership to")
        # max() keeps the first of equals: ties go to the smallest uuid, deterministically.
        return max(sorted(voters), key=lambda v: self._progress[v].match_index)

    def _check_transfer(self) -> None:
        transfer = self._transfer
        if transfer is None or transfer.nudged:
            return
        progress = self._progress.get(transfer.target)
        if progress is not None and progress.match_index == self._log.last_op_id().index:
            transfer.nudged = True
            self._send(TimeoutNow(self.uuid, transfer.target, self._term))

    # --- membership -------------------------------------------------------------------------

    def _step_aside_for(self, change: ConfigChange) -> None:
        """The leader cannot remove or demote itself: it hands leadership over instead."""
        if self._transfer is None:
            self.transfer_leadership()
        raise NotLeaderError(
            f"{self.uuid} is stepping down to let {change.change_type.value} of itself proceed;"
            " retry at the new leader"
        )

    def _check_voter_change(self, new: RaftConfig) -> None:
        if not membership.voters_changed(self._committed_config, new):
            return
        now = self._clock.now_ms()
        live = {self.uuid}
        for uuid, progress in self._progress.items():
            # A follower not heard from in this term yet counts from when the leader began to
            # track it: its health is UNKNOWN, not FAILED, until the failure timeout passes
            # (Kudu's leader starts a newly tracked peer's last communication at that moment).
            heard = progress.last_ack_ms
            since = progress.tracked_since_ms if heard is None else heard
            if now - since < self._opts.failed_follower_timeout_ms:
                live.add(uuid)
        if not membership.keeps_live_majority(new, live):
            raise IllegalStateError(
                f"the new config's VOTERs {list(new.voters())} would have only "
                f"{sorted(live & set(new.voters()))} live: no majority could commit"
            )

    def _append_config(self, new: RaftConfig) -> OpId:
        index = self._log.last_op_id().index + 1
        config = new.with_opid_index(index)
        op_id = self._log.append(self._term, EntryKind.CONFIG_CHANGE, encode_config(config))
        assert op_id.index == index
        self._pending_config = config
        self._sync_progress()
        self._replicate_all()
        return op_id

    def _maybe_promote(self, progress: PeerProgress) -> None:
        """Promotes a caught-up NON_VOTER with ``promote`` (one batch behind the commit index,
        answered in this term)."""
        if self._role is not Role.LEADER or self._pending_config is not None:
            return
        if not self._own_term_committed or self._transfer is not None:
            return
        peer = self.active_config.peer(progress.uuid)
        if peer is None or peer.is_voter or not peer.promote or progress.last_ack_ms is None:
            return
        try:
            batch = self._log.read_batch(progress.match_index, self._opts.batch_bytes_max)
        except NotFoundError:
            return  # what follows its match point was GC'd: far from caught up
        if batch is not None and batch.last_op_id.index < self._commit_index:
            return
        promoted = replace(peer, member_type=MemberType.VOTER, promote=False)
        config = self._committed_config
        new = replace(
            config, peers=tuple(promoted if p.uuid == peer.uuid else p for p in config.peers)
        )
        self._append_config(new)

    def _pending_from_log(self) -> RaftConfig | None:
        entries = self._log.config_entries_after(self._committed_config.opid_index)
        if not entries:
            return None
        op_id, payload = entries[-1]
        config = decode_config(payload)
        assert config.opid_index == op_id.index
        return config

    # --- helpers ----------------------------------------------------------------------------

    def storage_failed(self, error: Exception) -> None:
        """A cmeta write the runtime made for this core failed: memory is ahead of disk, so
        the core refuses every input from now on (as when its own ``save`` raises)."""
        if self._stopped is None:
            self._stopped = error

    def _check_running(self) -> None:
        if self._stopped is not None:
            raise IllegalStateError(
                f"replica {self.uuid} stopped after a consensus metadata write failed: "
                f"{self._stopped}; restart it from disk"
            )

    def _require_leader(self) -> None:
        self._check_running()
        if self._role is not Role.LEADER:
            leader = self._leader
            peer = self.active_config.peer(leader) if leader else None
            raise NotLeaderError(
                f"{self.uuid} is not the leader (role {self._role.value}, term {self._term})",
                leader_uuid=leader,
                leader_addr=peer.address if peer else None,
            )

    def _require_can_campaign(self) -> None:
        if not self._can_campaign():
            raise IllegalStateError(f"{self.uuid} is not a VOTER of its config")

    def _send(self, msg: Message) -> None:
        self._flush_meta()  # persist term/vote before anything that depends on them leaves
        self._effects.append(Send(msg))

    def _flush_meta(self) -> None:
        if self._meta_dirty:
            self._check_running()
            meta = ConsensusMetadata(self._term, self._voted_for, self._committed_config)
            try:
                self._store.save(meta)
            except Exception as e:
                self._stopped = e  # memory is ahead of disk now; never act on it
                raise
            self._meta_dirty = False
