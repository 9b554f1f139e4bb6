"""``SimCluster``: several ``RaftCore`` replicas in one process, over an in-memory network,
``MemoryLog``s and one ``ManualClock``. Deterministic for a given seed.

It is the runtime the scenario harness (``tests/scenarios``) and the randomized simulation
(``tests/sim``) drive: it executes effects (queues sends, applies committed entries to a
per-replica list, syncs logs), models crashes (the non-durable log tail and the in-memory state
machine are lost; cmeta survives) and partitions (messages across groups are dropped at delivery).
It owns no policy: what to deliver, drop or crash is the caller's choice.

Each replica stands for a whole server: ``server_heartbeat`` carries what one server says about
its quiesced replica to the others (``nyala.consensus.liveness``, the same code a tablet server
runs), and ``check_silence`` wakes replicas whose quiesced peers' servers went silent.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from nyala.common.clock import ManualClock
from nyala.consensus import liveness
from nyala.consensus.core import RaftCore, bootstrap_cmeta
from nyala.consensus.effects import (
    Apply,
    ConfigCommitted,
    Effect,
    LogTruncated,
    ReadFailed,
    ReadReady,
    RoleChanged,
    Send,
)
from nyala.consensus.liveness import ServerSilence
from nyala.consensus.memory_log import LogEntry, MemoryLog
from nyala.consensus.messages import Message
from nyala.consensus.metadata import CmetaStore, MemoryCmetaStore
from nyala.consensus.options import RaftOptions
from nyala.consensus.types import MemberType, RaftConfig, RaftPeer
from nyala.errors import IllegalStateError, NotFoundError

DELIVER_ROUNDS_MAX = 100_000  # one settle; a cluster that keeps talking longer is broken
StoreFactory = Callable[[str], CmetaStore]


@dataclass(slots=True)
class Node:
    """One replica: its durable parts (log, cmeta store) and its live parts (core, applied)."""

    uuid: str
    log: MemoryLog
    store: CmetaStore
    rng: random.Random
    core: RaftCore | None = None  # None while crashed
    applied: list[LogEntry] = field(default_factory=list)  # the state machine, in apply order
    reported_durable: int = 0  # durable index last reported to the core
    reads: dict[int, int | str] = field(default_factory=dict)  # read id -> index or failure
    silence: ServerSilence | None = None  # when the other servers were last heard

    @property
    def auto_sync(self) -> bool:
        """Whether every append is durable at once (else only on ``SimCluster.sync``)."""
        return self.log.sync_on_append

    @auto_sync.setter
    def auto_sync(self, on: bool) -> None:
        self.log.sync_on_append = on

    @property
    def alive(self) -> bool:
        """Whether the replica is running."""
        return self.core is not None

    def running(self) -> RaftCore:
        """The core; ``IllegalStateError`` if the replica is crashed."""
        if self.core is None:
            raise IllegalStateError(f"replica {self.uuid} is down")
        return self.core


class SimCluster:
    """An in-process Raft cluster (see the module docstring)."""

    def __init__(
        self,
        voters: Sequence[str],
        non_voters: Sequence[str] = (),
        *,
        promote: Iterable[str] = (),
        options: RaftOptions | None = None,
        seed: int = 0,
        store_factory: StoreFactory | None = None,
    ) -> None:
        self.clock = ManualClock()
        self.options = options or RaftOptions()
        self.seed = seed
        self.queue: list[Message] = []  # in flight, FIFO
        self.events: list[str] = []  # human-readable happenings, drained by the caller
        self.nodes: dict[str, Node] = {}
        self._groups: list[set[str]] | None = None  # partition; None when healed
        self._store_factory = store_factory or (lambda _uuid: MemoryCmetaStore())
        promoted = set(promote)
        peers = [RaftPeer(u, f"{u}:7050") for u in voters] + [
            RaftPeer(u, f"{u}:7050", MemberType.NON_VOTER, promote=u in promoted)
            for u in non_voters
        ]
        config = RaftConfig(tuple(peers))
        for peer in peers:
            self.add_node(peer.uuid, config)

    # --- membership of the process ------------------------------------------------------------

    def add_node(self, uuid: str, config: RaftConfig | None = None) -> Node:
        """A new replica with an empty log; ``config`` defaults to an empty one (it joins when a
        leader replicates a config naming it)."""
        if uuid in self.nodes:
            raise IllegalStateError(f"replica {uuid} already exists")
        store = self._store_factory(uuid)
        bootstrap_cmeta(store, config or RaftConfig(()))
        log = MemoryLog(sync_on_append=True)
        node = Node(uuid, log, store, random.Random(f"{self.seed}/{uuid}"))
        node.silence = ServerSilence(self.options.election_timeout_min_ms)
        self.nodes[uuid] = node
        self._start(node)
        return node

    def node(self, uuid: str) -> Node:
        """The replica named ``uuid``."""
        try:
            return self.nodes[uuid]
        except KeyError:
            raise NotFoundError(f"no replica {uuid}") from None

    def crash(self, uuid: str) -> None:
        """Stops a replica: its non-durable log tail and its state machine are lost."""
        node = self.node(uuid)
        node.core = None
        node.log = node.log.recover()
        node.applied = []
        node.reads = {}
        self.events.append(f"{uuid}: crashed (log durable to {node.log.durable_index()})")

    def restart(self, uuid: str) -> None:
        """Starts a crashed replica from its cmeta and durable log."""
        node = self.node(uuid)
        if node.alive:
            raise IllegalStateError(f"replica {uuid} is running")
        self._start(node)

    def _start(self, node: Node) -> None:
        node.reported_durable = node.log.durable_index()
        node.core = RaftCore(node.uuid, node.log, node.store, self.clock, node.rng, self.options)
        self.process(node)

    # --- network ----------------------------------------------------------------------------

    def partition(self, groups: Sequence[Iterable[str]]) -> None:
        """Only replicas in the same group can talk; unnamed replicas form one more group."""
        sets = [set(g) for g in groups]
        named = set().union(*sets)
        rest = set(self.nodes) - named
        if rest:
            sets.append(rest)
        self._groups = sets

    def heal(self) -> None:
        """Removes the partition."""
        self._groups = None

    def connected(self, a: str, b: str) -> bool:
        """Whether messages between ``a`` and ``b`` get through the partition."""
        if self._groups is None:
            return True
        return any(a in g and b in g for g in self._groups)

    def deliver_one(self, position: int = 0) -> tuple[Message, bool]:
        """Delivers the queued message at ``position``; returns it and whether it arrived."""
        msg = self.queue.pop(position)
        dest = self.nodes.get(msg.dest)
        if dest is None or dest.core is None or not self.connected(msg.src, msg.dest):
            return msg, False
        dest.core.step(msg)
        self.process(dest)
        return msg, True

    def deliver_all(self) -> int:
        """Delivers messages in order until none are left; returns how many were taken."""
        count = 0
        while self.queue:
            self.deliver_one()
            count += 1
            assert count < DELIVER_ROUNDS_MAX, "messages kept coming: the cluster never settles"
        return count

    # --- server heartbeats (liveness of quiesced replicas) ---------------------------------

    def server_heartbeat(self, sender: str) -> None:
        """``sender``'s server heartbeat reaches every other running, connected replica."""
        src = self.node(sender)
        if src.core is None:
            return
        named = liveness.quiesced_as(src.core)
        now = self.clock.now_ms()
        for uuid, node in sorted(self.nodes.items()):
            if uuid == sender or node.core is None or not self.connected(sender, uuid):
                continue
            assert node.silence is not None
            node.silence.heard(sender, now)
            liveness.receive(node.core, sender, named)
            self.process(node)

    def server_heartbeats(self) -> None:
        """Every running replica's server heartbeat, then the silence check."""
        for uuid in sorted(self.nodes):
            self.server_heartbeat(uuid)
        self.check_silence()

    def check_silence(self) -> None:
        """Wakes quiesced replicas whose peers' servers have not been heard for too long."""
        now = self.clock.now_ms()
        for uuid, node in sorted(self.nodes.items()):
            if node.core is None or node.silence is None:
                continue
            node.silence.watch((u for u in self.nodes if u != uuid), now)
            for server in node.silence.newly_silent(now):
                liveness.sender_silent(node.core, server)
            self.process(node)

    # --- time -------------------------------------------------------------------------------

    def tick(self, delta_ms: int, uuids: Iterable[str] | None = None) -> None:
        """Advances the clock and lets the (named or all) running replicas' timers fire."""
        self.clock.advance(delta_ms)
        for uuid in sorted(self.nodes) if uuids is None else uuids:
            node = self.node(uuid)
            if node.core is not None:
                node.core.tick()
                self.process(node)

    # --- effects ----------------------------------------------------------------------------

    def process(self, node: Node) -> None:
        """Executes a replica's effects in order, and reports log durability to the core."""
        core = node.running()
        while True:
            for effect in core.drain_effects():
                self._execute(node, effect)
            durable = node.log.durable_index()
            if durable <= node.reported_durable:
                node.reported_durable = durable  # a truncation lowered it
                return
            node.reported_durable = durable
            core.on_log_durable(durable)

    def sync(self, uuid: str, up_to_index: int | None = None) -> None:
        """Makes a replica's log durable (up to an index) and reports it to its core."""
        node = self.node(uuid)
        node.log.sync(up_to_index)
        self.process(node)

    def sync_all(self) -> None:
        """Makes every running replica's log fully durable."""
        for uuid, node in sorted(self.nodes.items()):
            if node.alive:
                self.sync(uuid)

    def _execute(
        self,
        node: Node,
        effect: Effect,
    ) -> None:
        match effect:
            case Send(message):
                self.queue.append(message)
            case Apply(first, last):
                assert first == len(node.applied) + 1, (node.uuid, first, len(node.applied))
                node.applied.extend(node.log.entry(i) for i in range(first, last + 1))
            case RoleChanged(role, term, leader):
                self.events.append(f"{node.uuid}: {role.value} term={term} leader={leader or '-'}")
            case LogTruncated(from_index):
                self.events.append(f"{node.uuid}: log truncated from index {from_index}")
            case ConfigCommitted(config):
                self.events.append(f"{node.uuid}: config committed {config.describe()}")
            case ReadReady(read_id, index):
                node.reads[read_id] = index
                self.events.append(f"{node.uuid}: read {read_id} ready at index {index}")
            case ReadFailed(read_id, reason):
                node.reads[read_id] = f"failed {reason}"
                self.events.append(f"{node.uuid}: read {read_id} failed {reason}")

    def drain_events(self) -> list[str]:
        """Events since the last call."""
        out, self.events = self.events, []
        return out

    def elect(self, uuid: str) -> None:
        """``uuid`` campaigns and every message is delivered until it leads."""
        self.node(uuid).running().campaign()
        self.process(self.node(uuid))
        self.deliver_all()
        assert self.leaders() == [uuid], self.leaders()

    def leaders(self) -> list[str]:
        """Running replicas that believe they lead, by term."""
        found = [
            (n.core.term, n.uuid)
            for n in self.nodes.values()
            if n.core is not None and n.core.role.value == "LEADER"
        ]
        return [uuid for _, uuid in sorted(found)]
