"""The leader master's replica admin operations (master.proto "Replica management").

Every operation is declarative: it reads the tablet's committed config from the tablet leader
itself (the master's record may lag by a heartbeat), compares it with the wanted state, and
sends the leader at most one step (``ChangeConfig`` with a CAS on that config's op index, or a
``LeaderStepDown``). The answer says whether the wanted state holds (``done``); callers repeat
the same request until it does. Nothing is remembered between calls except the set of retired
tablet servers, which is a sys-catalog record (a new leader master loads it with the catalog),
so every operation is safe to retry after a master failover.

Moves reuse re-replication: the new replica joins as a NON_VOTER with ``promote`` and the old
one gets the ``replace`` attribute in the same config entry (``more_changes``), and the policy
evicts the old one only once the replacement votes and only with a healthy majority left
(``nyala.master.rereplication``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

from nyala._proto import consensus_pb2, consensus_pb2_grpc, master_pb2, metadata_pb2
from nyala.errors import (
    CasFailedError,
    IllegalStateError,
    InvalidArgumentError,
    NotFoundError,
    ServiceUnavailableError,
)
from nyala.master.catalog_manager import CatalogManager
from nyala.master.sys_catalog import CatalogRecord
from nyala.rpc import ServerProxy
from nyala.rpc.messages import Answer

log = logging.getLogger(__name__)

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp", bound=Answer)

#: Deadline of one RPC to a tablet leader, in milliseconds.
ADMIN_RPC_TIMEOUT_MS = 10_000
_VOTER = metadata_pb2.VOTER
_NON_VOTER = metadata_pb2.NON_VOTER


@dataclass(frozen=True)
class Outcome:
    """The answer of one admin call."""

    done: bool
    message: str

    def to_pb(self) -> master_pb2.ReplicaAdminResponsePB:
        """The ``ReplicaAdminResponsePB``."""
        return master_pb2.ReplicaAdminResponsePB(done=self.done, message=self.message)


@dataclass
class _Tablet:
    """A tablet's leader and its committed config, as the leader reports them now."""

    tablet_id: str
    leader_uuid: str
    leader_addr: str
    config: metadata_pb2.RaftConfigPB

    @property
    def cas(self) -> int:
        return int(self.config.opid_index) if self.config.HasField("opid_index") else -1

    def peer(self, uuid: str) -> metadata_pb2.RaftPeerPB | None:
        return next((p for p in self.config.peers if p.permanent_uuid == uuid), None)


class ReplicaAdmin:
    """The operations; one per master, used only while it leads."""

    def __init__(self, manager: CatalogManager) -> None:
        self._m = manager

    # --- helpers ----------------------------------------------------------------------------

    def _ts_addr(self, ts_uuid: str) -> str:
        ts = self._m.ts_manager.get(ts_uuid)
        if ts is None:
            raise NotFoundError(f"tablet server {ts_uuid} is unknown to the master")
        return ts.rpc_addr

    async def _call(
        self,
        addr: str,
        method: Callable[
            [consensus_pb2_grpc.ConsensusServiceAsyncStub],
            grpc.aio.UnaryUnaryMultiCallable[_Req, _Resp],
        ],
        request: _Req,
    ) -> _Resp:
        """``method`` (of the ConsensusService stub) of the server at ``addr``."""
        async with ServerProxy(addr, self._m.settings.rpc_settings()) as proxy:
            return await proxy.admin_call(
                method(proxy.consensus), request, timeout_ms=ADMIN_RPC_TIMEOUT_MS
            )

    async def _tablet(self, tablet_id: str) -> _Tablet:
        catalog = self._m.require_leader()
        info = catalog.tablets_by_id.get(tablet_id)
        if info is None or not info.is_live:
            raise NotFoundError(f"tablet {tablet_id} does not exist")
        leader = info.pb.consensus_state.leader_uuid
        if not leader:
            raise ServiceUnavailableError(f"tablet {tablet_id} has no known leader; retry")
        addr = self._ts_addr(leader)
        request = consensus_pb2.GetConsensusStateRequestPB(dest_uuid=leader, tablet_ids=[tablet_id])
        answer = await self._call(addr, lambda stub: stub.GetConsensusState, request)
        cstate = answer.tablets[0].cstate
        if cstate.leader_uuid != leader:
            raise ServiceUnavailableError(f"tablet {tablet_id}: leadership is moving; retry")
        if cstate.HasField("pending_config"):
            raise ServiceUnavailableError(f"tablet {tablet_id}: a config change is pending; retry")
        return _Tablet(tablet_id, leader, addr, cstate.committed_config)

    async def _change(
        self,
        tablet: _Tablet,
        kind: consensus_pb2.ChangeConfigType.ValueType,
        peer: metadata_pb2.RaftPeerPB,
        what: str,
        more: tuple[consensus_pb2.ConfigChangeItemPB, ...] = (),
    ) -> Outcome:
        """Sends one change (with ``more`` in the same config entry) with a CAS on the config
        it was decided from. A config that moved on meanwhile is not an error: the caller
        repeats, and the next call decides again from the newer config."""
        request = consensus_pb2.ChangeConfigRequestPB(
            dest_uuid=tablet.leader_uuid,
            tablet_id=tablet.tablet_id,
            type=kind,
            server=peer,
            cas_config_opid_index=tablet.cas,
            more_changes=more,
        )
        try:
            await self._call(tablet.leader_addr, lambda stub: stub.ChangeConfig, request)
        except CasFailedError as exc:
            log.info("tablet %s: %s not sent: %s", tablet.tablet_id, what, exc)
            return Outcome(False, f"the config changed before {what}; repeat")
        log.info("tablet %s: %s", tablet.tablet_id, what)
        return Outcome(False, f"{what} (sent; repeat until done)")

    def _new_peer(
        self, ts_uuid: str, member_type: metadata_pb2.MemberType.ValueType, *, promote: bool
    ) -> metadata_pb2.RaftPeerPB:
        ts = self._m.ts_manager.get(ts_uuid)
        if ts is None or not self._m.ts_manager.is_live(ts):
            raise InvalidArgumentError(f"tablet server {ts_uuid} is not live")
        peer = metadata_pb2.RaftPeerPB(permanent_uuid=ts_uuid, member_type=member_type)
        peer.attrs.promote = promote
        peer.last_known_addr.CopyFrom(ts.registration.rpc_addr)
        return peer

    async def _step_down(self, tablet: _Tablet, new_leader: str = "") -> Outcome:
        request = consensus_pb2.LeaderStepDownRequestPB(
            dest_uuid=tablet.leader_uuid,
            tablet_id=tablet.tablet_id,
            mode=consensus_pb2.GRACEFUL,
            new_leader_uuid=new_leader,
        )
        await self._call(tablet.leader_addr, lambda stub: stub.LeaderStepDown, request)
        return Outcome(False, f"asked leader {tablet.leader_uuid} to step down; repeat")

    # --- operations -------------------------------------------------------------------------

    async def add_replica(
        self, tablet_id: str, ts_uuid: str, member_type: metadata_pb2.MemberType.ValueType
    ) -> Outcome:
        """AddReplica: done once ``ts_uuid`` is in the config with the wanted type."""
        tablet = await self._tablet(tablet_id)
        wanted = member_type or _VOTER
        peer = tablet.peer(ts_uuid)
        if peer is not None:
            if peer.member_type == wanted:
                return Outcome(True, f"{ts_uuid} is a {_name(wanted)} of {tablet_id}")
            if wanted == _VOTER and peer.attrs.promote:
                return Outcome(False, f"{ts_uuid} is catching up; it is promoted once caught up")
            raise IllegalStateError(
                f"{ts_uuid} is a {_name(peer.member_type)} already: use ChangeReplicaType"
            )
        new = self._new_peer(ts_uuid, _NON_VOTER, promote=wanted == _VOTER)
        return await self._change(tablet, consensus_pb2.ADD_PEER, new, f"adding {ts_uuid}")

    async def remove_replica(self, tablet_id: str, ts_uuid: str) -> Outcome:
        """RemoveReplica: done once ``ts_uuid`` is not in the config."""
        tablet = await self._tablet(tablet_id)
        if tablet.peer(ts_uuid) is None:
            return Outcome(True, f"{ts_uuid} holds no replica of {tablet_id}")
        if ts_uuid == tablet.leader_uuid:
            return await self._step_down(tablet)
        peer = metadata_pb2.RaftPeerPB(permanent_uuid=ts_uuid)
        return await self._change(tablet, consensus_pb2.REMOVE_PEER, peer, f"removing {ts_uuid}")

    async def change_replica_type(
        self,
        tablet_id: str,
        ts_uuid: str,
        member_type: metadata_pb2.MemberType.ValueType,
        *,
        force: bool = False,
    ) -> Outcome:
        """ChangeReplicaType: done once ``ts_uuid`` has ``member_type``. The leader's type is
        refused (Kudu's rule) unless ``force``: then it hands leadership over first."""
        if member_type not in (_VOTER, _NON_VOTER):
            raise InvalidArgumentError("member_type must be VOTER or NON_VOTER")
        tablet = await self._tablet(tablet_id)
        peer = tablet.peer(ts_uuid)
        if peer is None:
            raise NotFoundError(f"{ts_uuid} holds no replica of {tablet_id}")
        if peer.member_type == member_type:
            return Outcome(True, f"{ts_uuid} is a {_name(member_type)} of {tablet_id}")
        if ts_uuid == tablet.leader_uuid:
            if not force:
                raise IllegalStateError(
                    f"{ts_uuid} leads {tablet_id}: the leader's type is not changed (step it "
                    "down first, or force it: it then hands leadership over)"
                )
            return await self._step_down(tablet)
        new = metadata_pb2.RaftPeerPB(permanent_uuid=ts_uuid, member_type=member_type)
        new.last_known_addr.CopyFrom(peer.last_known_addr)
        what = f"making {ts_uuid} a {_name(member_type)}"
        return await self._change(tablet, consensus_pb2.MODIFY_PEER, new, what)

    async def move_replica(self, tablet_id: str, from_uuid: str, to_uuid: str) -> Outcome:
        """MoveReplica: add ``to`` (promoted when caught up), mark ``from`` for replacement;
        re-replication evicts it. Done once ``from`` is gone and ``to`` votes."""
        if from_uuid == to_uuid:
            raise InvalidArgumentError("a replica cannot move onto its own server")
        tablet = await self._tablet(tablet_id)
        old, new = tablet.peer(from_uuid), tablet.peer(to_uuid)
        if old is None:
            if new is not None and new.member_type == _VOTER:
                return Outcome(True, f"{tablet_id} moved from {from_uuid} to {to_uuid}")
            if new is None:
                raise IllegalStateError(f"neither {from_uuid} nor {to_uuid} holds {tablet_id}")
            return Outcome(False, f"{to_uuid} is catching up")
        marked = metadata_pb2.RaftPeerPB()
        marked.CopyFrom(old)
        marked.attrs.replace = True
        mark = consensus_pb2.ConfigChangeItemPB(type=consensus_pb2.MODIFY_PEER, server=marked)
        if new is None:
            # The new replica joins and the old one is marked in one config entry: were they
            # two, the new one could be promoted in between, and re-replication would take the
            # unmarked extra voter for over-replication (and might evict the new one).
            peer = self._new_peer(to_uuid, _NON_VOTER, promote=True)
            what = f"adding {to_uuid}"
            if not old.attrs.replace:
                what += f" and marking {from_uuid} for replacement"
            more = () if old.attrs.replace else (mark,)
            return await self._change(tablet, consensus_pb2.ADD_PEER, peer, what, more)
        if not old.attrs.replace:
            what = f"marking {from_uuid} for replacement"
            return await self._change(tablet, consensus_pb2.MODIFY_PEER, marked, what)
        self._m.wake.set()
        return Outcome(False, f"waiting for {to_uuid} to vote and {from_uuid} to be evicted")

    async def leader_step_down(self, tablet_id: str, abrupt: bool, new_leader: str) -> Outcome:
        """TabletLeaderStepDown: done once the leader changed (or is ``new_leader``)."""
        if abrupt and new_leader:
            raise InvalidArgumentError("new_leader_uuid needs a graceful step-down")
        tablet = await self._tablet(tablet_id)
        if new_leader and tablet.leader_uuid == new_leader:
            return Outcome(True, f"{new_leader} leads {tablet_id}")
        request = consensus_pb2.LeaderStepDownRequestPB(
            dest_uuid=tablet.leader_uuid,
            tablet_id=tablet_id,
            mode=consensus_pb2.ABRUPT if abrupt else consensus_pb2.GRACEFUL,
            new_leader_uuid=new_leader,
        )
        await self._call(tablet.leader_addr, lambda stub: stub.LeaderStepDown, request)
        return Outcome(not new_leader, f"leader {tablet.leader_uuid} asked to step down")

    async def retire_tserver(self, ts_uuid: str) -> Outcome:
        """RetireTabletServer: keep new replicas off ``ts_uuid`` and mark each of its replicas
        for replacement. Done once no live tablet has a replica there."""
        catalog = self._m.require_leader()
        if self._m.ts_manager.get(ts_uuid) is None:
            raise NotFoundError(f"tablet server {ts_uuid} is unknown to the master")
        await self._persist_retired(ts_uuid)
        remaining = [
            t.tablet_id
            for t in catalog.tablets_by_id.values()
            if t.is_live
            and any(
                p.permanent_uuid == ts_uuid for p in t.pb.consensus_state.committed_config.peers
            )
        ]
        for tablet_id in remaining:
            tablet = await self._tablet(tablet_id)
            peer = tablet.peer(ts_uuid)
            if peer is None or peer.attrs.replace:
                continue
            marked = metadata_pb2.RaftPeerPB()
            marked.CopyFrom(peer)
            marked.attrs.replace = True
            await self._change(tablet, consensus_pb2.MODIFY_PEER, marked, f"retiring {ts_uuid}")
        self._m.wake.set()
        if remaining:
            return Outcome(False, f"{len(remaining)} tablets still have a replica on {ts_uuid}")
        return Outcome(True, f"{ts_uuid} holds no replicas: retired")

    async def _persist_retired(self, ts_uuid: str) -> None:
        """Replicates the retired mark before any replica is moved (so placement on any later
        leader master keeps new replicas off the server), then adds it to the in-memory set."""
        async with self._m.lock:
            self._m.require_leader()
            if ts_uuid in self._m.retired_tservers:
                return
            record = master_pb2.SysTServerEntryPB(
                ts_uuid=ts_uuid, retired=True, retire_time_us=time.time_ns() // 1000
            )
            await self._m.replicate([CatalogRecord.tserver(record)])
            self._m.retired_tservers.add(ts_uuid)
        log.info("tablet server %s retired", ts_uuid)

    async def change_replication_factor(
        self, ident: master_pb2.TableIdentifierPB, num_replicas: int
    ) -> Outcome:
        """ChangeReplicationFactor: the table's record first, then re-replication adds or
        evicts. Done once every tablet has that many voters."""
        if num_replicas < 1 or num_replicas % 2 == 0:
            raise InvalidArgumentError(f"replication factor {num_replicas} must be odd")
        async with self._m.lock:
            catalog = self._m.require_leader()
            table = catalog.table(ident)
            if table.pb.num_replicas != num_replicas:
                live = len(self._m.ts_manager.live())
                if num_replicas > live:
                    raise InvalidArgumentError(
                        f"replication factor {num_replicas} is more than the {live} live "
                        "tablet servers"
                    )
                record = master_pb2.SysTableEntryPB()
                record.CopyFrom(table.pb)
                record.num_replicas = num_replicas
                await self._m.replicate([CatalogRecord.table(record)])
                catalog.commit_table(record)
        self._m.wake.set()
        short = [
            t.tablet_id
            for t in table.live_tablets()
            if sum(
                1 for p in t.pb.consensus_state.committed_config.peers if p.member_type == _VOTER
            )
            != num_replicas
        ]
        if short:
            return Outcome(False, f"{len(short)} tablets not at {num_replicas} voters yet")
        return Outcome(True, f"every tablet of {table.name} has {num_replicas} voters")


def _name(member_type: metadata_pb2.MemberType.ValueType) -> str:
    return metadata_pb2.MemberType.Name(member_type)
