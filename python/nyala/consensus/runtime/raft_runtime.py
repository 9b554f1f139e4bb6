"""``RaftRuntime``: the asyncio driver of one ``RaftCore``.

It owns the I/O the sans-I/O core leaves out, and nothing of Raft's rules: it ticks the core
when the core's next deadline comes (``RaftCore.next_timer_ms``: a leader's next heartbeat, a
follower's election deadline; none at all while the replica is quiesced, so an idle tablet
costs no wake-ups), feeds it inbound messages from a ``Transport``, reports log durability
(``watch_durability``: the WAL's eventfd, one per server), executes the core's effects in order,
and turns ``Apply``/``LogTruncated``/``RoleChanged``/``ReadReady`` into the outcome of
awaited proposals and reads. It runs as one task of a ``TaskGroup`` its owner gives it and
ends by cancellation (STYLE.md 15).

Consensus metadata (term, vote, committed config) is written off the event loop: the core's
``save`` only records the state (``_DeferredCmetaStore``), a thread of a small shared pool
makes it durable (write, fsync, rename, fsync of the directory), and every effect the core
produced meanwhile is held until then. So nothing that depends on a term or vote (a vote, a
vote request, a leader's first AppendEntries, an acknowledged config) leaves before it is
durable, as the core requires, while the loop goes on serving every other replica: a
failover of hundreds of tablets used to spend a seventh of each survivor's loop in these
fsyncs, one election after another.

Per-proposal work is kept to a future and a deque entry: the proposals of one event-loop turn
go to the core in one ``propose_many`` call (so followers get one AppendEntries for all of
them), the effects are drained and executed once (``_pump`` is scheduled at most once per
turn), and proposals resolve in index order from one pass over ``Apply`` ranges.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import random
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from nyala.common.clock import Clock
from nyala.consensus import liveness
from nyala.consensus.core import RaftCore, ReplicaStatus
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
from nyala.consensus.messages import Message
from nyala.consensus.metadata import CmetaStore, ConsensusMetadata
from nyala.consensus.options import RaftOptions
from nyala.consensus.progress import PeerHealth
from nyala.consensus.runtime.transport import Transport
from nyala.consensus.types import OpId, RaftConfig, Role
from nyala.errors import (
    AbortedError,
    IllegalStateError,
    NotLeaderError,
    ServiceUnavailableError,
    WrongServerUuidError,
)

log = logging.getLogger(__name__)

# Roles that follow a leader: their answers may go from the log's committer.
_FOLLOWING = (Role.FOLLOWER, Role.LEARNER)


class DurabilityNotifier(Protocol):
    """What the runtime needs from a log whose appends become durable asynchronously."""

    def watch_durability(
        self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]
    ) -> Callable[[], None]:
        """Calls ``callback`` from ``loop`` when the durable point may have moved or the log
        failed; returns what stops it."""
        ...

    def drain_notifications(self) -> None:
        """Clears the pending signal (the callback calls it before it looks)."""
        ...

    def failure(self) -> BaseException | None:
        """The error the log failed with, or None (a failed log never becomes durable)."""
        ...


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    """Settings of the driver itself (Raft's own timing lives in ``RaftOptions``)."""

    # A tick may come up to this late: deadlines are rounded up to a multiple of it, so the
    # timers of the many replicas of a server that fall due together fire in one loop turn.
    timer_slack_ms: int = 10

    def __post_init__(self) -> None:
        assert self.timer_slack_ms > 0


#: Threads that write consensus metadata, shared by every replica of the process: a failover
#: of hundreds of tablets makes their fsyncs overlap without a thread per replica.
CMETA_WRITE_THREADS = 8
_cmeta_pool: concurrent.futures.ThreadPoolExecutor | None = None
_cmeta_pool_lock = threading.Lock()


def _cmeta_writer() -> concurrent.futures.ThreadPoolExecutor:
    global _cmeta_pool
    with _cmeta_pool_lock:
        if _cmeta_pool is None:
            _cmeta_pool = concurrent.futures.ThreadPoolExecutor(
                CMETA_WRITE_THREADS, thread_name_prefix="cmeta-write"
            )
        return _cmeta_pool


class _DeferredCmetaStore:
    """The store the core sees: ``save`` records the state for the runtime to write (off the
    event loop) before it executes anything the core produced since."""

    def __init__(self, inner: CmetaStore) -> None:
        self.inner = inner
        self.pending: ConsensusMetadata | None = None

    def load(self) -> ConsensusMetadata:
        return self.inner.load()

    def save(self, meta: ConsensusMetadata) -> None:
        self.pending = meta


ApplyCallback = Callable[[Apply], None]
RoleCallback = Callable[[RoleChanged], None]
ConfigCallback = Callable[[ConfigCommitted], None]
CopyCallback = Callable[[StartTabletCopy], None]
FailureCallback = Callable[[BaseException], None]


def _timer_target(deadline_ms: int, slack_ms: int) -> int:
    """When the tick loop wakes for ``deadline_ms``: rounded up to the slack, so that timers
    due close together fire in one turn."""
    return -(-deadline_ms // slack_ms) * slack_ms


class RaftRuntime:
    """Drives one replica's ``RaftCore`` on the running event loop (see the module docstring).

    The owner bootstraps cmeta, creates the runtime, calls ``start(task_group)``, and later
    ``stop()`` (or cancels the group). Callbacks run on the event loop and must not block:
    ``on_apply`` is told every committed range once, in order.

    A failure of the core or the log (a bug, a failed sync) ends the runtime and is logged with
    its traceback. With ``on_failure`` the owner is told and the task ends quietly, so one
    failed replica never brings down the other tasks of the group (a tablet server marks it
    FAILED and keeps serving its other tablets); without it the task raises, which ends the
    group (the master's sys catalog, without which the master cannot serve).
    """

    def __init__(
        self,
        uuid: str,
        log: RaftLog,
        store: CmetaStore,
        transport: Transport,
        clock: Clock,
        *,
        notifier: DurabilityNotifier | None = None,
        raft_options: RaftOptions | None = None,
        options: RuntimeOptions | None = None,
        rng: random.Random | None = None,
        group_id: str = "",
        last_applied_index: int = 0,
        on_apply: ApplyCallback | None = None,
        on_role_change: RoleCallback | None = None,
        on_config_committed: ConfigCallback | None = None,
        on_start_copy: CopyCallback | None = None,
        on_failure: FailureCallback | None = None,
    ) -> None:
        self.uuid = uuid
        self._store = _DeferredCmetaStore(store)
        # Effects produced while a cmeta write was pending, executed once it is durable.
        self._held: deque[Effect] = deque()
        self._writing: concurrent.futures.Future[None] | None = None  # the write in flight
        self._group: asyncio.TaskGroup | None = None
        self.core = RaftCore(
            uuid,
            log,
            self._store,
            clock,
            rng or random.Random(),
            raft_options,
            last_applied_index=last_applied_index,
            group_id=group_id,
        )
        self._log = log
        self._transport = transport
        # A transport that keeps the log quiet (``GrpcTransport.syncs_unwatched``) is told
        # after every pass whether the core can do without hearing of each sync.
        self._syncs_unwatched: Callable[[bool], None] | None = getattr(
            transport, "syncs_unwatched", None
        )
        # A transport that appends its leader's entries itself (``GrpcTransport
        # .follow_append``) asks ``follow_leader`` first.
        if hasattr(transport, "follow_leader"):
            transport.follow_leader = self.follow_leader
        self._notifier = notifier
        self._opts = options or RuntimeOptions()
        self._on_apply = on_apply
        self._on_role_change = on_role_change
        self._on_config_committed = on_config_committed
        self._group_id = group_id
        # The appended, uncommitted config last logged (config changes are rare: each is
        # logged at INFO where it is appended and where it commits).
        self._logged_pending: RaftConfig | None = None
        # Auto-vivification: sends StartTabletCopy to a follower (must not block).
        self.on_start_copy = on_start_copy
        # Called (on the event loop) when what a server heartbeat would say of this replica
        # changes: it quiesced, woke, or its quiesced term, commit index or leader moved, or
        # the runtime stopped (``liveness_signature``; the server's ``ServerHeartbeats``
        # caches what it sends and what it last checked against).
        self.on_liveness_change: Callable[[], None] | None = None
        # What was last told (a first call always tells: a new replica is awake).
        self._liveness_signature: tuple[int, int, str | None] | str | None = "never told"
        self._on_failure = on_failure
        # Proposals waiting for commit: (index, term, future), ascending index.
        self._commits: deque[tuple[int, int, asyncio.Future[OpId]]] = deque()
        self._reads: dict[int, asyncio.Future[int]] = {}
        self._read_ids = itertools.count(1)
        self._inbox: deque[Message] = deque()
        # Proposals of this loop turn, handed to the core together by the next pump.
        self._proposals: list[tuple[bytes, asyncio.Future[OpId]]] = []
        self._pump_scheduled = False
        self._reported_durable = log.durable_index()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None  # set once; the runtime is then unusable
        self._clock = clock
        # The deadline the timer task sleeps until (None: until woken); set when an input
        # brings the core's next deadline before it.
        self._timer_target: int | None = None
        self._timer_moved = asyncio.Event()
        # The election deadline a stall of the event loop was excused for (``_tick_loop``):
        # the timer sleeps past it on purpose.
        self._excused_deadline: int | None = None

    # --- life cycle -------------------------------------------------------------------------

    def start(self, task_group: asyncio.TaskGroup) -> None:
        """Starts the runtime as one task of ``task_group``."""
        if self._task is not None:
            raise IllegalStateError(f"runtime of {self.uuid} was already started")
        self._task = task_group.create_task(self._run(), name=f"raft-{self.uuid}")

    def stop(self) -> None:
        """Cancels the runtime's task; waiters fail with ``AbortedError``."""
        if self._task is not None:
            self._task.cancel()

    @property
    def running(self) -> bool:
        """Whether the runtime's task is live and has not failed."""
        return self._loop is not None and self._failure is None

    @property
    def ended(self) -> bool:
        """Whether the runtime's task has stopped or failed (False before it first ran)."""
        return self._failure is not None or (self._task is not None and self._task.done())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        stop_watch = (
            None
            if self._notifier is None
            else self._notifier.watch_durability(loop, self._on_durability_signal)
        )
        self._loop = loop
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                group.create_task(self._transport.run(self.deliver))
                group.create_task(self._tick_loop())
        except Exception as exc:  # an ExceptionGroup of the tasks above
            failure = self._failure if self._failure is not None else exc
            self._failure = failure
            log.error("the runtime of replica %s failed", self.uuid, exc_info=failure)
            if self._on_failure is None:
                raise
            self._on_failure(failure)
        finally:
            self._loop = None
            self._group = None
            self._note_liveness()
            writing = self._writing
            if writing is not None:
                # Whoever stopped this replica may delete or replace its files next: the
                # write in flight must not land after that (at most one fsync's wait).
                concurrent.futures.wait([writing])
            self._held.clear()  # never durable: as if the process had stopped before
            if stop_watch is not None:
                stop_watch()
            self._fail_waiters(AbortedError(f"the runtime of replica {self.uuid} stopped"))

    async def _tick_loop(self) -> None:
        """Ticks the core at its deadlines; sleeps without a timer while it has none.

        A follower's election deadline that passed while this event loop was stalled (the
        timer fired at least the minimum election timeout late) is given the stall's length
        once more before the core ticks: the leader's heartbeats of that stretch may be
        waiting, not yet handled, behind the stall, and campaigns started from a stalled loop
        let a busy server's elections feed on themselves (issue "Thousands of tablet replicas
        per server"). Once per deadline: a loop that stays stalled still campaigns, one stall
        later.
        """
        slack = self._opts.timer_slack_ms
        stall_ms_min = self.core.options.election_timeout_min_ms
        woke_late_ms = 0
        while True:
            if self._failure is not None:
                raise self._failure
            deadline = self.core.next_timer_ms()
            now = self._clock.now_ms()
            if deadline is not None and deadline <= now:
                if (
                    woke_late_ms >= stall_ms_min
                    and deadline != self._excused_deadline
                    and self.core.role is not Role.LEADER
                ):
                    self._excused_deadline = deadline
                    deadline = now + woke_late_ms
                else:
                    self.core.tick()
                    self._execute()
                    continue
            self._timer_moved.clear()
            woke_late_ms = 0
            if deadline is None:
                self._timer_target = None
                await self._timer_moved.wait()
                continue
            target = _timer_target(deadline, slack)
            self._timer_target = target
            try:
                async with asyncio.timeout((target - now) / 1000):
                    await self._timer_moved.wait()
            except TimeoutError:
                woke_late_ms = self._clock.now_ms() - target

    # --- inputs -----------------------------------------------------------------------------

    def deliver(self, message: Message) -> None:
        """Queues an inbound message (the transport's callback; never blocks)."""
        if self._loop is None:
            return  # stopped: a down replica loses what is sent to it
        self._inbox.append(message)
        self._schedule_pump()

    def follow_leader(
        self, term: int, leader: str, append: Callable[[], OpId | None], committed_index: int
    ) -> bool:
        """An AppendEntries from ``leader`` in ``term`` that the transport can append itself
        (its entries come right after the log's last, none is a config change, and its answer
        goes to the log to write once they are durable): if this replica follows that leader
        in that term and nothing waits to reach its core first (no inbound message queued,
        no consensus metadata being written, whose effects are held), calls ``append`` (the
        last entry appended, or None if the log's last entry was not the preceding one after
        all: nothing was done), tells the core and executes what it produced. Returns
        whether it was appended; if not, the transport hands the request in as usual
        (``deliver``). The core's own step does the same from a parsed request, a Python
        object per request, a future for its answer and a turn of the event loop later."""
        core = self.core
        if (
            self._inbox
            or self._loop is None
            or self._failure is not None
            or self._writing is not None
            or self._held
            or self._store.pending is not None
            or not core.follows(term, leader)
        ):
            return False
        try:
            last = append()
        except Exception as e:  # the log failed: nothing was appended or handed over
            self._fail(e)
            return False
        if last is None:
            return False
        try:
            core.appended_from_leader(last, committed_index)
            self._execute()
        except Exception as e:  # the core failed: the replica must restart
            self._fail(e)
        return True

    def _fail(self, error: Exception) -> None:
        """The core or the log failed outside a pass: the tick loop raises ``error``."""
        if self._failure is None:
            self._failure = error
            self._fail_waiters(error)
        self._timer_moved.set()

    async def propose(self, payload: bytes) -> OpId:
        """Replicates a WRITE; returns its OpId once COMMITTED. ``NotLeaderError`` if this
        replica is not (or stops being) the leader, ``AbortedError`` if the entry is
        truncated or the runtime stops before the commit."""
        loop = self._require_running()
        future: asyncio.Future[OpId] = loop.create_future()
        self._proposals.append((payload, future))
        self._schedule_pump()
        return await future

    def propose_many(self, payloads: list[bytes]) -> list[asyncio.Future[OpId]]:
        """Queues several WRITEs at once (they go to the core in one ``propose_many``, in
        order); each future resolves like ``propose``. For callers that would otherwise spawn
        one task per write."""
        loop = self._require_running()
        futures: list[asyncio.Future[OpId]] = [loop.create_future() for _ in payloads]
        self._proposals.extend(zip(payloads, futures, strict=True))
        self._schedule_pump()
        return futures

    async def read_index(self) -> int:
        """A linearizable read point: once leadership is confirmed by a majority after this
        call and the commit index at that time is applied, returns that index."""
        loop = self._require_running()
        read_id = next(self._read_ids)
        self.core.read(read_id)
        future: asyncio.Future[int] = loop.create_future()
        self._reads[read_id] = future
        self._schedule_pump()
        try:
            return await future
        finally:
            self._reads.pop(read_id, None)

    def peer_needs_copy(self, peer_uuid: str) -> None:
        """The transport saw follower ``peer_uuid`` answer TABLET_NOT_FOUND."""
        if self._loop is None or self._failure is not None:
            return
        self.core.peer_needs_copy(peer_uuid)
        self._schedule_pump()

    def append_lost(self, peer_uuid: str, term: int, last_index: int) -> None:
        """The transport will get no answer to an AppendEntries with entries up to
        ``last_index`` sent to ``peer_uuid`` in ``term`` (``RaftCore.append_lost``). Told
        on a later turn: a send can fail inside the core's own effects."""
        loop = self._loop
        if loop is not None:
            loop.call_soon(self._append_lost_now, peer_uuid, term, last_index)

    def _append_lost_now(self, peer_uuid: str, term: int, last_index: int) -> None:
        if self._loop is None or self._failure is not None:
            return
        self.core.append_lost(peer_uuid, term, last_index)
        self._schedule_pump()

    def peer_failed(self, peer_uuid: str, reason: str) -> None:
        """Follower ``peer_uuid`` cannot be caught up by waiting (its replica is FAILED, or it
        refused a tablet copy): its health becomes ``FAILED_UNRECOVERABLE``."""
        if self._loop is None or self._failure is not None:
            return
        self.core.peer_failed(peer_uuid, reason)

    def peer_health(self, failed_after_ms: int) -> dict[str, PeerHealth]:
        """The leader's view of each follower's health (empty when not leader)."""
        if self._loop is None or self._failure is not None:
            return {}
        return self.core.peer_health(failed_after_ms)

    def campaign(self) -> None:
        """Starts an election now (pre-vote first)."""
        self._require_running()
        self.core.campaign()
        self._schedule_pump()

    def run_leader_election(self) -> None:
        """RunLeaderElection: a real election now, ignoring a live leader."""
        self._require_running()
        self.core.run_leader_election()
        self._schedule_pump()

    def step_down(self) -> None:
        """Abrupt leader step-down."""
        self._require_running()
        self.core.step_down()
        self._schedule_pump()

    def transfer_leadership(self, target: str | None = None) -> str:
        """Graceful leadership transfer; returns the chosen successor."""
        self._require_running()
        successor = self.core.transfer_leadership(target)
        self._schedule_pump()
        return successor

    def change_config(self, change: ConfigChange) -> OpId:
        """Appends a config change as leader; ``on_config_committed`` reports its commit."""
        self._require_running()
        op_id = self.core.change_config(change)
        self._schedule_pump()
        return op_id

    def unsafe_change_config(self, voter_uuids: Sequence[str]) -> OpId:
        """UnsafeChangeConfig (DANGEROUS): forces a config of only ``voter_uuids`` here; a
        replica left as the sole voter is elected at the next timer turn."""
        self._require_running()
        op_id = self.core.unsafe_change_config(voter_uuids)
        self._schedule_pump()
        return op_id

    # --- quiescence (``nyala.consensus.liveness``; server heartbeats) ------------------------

    @property
    def quiesced(self) -> bool:
        """Whether the replica is quiesced (False while the runtime is not running)."""
        return self._loop is not None and self._failure is None and self.core.quiesced

    def server_heartbeat(self, sender: str, named: liveness.QuiescedAs | None) -> bool:
        """What ``sender``'s server heartbeat said about this tablet (``liveness.receive``);
        True if it concerned this replica and vouched for it."""
        if self._loop is None or self._failure is not None:
            return False
        vouched = liveness.receive(self.core, sender, named)
        if not self.core.quiesced:  # it woke; vouching for a quiesced replica sends nothing
            self._execute()
        return vouched

    def server_silent(self, server: str) -> None:
        """``server`` has sent no server heartbeat for too long (``liveness.sender_silent``)."""
        if self._loop is None or self._failure is not None:
            return
        liveness.sender_silent(self.core, server)
        self._execute()  # wakes the timer task for the woken replica's new deadline
        # The silence check already excused this server's own stalls: that deadline gets no
        # second excuse in ``_tick_loop`` (a dead leader is replaced on time).
        self._excused_deadline = self.core.next_timer_ms()

    def status(self) -> ReplicaStatus:
        """A snapshot of the replica's consensus state."""
        return self.core.status()

    @property
    def role(self) -> Role:
        """This replica's role."""
        return self.core.role

    # --- execution --------------------------------------------------------------------------

    def _require_running(self) -> asyncio.AbstractEventLoop:
        if self._failure is not None:
            raise IllegalStateError(f"replica {self.uuid} failed: {self._failure!r}")
        if self._loop is None:
            raise IllegalStateError(f"the runtime of replica {self.uuid} is not running")
        return self._loop

    def _schedule_pump(self) -> None:
        if not self._pump_scheduled and self._loop is not None:
            self._pump_scheduled = True
            self._loop.call_soon(self._pump)

    def _on_durability_signal(self) -> None:
        assert self._notifier is not None
        self._notifier.drain_notifications()
        failure = self._notifier.failure()
        if failure is not None and self._failure is None:
            self._failure = failure  # the tick loop raises it: the replica must restart
            self._fail_waiters(failure)
            return
        self._pump()

    def _pump(self) -> None:
        """Steps queued messages, then executes everything the core produced, once."""
        self._pump_scheduled = False
        if self._loop is None or self._failure is not None:
            self._inbox.clear()
            return
        try:
            while self._inbox:
                message = self._inbox.popleft()
                try:
                    self.core.step(message)
                except WrongServerUuidError:
                    continue  # misrouted: not this replica's business
            if self._proposals:
                self._propose_gathered()
            self._execute()
        except Exception as e:  # the core or the log failed: the replica must restart
            self._failure = e
            self._fail_waiters(e)

    def _propose_gathered(self) -> None:
        proposals, self._proposals = self._proposals, []
        try:
            op_ids = self.core.propose_many([payload for payload, _ in proposals])
        except (NotLeaderError, ServiceUnavailableError) as e:
            for _, future in proposals:
                if not future.done():
                    future.set_exception(e)
            return
        commits = self._commits
        for op_id, (_, future) in zip(op_ids, proposals, strict=True):
            commits.append((op_id.index, op_id.term, future))

    def _execute(self) -> None:
        durable = self._log.durable_index()
        if durable > self._reported_durable:
            self.core.on_log_durable(durable)
        self._reported_durable = durable  # a truncation may lower it
        effects = self.core.drain_effects()
        pending_config = self.core.pending_config
        if pending_config is not self._logged_pending:
            self._logged_pending = pending_config
            if pending_config is not None:
                log.info(
                    "%s on %s: config %s appended in term %d",
                    self._group_id,
                    self.uuid,
                    pending_config.describe(),
                    self.core.term,
                )
        pending = self._store.pending
        if pending is not None and self._writing is None and self._group is None:
            self._store.pending = None  # not running (no writer to hand it to): write it here
            self._store.inner.save(pending)
            pending = None
        if pending is not None or self._writing is not None:
            self._held.extend(effects)  # after the cmeta write (module docstring)
            if self._writing is None:
                self._write_cmeta()
        else:
            for effect in effects:
                self._execute_one(effect)
        self._check_timer()
        self._note_liveness()
        if self._syncs_unwatched is not None:
            core = self.core
            role = core.role
            self._syncs_unwatched(
                role in _FOLLOWING or (role is Role.LEADER and not core.awaits_own_durability())
            )

    def liveness_signature(self) -> tuple[int, int, str | None] | None:
        """What a server heartbeat says of this replica: (term, commit index, leader) while
        it is quiesced and running, else None. Fixed while it stays quiesced: anything that
        would change it (an entry, an election, a config change) wakes the replica first."""
        core = self.core
        if not core.quiesced or self._loop is None or self._failure is not None:
            return None
        return (core.term, core.commit_index, core.leader_uuid)

    def _note_liveness(self) -> None:
        signature = self.liveness_signature()
        if signature != self._liveness_signature:
            self._liveness_signature = signature
            if self.on_liveness_change is not None:
                self.on_liveness_change()

    def _check_timer(self) -> None:
        deadline = self.core.next_timer_ms()
        if deadline is None or deadline == self._excused_deadline:
            return
        target = self._timer_target
        # Compared as the tick loop would arm it: a deadline before the armed target but
        # rounded up to the same one changes nothing, and waking the loop for it cost a
        # leader with a commit notice pending three needless turns per write.
        if target is None or _timer_target(deadline, self._opts.timer_slack_ms) < target:
            self._timer_moved.set()  # the timer task sleeps past the new deadline

    def _write_cmeta(self) -> None:
        """Writes the pending cmeta on the writer pool; ``_cmeta_written`` follows on the loop."""
        meta = self._store.pending
        loop = self._loop
        assert meta is not None
        assert loop is not None
        self._store.pending = None
        writing = _cmeta_writer().submit(self._store.inner.save, meta)
        self._writing = writing
        writing.add_done_callback(lambda _: loop.call_soon_threadsafe(self._cmeta_written, writing))

    def _cmeta_written(self, writing: concurrent.futures.Future[None]) -> None:
        if writing is not self._writing:
            return  # the runtime stopped meanwhile
        self._writing = None
        error = writing.exception()
        if error is not None:
            assert isinstance(error, Exception)  # a save raises OSError and the like
            # Memory is ahead of disk: never act on it (the core's rule for a failed write).
            self.core.storage_failed(error)
            self._held.clear()
            if self._failure is None:
                self._failure = error
                self._fail_waiters(error)
            self._timer_moved.set()  # the tick loop raises it: the replica must restart
            return
        if self._loop is None or self._failure is not None:
            self._held.clear()
            return
        if self._store.pending is not None:
            self._write_cmeta()  # a newer state: what is held waits for it too
            return
        held, self._held = self._held, deque()
        try:
            for effect in held:
                self._execute_one(effect)
            self._check_timer()
        except Exception as e:  # as in ``_pump``: the replica must restart
            self._failure = e
            self._fail_waiters(e)
            self._timer_moved.set()

    def _execute_one(self, effect: Effect) -> None:
        match effect:
            case Send():
                self._transport.send(effect.message)
            case Apply():
                self._resolve_commits(effect.last_index)
                if self._on_apply is not None:
                    self._on_apply(effect)
            case LogTruncated():
                self._abort_commits_from(effect.from_index)
            case RoleChanged():
                if effect.role is not Role.LEADER:
                    self._fail_commits(self._not_leader(effect))
                if self._on_role_change is not None:
                    self._on_role_change(effect)
            case ConfigCommitted():
                log.info(
                    "%s on %s: config %s committed",
                    self._group_id,
                    self.uuid,
                    effect.config.describe(),
                )
                if self._on_config_committed is not None:
                    self._on_config_committed(effect)
            case ReadReady():
                self._settle_read(effect.read_id, effect.index, None)
            case ReadFailed():
                error = NotLeaderError(f"read {effect.read_id} failed: {effect.reason}")
                self._settle_read(effect.read_id, 0, error)
            case StartTabletCopy():
                if self.on_start_copy is not None:
                    self.on_start_copy(effect)

    def _resolve_commits(self, last_index: int) -> None:
        commits = self._commits
        while commits and commits[0][0] <= last_index:
            index, term, future = commits.popleft()
            if not future.done():
                future.set_result(OpId(term, index))

    def _abort_commits_from(self, from_index: int) -> None:
        commits = self._commits
        while commits and commits[-1][0] >= from_index:
            index, _, future = commits.pop()
            if not future.done():
                future.set_exception(
                    AbortedError(f"entry {index} was truncated from the log; it did not commit")
                )

    def _not_leader(self, change: RoleChanged) -> NotLeaderError:
        leader = change.leader_uuid
        peer = self.core.active_config.peer(leader) if leader else None
        return NotLeaderError(
            f"{self.uuid} lost leadership (now {change.role.value} in term {change.term}) before"
            " the entry committed; its outcome is unknown",
            leader_uuid=leader,
            leader_addr=peer.address if peer else None,
        )

    def _fail_commits(self, error: BaseException) -> None:
        while self._commits:
            _, _, future = self._commits.popleft()
            if not future.done():
                future.set_exception(error)

    def _settle_read(self, read_id: int, index: int, error: BaseException | None) -> None:
        future = self._reads.pop(read_id, None)
        if future is None or future.done():
            return
        if error is None:
            future.set_result(index)
        else:
            future.set_exception(error)

    def _fail_waiters(self, error: BaseException) -> None:
        proposals, self._proposals = self._proposals, []
        for _, proposal in proposals:
            if not proposal.done():
                proposal.set_exception(error)
        self._fail_commits(error)
        reads, self._reads = self._reads, {}
        for future in reads.values():
            if not future.done():
                future.set_exception(error)
