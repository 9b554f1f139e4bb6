"""A seeded randomized simulation of a Raft cluster, checked against named invariants after
every step (STYLE.md 11).

Faults: message loss, reordering and duplication, partitions, crashes (losing the non-durable
log tail and the state machine), slow disks (logs that sync only now and then), leadership
transfers, abrupt step-downs, reads, (optionally) random membership changes, and
(optionally) quiescence: leaders stop heartbeating once idle and liveness travels in server
heartbeats, which are lost, cut by partitions and stopped by crashes like any message.

Invariants (Raft paper §5.2-5.4, plus one for membership):

* election safety: at most one leader per term;
* log matching: two logs with an entry of the same index and term are identical up to it;
* leader completeness: a new leader's log holds every entry committed in an earlier term;
* state machine safety: every replica applies the same entry at the same index;
* config safety: no two different configs are ever committed at the same index;
* read safety: a ReadIndex read is served at an index >= everything committed anywhere when
  it started (linearizability of leader reads).

Replay a failure with ``Simulation(seed, ...).run(steps)`` using the seed in the message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from dataclasses import dataclass, field

from nyala.consensus import ChangeType, ConfigChange, MemberType, RaftOptions, RaftPeer, Role
from nyala.consensus.memory_log import LogEntry
from nyala.consensus.sim_cluster import SimCluster
from nyala.consensus.types import RaftConfig
from nyala.errors import NyalaError

SIM_OPTIONS = RaftOptions(
    heartbeat_interval_ms=100,
    batch_bytes_max=40,
    peer_inflight_bytes_max=120,
    election_backoff_max_ms=1_200,
    transfer_timeout_ms=600,
    failed_follower_timeout_ms=1_000,
    step_down_snooze_ms=600,
)
QUIESCING_OPTIONS = dataclasses.replace(SIM_OPTIONS, quiesce_after_idle_heartbeats=2)
SERVER_HEARTBEAT_LOSS = 0.05  # the fraction of server heartbeats lost
QUEUE_MAX = 300  # deliver eagerly beyond this many messages in flight
NODES_MAX = 6


class InvariantViolation(AssertionError):
    """An invariant failed; the message names the seed and step to replay."""


@dataclass
class Checker:
    """The global observations the invariants are checked against."""

    leader_of_term: dict[int, str] = field(default_factory=dict)
    committed: list[LogEntry] = field(default_factory=list)  # committed[i - 1] = entry at i
    commit_term: list[int] = field(default_factory=list)  # term in which i was first seen committed
    configs: dict[int, RaftConfig] = field(default_factory=dict)  # committed config by opid index
    applied_checked: dict[str, int] = field(default_factory=dict)
    leaders_checked: set[tuple[int, str]] = field(default_factory=set)

    def check(self, cluster: SimCluster) -> None:
        for node in cluster.nodes.values():
            core = node.core
            if core is None:
                self.applied_checked[node.uuid] = 0
                continue
            self._record_commit(node.uuid, core.commit_index, core.term, cluster)
            self._check_applied(node.uuid, node.applied)
            config = core.committed_config
            if config.opid_index >= 0:
                seen = self.configs.setdefault(config.opid_index, config)
                if seen != config:
                    raise InvariantViolation(
                        f"config safety: two configs committed at index {config.opid_index}: "
                        f"{seen} and {config}"
                    )
            if core.role is Role.LEADER:
                self._check_leader(node.uuid, core.term, cluster)
        self._check_log_matching(cluster)

    def _record_commit(self, uuid: str, commit_index: int, term: int, cluster: SimCluster) -> None:
        log = cluster.nodes[uuid].log
        while len(self.committed) < commit_index:
            index = len(self.committed) + 1
            self.committed.append(log.entry(index))
            self.commit_term.append(term)
        # Spot-check the newest committed entry this replica knows.
        if commit_index and log.entry(commit_index) != self.committed[commit_index - 1]:
            raise InvariantViolation(
                f"state machine safety: {uuid} committed {log.entry(commit_index)} at "
                f"{commit_index}, others {self.committed[commit_index - 1]}"
            )

    def _check_applied(self, uuid: str, applied: list[LogEntry]) -> None:
        start = self.applied_checked.get(uuid, 0)
        if start > len(applied):
            start = 0  # restarted
        for i in range(start, len(applied)):
            if applied[i] != self.committed[i]:
                raise InvariantViolation(
                    f"state machine safety: {uuid} applied {applied[i]} at index {i + 1}, "
                    f"committed entry is {self.committed[i]}"
                )
        self.applied_checked[uuid] = len(applied)

    def _check_leader(self, uuid: str, term: int, cluster: SimCluster) -> None:
        previous = self.leader_of_term.setdefault(term, uuid)
        if previous != uuid:
            raise InvariantViolation(f"election safety: {previous} and {uuid} lead term {term}")
        if (term, uuid) in self.leaders_checked:
            return  # completeness holds at election; a leader never loses entries afterwards
        self.leaders_checked.add((term, uuid))
        log = cluster.nodes[uuid].log
        for i, (entry, commit_term) in enumerate(
            zip(self.committed, self.commit_term, strict=True), start=1
        ):
            if commit_term < term and (log.term_at(i) is None or log.entry(i) != entry):
                raise InvariantViolation(
                    f"leader completeness: leader {uuid} of term {term} lacks committed {entry}"
                )

    def _check_log_matching(self, cluster: SimCluster) -> None:
        logs = [(n.uuid, n.log.entries()) for n in cluster.nodes.values()]
        for a in range(len(logs)):
            for b in range(a + 1, len(logs)):
                (ua, la), (ub, lb) = logs[a], logs[b]
                i = min(len(la), len(lb))
                while i > 0 and la[i - 1].op_id != lb[i - 1].op_id:
                    i -= 1
                if la[:i] != lb[:i]:
                    raise InvariantViolation(
                        f"log matching: {ua} and {ub} share {la[i - 1].op_id} but differ before"
                    )


class Simulation:
    """One seeded run."""

    def __init__(
        self,
        seed: int,
        *,
        voters: int = 3,
        config_changes: bool = False,
        quiesce: bool = False,
        commit_notice_delay_ms: int = 0,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        uuids = [f"r{i}" for i in range(voters)]
        options = QUIESCING_OPTIONS if quiesce else SIM_OPTIONS
        options = dataclasses.replace(options, commit_notice_delay_ms=commit_notice_delay_ms)
        self.commit_notice_delay_ms = commit_notice_delay_ms
        self.cluster = SimCluster(uuids, options=options, seed=seed)
        self.quiesce = quiesce
        self.next_server_heartbeat_ms = 0
        self.quiesced_seen = 0  # server heartbeat rounds that found some replica quiesced
        self.quiet_steps = 0  # steps left in a quiet spell (no proposals, faults or requests)
        for uuid in uuids:
            self.cluster.node(uuid).auto_sync = self.rng.random() < 0.5
        self.config_changes = config_changes
        self.checker = Checker()
        self.proposals = 0
        self.reads = 0
        self.read_floor: dict[int, int] = {}  # read id -> highest commit anywhere at its start
        self.step_count = 0

    def run(self, steps: int) -> None:
        """Runs ``steps`` random steps, then heals everything and checks the cluster recovers."""
        for _ in range(steps):
            self._guarded(self.step)
        self._guarded(self.recover_and_check_liveness)
        if self.quiesce:
            self._guarded(self.check_quiescence_and_failover)

    def _guarded(self, action: object) -> None:
        try:
            action()  # type: ignore[operator]
            self.checker.check(self.cluster)
            self._check_reads()
        except AssertionError as e:
            raise InvariantViolation(
                f"seed={self.seed} step={self.step_count} (replay: Simulation({self.seed}, "
                f"voters={len([n for n in self.cluster.nodes])}, "
                f"config_changes={self.config_changes}, quiesce={self.quiesce}, "
                f"commit_notice_delay_ms={self.commit_notice_delay_ms})): {e}"
            ) from e

    def _check_reads(self) -> None:
        for node in self.cluster.nodes.values():
            for read_id, outcome in node.reads.items():
                floor = self.read_floor.get(read_id)
                if isinstance(outcome, int) and floor is not None and outcome < floor:
                    raise InvariantViolation(
                        f"read safety: read {read_id} on {node.uuid} served at index {outcome},"
                        f" but index {floor} was committed before it started"
                    )

    def step(self) -> None:
        self.step_count += 1
        if self.quiet_steps > 0:
            self._quiet_step()
            return
        if self.quiesce and self.rng.random() < 0.004:
            self._start_quiet_spell()
        r = self.rng.random()
        if len(self.cluster.queue) > QUEUE_MAX or (r < 0.66 and self.cluster.queue):
            self._deliver()
        elif r < 0.76:
            self.cluster.tick(self.rng.choice((5, 10, 20, 40, 80, 250)))
            self._server_heartbeats()
        elif r < 0.84:
            self._propose()
        elif r < 0.91:
            self._sync()
        elif r < 0.92:
            self._crash_or_restart()
        elif r < 0.93:
            self._partition_or_heal()
        elif r < 0.945:
            self._leader_action()
        elif r < 0.97 or not self.config_changes:
            self._read()
        else:
            self._change_config()

    def _start_quiet_spell(self) -> None:
        """Lets the group go idle and quiesce; half the spells also heal the network and
        restart every crashed replica first, so that a whole group can quiesce."""
        self.quiet_steps = self.rng.randrange(50, 400)
        if self.rng.random() < 0.5:
            self.cluster.heal()
            for uuid, node in sorted(self.cluster.nodes.items()):
                if not node.alive:
                    self.cluster.restart(uuid)

    def _quiet_step(self) -> None:
        """A step of a quiet spell: messages flow, time passes, logs sync; nothing else."""
        self.quiet_steps -= 1
        if self.cluster.queue:
            self._deliver()
        elif self.rng.random() < 0.3:
            self._sync()
        else:
            self.cluster.tick(self.rng.choice((20, 50, 100)))
            self._server_heartbeats()

    def _server_heartbeats(self, *, lossless: bool = False) -> None:
        """Once per heartbeat interval (when quiescence is on), every running replica's server
        heartbeat, each lost now and then (unless ``lossless``), then the silence check."""
        if not self.quiesce or self.cluster.clock.now_ms() < self.next_server_heartbeat_ms:
            return
        self.next_server_heartbeat_ms = self.cluster.clock.now_ms() + (
            self.cluster.options.heartbeat_interval_ms
        )
        for uuid in sorted(self.cluster.nodes):
            if lossless or self.rng.random() >= SERVER_HEARTBEAT_LOSS:
                self.cluster.server_heartbeat(uuid)
        self.cluster.check_silence()
        if any(n.core is not None and n.core.quiesced for n in self.cluster.nodes.values()):
            self.quiesced_seen += 1

    def _deliver(self) -> None:
        queue = self.cluster.queue
        position = 0 if self.rng.random() < 0.8 else self.rng.randrange(len(queue))
        r = self.rng.random()
        if r < 0.04:
            queue.pop(position)  # lost
            return
        if r < 0.06:
            queue.insert(self.rng.randrange(len(queue) + 1), queue[position])  # duplicated
        self.cluster.deliver_one(position)

    def _alive(self) -> list[str]:
        return sorted(u for u, n in self.cluster.nodes.items() if n.alive)

    def _propose(self) -> None:
        leaders = self.cluster.leaders()
        target = leaders[-1] if leaders and self.rng.random() < 0.9 else None
        if target is None and self._alive():
            target = self.rng.choice(self._alive())
        if target is None:
            return
        node = self.cluster.node(target)
        self.proposals += 1
        with contextlib.suppress(NyalaError):
            node.running().propose(f"w{self.proposals}".encode())
        self.cluster.process(node)

    def _sync(self) -> None:
        alive = self._alive()
        if alive:
            uuid = self.rng.choice(alive)
            last = self.cluster.node(uuid).log.last_op_id().index
            partial = self.rng.random() < 0.3
            self.cluster.sync(uuid, self.rng.randint(0, last) if partial else last)

    def _crash_or_restart(self) -> None:
        down = sorted(u for u, n in self.cluster.nodes.items() if not n.alive)
        if down and (self.rng.random() < 0.6 or len(down) * 2 >= len(self.cluster.nodes)):
            self.cluster.restart(self.rng.choice(down))
        elif self._alive():
            self.cluster.crash(self.rng.choice(self._alive()))

    def _partition_or_heal(self) -> None:
        if self.rng.random() < 0.5:
            self.cluster.heal()
            return
        uuids = sorted(self.cluster.nodes)
        self.rng.shuffle(uuids)
        cut = self.rng.randrange(1, len(uuids))
        self.cluster.partition([uuids[:cut]])

    def _leader_action(self) -> None:
        leaders = self.cluster.leaders()
        if not leaders:
            alive = self._alive()
            if alive:
                node = self.cluster.node(self.rng.choice(alive))
                with contextlib.suppress(NyalaError):
                    node.running().campaign()
                self.cluster.process(node)
            return
        node = self.cluster.node(self.rng.choice(leaders))
        core = node.running()
        r = self.rng.random()
        try:
            if r < 0.4:
                self.reads += 1
                self.read_floor[self.reads] = len(self.checker.committed)
                core.read(self.reads)
            elif r < 0.8:
                core.transfer_leadership()
            else:
                core.step_down()
        except NyalaError:
            pass
        self.cluster.process(node)

    def _read(self) -> None:
        """A ReadIndex read at the lowest-term leader: a deposed one, when two exist."""
        leaders = self.cluster.leaders()
        if not leaders:
            return
        node = self.cluster.node(leaders[0])
        self.reads += 1
        self.read_floor[self.reads] = len(self.checker.committed)
        with contextlib.suppress(NyalaError):
            node.running().read(self.reads)
        self.cluster.process(node)

    def _change_config(self) -> None:
        leaders = self.cluster.leaders()
        if not leaders:
            return
        node = self.cluster.node(leaders[-1])
        core = node.running()
        config = core.active_config
        r = self.rng.random()
        members = [p for p in config.peers if p.uuid != node.uuid]
        if r < 0.4 and len(self.cluster.nodes) < NODES_MAX:
            uuid = f"r{len(self.cluster.nodes)}"
            new = self.cluster.add_node(uuid)
            new.auto_sync = self.rng.random() < 0.5
            peer = RaftPeer(uuid, f"{uuid}:7050", MemberType.NON_VOTER, promote=True)
            change = ConfigChange(ChangeType.ADD_PEER, peer)
        elif r < 0.7 and members and len(config.voters()) > 1:
            change = ConfigChange(ChangeType.REMOVE_PEER, self.rng.choice(members))
        elif members:
            victim = self.rng.choice(members)
            member_type = MemberType.NON_VOTER if victim.is_voter else MemberType.VOTER
            peer = RaftPeer(victim.uuid, victim.address, member_type)
            change = ConfigChange(ChangeType.MODIFY_PEER, peer)
        else:
            return
        cas = config.opid_index if self.rng.random() < 0.5 else None
        with contextlib.suppress(NyalaError):
            core.change_config(
                ConfigChange(change.change_type, change.peer, cas_config_opid_index=cas)
            )
        self.cluster.process(node)

    def recover_and_check_liveness(self) -> None:
        """Heals and restarts everything; a leader must emerge and commit a new write."""
        self.cluster.heal()
        for uuid, node in sorted(self.cluster.nodes.items()):
            if not node.alive:
                self.cluster.restart(uuid)
            node.auto_sync = True
        self.cluster.sync_all()
        marker = b"liveness"
        proposed = False
        for _ in range(600):
            self.cluster.tick(50)
            self._server_heartbeats()
            self.cluster.deliver_all()
            leaders = self.cluster.leaders()
            if leaders and not proposed:
                try:
                    self.cluster.node(leaders[-1]).running().propose(marker)
                    proposed = True
                except NyalaError:
                    pass
                self.cluster.process(self.cluster.node(leaders[-1]))
            if proposed and self._committed_everywhere(marker):
                return
            self.checker.check(self.cluster)
        raise AssertionError(
            f"liveness: no write committed on every voter after healing (leaders {leaders})"
        )

    def check_quiescence_and_failover(self) -> None:
        """After recovery: an idle, healthy group quiesces whole within a few heartbeats and
        stays quiesced; when its leader crashes, the server heartbeats stop, a follower wakes
        and a new leader is elected within two election timeouts, then commits a write."""
        options = self.cluster.options
        step_ms = 50
        for _ in range(400):
            self._tick_and_settle(step_ms)
            if not self._awake_members():
                break
        else:
            raise AssertionError(
                f"quiescence: an idle, healthy group never quiesced whole ({self._awake_members()}"
                " awake)"
            )
        for _ in range(40):  # it stays quiesced: no replica wakes without a cause
            self._tick_and_settle(step_ms)
            awake = self._awake_members()
            assert not awake, f"quiescence: {awake} woke with nothing to do"
        old = self.cluster.leaders()[-1]
        old_core = self.cluster.node(old).running()
        if len(old_core.active_config.voters()) < 3:
            return  # no majority would survive the leader's crash: nothing to fail over to
        old_term = old_core.term
        self.cluster.crash(old)
        bound_ms = 2 * options.election_timeout_base_ms * (1 + options.election_jitter_fraction)
        waited_ms = 0
        while not [u for u in self.cluster.leaders() if u != old]:
            assert waited_ms <= bound_ms, (
                f"failover: no new leader {waited_ms} ms after the quiesced leader {old} crashed"
            )
            self._tick_and_settle(step_ms)
            waited_ms += step_ms
        new = self.cluster.node(self.cluster.leaders()[-1]).running()
        assert new.term > old_term
        self.cluster.restart(old)
        self.recover_and_check_liveness()

    def _awake_members(self) -> list[str]:
        """Members of the leader's config that are not quiesced (all, if there is no leader)."""
        leaders = self.cluster.leaders()
        if not leaders:
            return sorted(self.cluster.nodes)
        config = self.cluster.node(leaders[-1]).running().active_config
        return [
            p.uuid
            for p in config.peers
            if (core := self.cluster.node(p.uuid).core) is None or not core.quiesced
        ]

    def _tick_and_settle(self, step_ms: int) -> None:
        self.cluster.tick(step_ms)
        self._server_heartbeats(lossless=True)
        self.cluster.deliver_all()
        self.cluster.sync_all()
        self.cluster.deliver_all()
        self.checker.check(self.cluster)

    def _committed_everywhere(self, marker: bytes) -> bool:
        leaders = self.cluster.leaders()
        if not leaders:
            return False
        config = self.cluster.node(leaders[-1]).running().active_config
        for uuid in config.voters():
            if not any(e.payload == marker for e in self.cluster.node(uuid).applied):
                return False
        return True
