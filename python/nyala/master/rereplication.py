"""Re-replication: the leader master's policy that keeps every tablet at its voter count.

Seed 000 ("Master implementation for adding a new peer"): the master stores nothing about the
changes it drives. Each pass looks at the committed tablet records (configs as the replicas
reported them), at tserver liveness and at the tablet reports, and sends the tablet's leader at
most one idempotent ``ChangeConfig`` carrying the committed config's op index (CAS). A change
that already happened, or was overtaken, fails its CAS and the next pass decides again from the
newer config; nothing is retried blindly, so a new leader master simply carries on.

A voter is *bad* when its tserver has not heartbeated for
``follower_unavailable_considered_failed_sec``, when its own tserver reports the replica FAILED,
when the tablet's leader reports it FAILED or FAILED_UNRECOVERABLE (the per-peer health of the
leader's tablet report: unreachable for the failure timeout, its replica FAILED, or a tablet
copy it needs refused; this catches a replica that cannot serve on a tserver that heartbeats
normally), or when its ``replace`` attribute is set (replaced even though healthy). The
default mode is 3-4-3 (``prepare_replacement_before_eviction``): add a NON_VOTER with
``promote`` on a live tserver chosen by the placement policy, let the leader copy and promote
it, and only then evict the bad voter. The 3-2-3 mode evicts first. In both modes nothing is
ever evicted unless the voters left behind still hold a healthy majority, and the leader is
never evicted (it is asked to step down first). The evicted replica is tombstoned by the
catalog manager when it reports again (CAS on the config's op index: it can only delete a
replica that is really out of the config).

This module owns only the decision (``decide``, pure) and the pass over the catalog
(``Rereplicator.plan``); the background tasks send the RPCs.
"""

from __future__ import annotations

import enum
import random
import time
from dataclasses import dataclass

from nyala._proto import consensus_pb2, master_pb2, metadata_pb2
from nyala.master.catalog import TabletInfo
from nyala.master.catalog_manager import CatalogManager
from nyala.master.placement import choose_replicas

_FAILED = metadata_pb2.FAILED
_LEADER_SAYS_FAILED = (master_pb2.HEALTH_FAILED, master_pb2.HEALTH_FAILED_UNRECOVERABLE)


class Action(enum.Enum):
    """What one pass does to one tablet."""

    NONE = "none"
    ADD = "add"  # add a NON_VOTER with promote on a new server
    EVICT = "evict"  # remove `uuid` from the config
    STEP_DOWN = "step_down"  # the leader must be evicted: hand leadership over first


@dataclass(frozen=True)
class Decision:
    """The outcome of ``decide`` for one tablet."""

    action: Action
    uuid: str = ""  # EVICT: the peer to remove; STEP_DOWN: the leader
    reason: str = ""


@dataclass(frozen=True)
class PeerView:
    """One peer of a committed config as the policy sees it."""

    uuid: str
    voter: bool
    promote: bool
    replace: bool
    failed: bool
    # Heard from within the liveness window (shorter than the failure timeout): only such
    # peers count towards the healthy majority an eviction must leave behind.
    live: bool = True


def _majority(voters: int) -> int:
    return voters // 2 + 1


def _can_evict(peers: list[PeerView], uuid: str) -> bool:
    """The tablet has a healthy majority now, and the voters left after removing ``uuid``
    still hold one of themselves."""
    voters = [p for p in peers if p.voter]
    if sum(1 for p in voters if p.live and not p.failed) < _majority(len(voters)):
        return False
    remaining = [p for p in voters if p.uuid != uuid]
    healthy = [p for p in remaining if p.live and not p.failed]
    return bool(remaining) and len(healthy) >= _majority(len(remaining))


def decide(
    peers: list[PeerView],
    leader_uuid: str,
    target_voters: int,
    *,
    evict_first: bool,
    evict_excess: bool = True,
) -> Decision:
    """The one change to make to a tablet whose committed config is ``peers`` (pure).

    One change at a time (Raft's one-by-one rule): while a NON_VOTER is being promoted nothing
    else is added, and a removal waits for the config it is based on to be the committed one.
    ``evict_excess`` False (``catalog_manager_evict_excess_replicas``) keeps healthy voters
    beyond the replication factor, such as one an operator added.
    """
    voters = [p for p in peers if p.voter]
    promoting = [p for p in peers if not p.voter and p.promote]
    for peer in promoting:
        if peer.failed:
            # A replacement that died while catching up: drop it (no effect on the majority).
            return Decision(Action.EVICT, peer.uuid, "replacement non-voter failed")
    bad = sorted((p for p in voters if p.failed or p.replace), key=lambda p: not p.failed)
    good_voters = len(voters) - len(bad)
    if bad and (good_voters >= target_voters or evict_first):
        decision = _evict_one(peers, bad, leader_uuid)
        if decision.action is not Action.NONE:
            return decision
    if evict_excess and not bad and len(voters) > target_voters and not promoting:
        # Over-replicated (the replication factor was lowered): drop a non-leader voter.
        extra = [p for p in voters if p.uuid != leader_uuid]
        if extra and _can_evict(peers, extra[-1].uuid):
            return Decision(Action.EVICT, extra[-1].uuid, "more voters than the table wants")
    if good_voters + len(promoting) < target_voters and not promoting:
        return Decision(Action.ADD, reason=f"{good_voters} good voters of {target_voters}")
    return Decision(Action.NONE)


def _evict_one(peers: list[PeerView], bad: list[PeerView], leader_uuid: str) -> Decision:
    for peer in bad:
        why = "failed" if peer.failed else "marked for replacement"
        if peer.uuid == leader_uuid:
            continue
        if _can_evict(peers, peer.uuid):
            return Decision(Action.EVICT, peer.uuid, f"voter {why}")
    if any(p.uuid == leader_uuid for p in bad) and _can_evict(peers, leader_uuid):
        return Decision(Action.STEP_DOWN, leader_uuid, "the leader is to be replaced")
    return Decision(Action.NONE)


@dataclass(frozen=True)
class PlannedChange:
    """One RPC to the leader of a tablet, decided by ``Rereplicator.plan``."""

    tablet_id: str
    leader_uuid: str
    decision: Decision
    # ChangeConfigRequestPB (ADD/EVICT) or LeaderStepDownRequestPB (STEP_DOWN).
    request: consensus_pb2.ChangeConfigRequestPB | consensus_pb2.LeaderStepDownRequestPB


class Rereplicator:
    """The pass over the catalog; the leader master's background tasks call ``plan``."""

    def __init__(self, manager: CatalogManager, rng: random.Random | None = None) -> None:
        self._m = manager
        self._rng = rng or random.Random()
        # An unknown tserver counts as failed only once this master has listened this long.
        self._started_s = time.monotonic()

    @property
    def _failed_ms(self) -> int:
        return int(self._m.settings.follower_unavailable_considered_failed_sec) * 1000

    def server_failed(self, ts_uuid: str) -> bool:
        """Not heard from for ``follower_unavailable_considered_failed_sec`` (or never, once
        this master has been up that long)."""
        ts = self._m.ts_manager.get(ts_uuid)
        if ts is None:
            return (time.monotonic() - self._started_s) * 1000 > self._failed_ms
        return bool(ts.millis_since_heartbeat() > self._failed_ms)

    def server_live(self, ts_uuid: str) -> bool:
        """Heard from within the tserver liveness window."""
        ts = self._m.ts_manager.get(ts_uuid)
        return ts is not None and bool(self._m.ts_manager.is_live(ts))

    def leader_health(self, tablet: TabletInfo) -> dict[str, int]:
        """The per-peer health (``PeerHealth`` values) in the last report of the tablet's
        recorded leader, if that report is its own as leader of the recorded term or later."""
        cstate = tablet.pb.consensus_state
        leader = cstate.leader_uuid
        reported = self._m.reports.get(tablet.tablet_id, {}).get(leader)
        if not leader or reported is None or not reported.HasField("consensus_state"):
            return {}
        rc = reported.consensus_state
        if rc.leader_uuid != leader or rc.current_term < cstate.current_term:
            return {}
        return {h.permanent_uuid: int(h.health) for h in reported.peer_health}

    def peer_views(self, tablet: TabletInfo) -> list[PeerView]:
        """The committed config of ``tablet`` with each peer's health."""
        reports = self._m.reports.get(tablet.tablet_id, {})
        health = self.leader_health(tablet)
        out = []
        for peer in tablet.pb.consensus_state.committed_config.peers:
            reported = reports.get(peer.permanent_uuid)
            replica_failed = reported is not None and reported.state == _FAILED
            replica_failed |= health.get(peer.permanent_uuid) in _LEADER_SAYS_FAILED
            out.append(
                PeerView(
                    uuid=peer.permanent_uuid,
                    voter=peer.member_type == metadata_pb2.VOTER,
                    promote=peer.attrs.promote,
                    replace=peer.attrs.replace,
                    failed=replica_failed or self.server_failed(peer.permanent_uuid),
                    live=self.server_live(peer.permanent_uuid),
                )
            )
        return out

    def plan(self) -> list[PlannedChange]:
        """At most one change per RUNNING tablet whose leader is live."""
        catalog = self._m.catalog
        evict_first = not self._m.settings.prepare_replacement_before_eviction
        load = catalog.replica_counts()
        out: list[PlannedChange] = []
        for tablet in list(catalog.tablets_by_id.values()):
            if tablet.pb.state != master_pb2.SYS_TABLET_RUNNING:
                continue
            table = catalog.tables_by_id.get(tablet.pb.table_id)
            leader = tablet.pb.consensus_state.leader_uuid
            if table is None or table.is_removed or not leader or self.server_failed(leader):
                continue
            peers = self.peer_views(tablet)
            decision = decide(
                peers,
                leader,
                int(table.pb.num_replicas),
                evict_first=evict_first,
                evict_excess=self._m.settings.catalog_manager_evict_excess_replicas,
            )
            change = self._change(tablet, leader, decision, load)
            if change is not None:
                out.append(change)
        return out

    def _change(
        self, tablet: TabletInfo, leader: str, decision: Decision, load: dict[str, int]
    ) -> PlannedChange | None:
        config = tablet.pb.consensus_state.committed_config
        cas = int(config.opid_index) if config.HasField("opid_index") else -1
        if decision.action is Action.NONE:
            return None
        if decision.action is Action.STEP_DOWN:
            step_down = consensus_pb2.LeaderStepDownRequestPB(
                dest_uuid=leader, tablet_id=tablet.tablet_id, mode=consensus_pb2.GRACEFUL
            )
            return PlannedChange(tablet.tablet_id, leader, decision, step_down)
        request = consensus_pb2.ChangeConfigRequestPB(
            dest_uuid=leader, tablet_id=tablet.tablet_id, cas_config_opid_index=cas
        )
        if decision.action is Action.EVICT:
            request.type = consensus_pb2.REMOVE_PEER
            request.server.permanent_uuid = decision.uuid
            return PlannedChange(tablet.tablet_id, leader, decision, request)
        new_uuid = self.choose_server(tablet, load)
        if new_uuid is None:
            return None
        ts = self._m.ts_manager.get(new_uuid)
        assert ts is not None, "choose_server picks a registered server"
        request.type = consensus_pb2.ADD_PEER
        request.server.permanent_uuid = new_uuid
        request.server.member_type = metadata_pb2.NON_VOTER
        request.server.attrs.promote = True
        request.server.last_known_addr.CopyFrom(ts.registration.rpc_addr)
        decision = Decision(Action.ADD, new_uuid, decision.reason)
        return PlannedChange(tablet.tablet_id, leader, decision, request)

    def choose_server(self, tablet: TabletInfo, load: dict[str, int]) -> str | None:
        """A live, not retired tserver outside the tablet's config that does not hold a FAILED
        replica of the tablet (no copy can replace that one there) (placement policy)."""
        members = {p.permanent_uuid for p in tablet.pb.consensus_state.committed_config.peers}
        retired: set[str] = self._m.retired_tservers
        reports = self._m.reports.get(tablet.tablet_id, {})
        holds_failed = {uuid for uuid, r in reports.items() if r.state == _FAILED}
        candidates = [
            ts.uuid
            for ts in self._m.ts_manager.live()
            if ts.uuid not in members
            and ts.uuid not in retired
            and ts.uuid not in holds_failed
            and ts.registration is not None
            and not self.server_failed(ts.uuid)
        ]
        if not candidates:
            return None
        return choose_replicas(candidates, load, 1, self._rng)[0]
