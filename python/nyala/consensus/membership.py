"""One-by-one membership change: the change requests and the pure rules that turn a committed
config plus a request into the next config (seed 001; DESIGN.md §7).

This module validates and computes; the Raft core decides *when* a change may be proposed
(leader, own-term op committed, nothing pending, CAS) and replicates it.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from nyala.consensus.types import MemberType, RaftConfig, RaftPeer
from nyala.errors import AlreadyPresentError, InvalidArgumentError, NotFoundError


class ChangeType(enum.Enum):
    """The three kinds of one-by-one change."""

    ADD_PEER = "ADD_PEER"
    REMOVE_PEER = "REMOVE_PEER"
    MODIFY_PEER = "MODIFY_PEER"


@dataclass(frozen=True, slots=True)
class PeerChange:
    """One change to one peer, made in the same config entry as a ``ConfigChange``'s own."""

    change_type: ChangeType
    peer: RaftPeer


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """A ChangeConfig request.

    ADD_PEER needs ``peer`` (its member type and attrs as given); REMOVE_PEER needs only
    ``peer.uuid``; MODIFY_PEER replaces the member type and attrs of ``peer.uuid`` with those of
    ``peer`` (the address is kept). ``cas_config_opid_index``, when set, must equal the committed
    config's op index or the change fails with ``CasFailedError``. ``more`` are changes to other
    peers made in the same config entry (Kudu's BulkChangeConfig).
    """

    change_type: ChangeType
    peer: RaftPeer
    cas_config_opid_index: int | None = None
    more: tuple[PeerChange, ...] = ()


def apply_change(config: RaftConfig, change: ConfigChange) -> RaftConfig:
    """The config after ``change`` and its ``more`` (its ``opid_index`` still the old one);
    raises if invalid.

    All of them together add or remove at most one VOTER (the one-by-one rule), and each names
    a different peer.
    """
    steps = (PeerChange(change.change_type, change.peer), *change.more)
    seen: set[str] = set()
    new = config
    for step in steps:
        if step.peer.uuid in seen:
            raise InvalidArgumentError(f"a config change names peer {step.peer.uuid} twice")
        seen.add(step.peer.uuid)
        new = _apply_one(new, step)
    moved = set(config.voters()) ^ set(new.voters())
    if len(moved) > 1:
        raise InvalidArgumentError(
            f"a config change adds or removes one VOTER at a time, not {sorted(moved)}"
        )
    return new


def _apply_one(config: RaftConfig, change: PeerChange) -> RaftConfig:
    uuid = change.peer.uuid
    current = config.peer(uuid)
    if change.change_type is ChangeType.ADD_PEER:
        if current is not None:
            raise AlreadyPresentError(f"peer {uuid} is already a member of the config")
        if not change.peer.address:
            raise InvalidArgumentError(f"ADD_PEER of {uuid} needs an address")
        return replace(config, peers=(*config.peers, change.peer))
    if current is None:
        raise NotFoundError(f"peer {uuid} is not a member of the config")
    if change.change_type is ChangeType.REMOVE_PEER:
        return replace(config, peers=tuple(p for p in config.peers if p.uuid != uuid))
    modified = RaftPeer(
        uuid=uuid,
        address=current.address,
        member_type=change.peer.member_type,
        promote=change.peer.promote,
        replace=change.peer.replace,
    )
    if modified == current:
        raise InvalidArgumentError(f"MODIFY_PEER of {uuid} changes nothing")
    return replace(config, peers=tuple(modified if p.uuid == uuid else p for p in config.peers))


def voters_changed(old: RaftConfig, new: RaftConfig) -> bool:
    """Whether the VOTER set differs."""
    return set(old.voters()) != set(new.voters())


def keeps_live_majority(new: RaftConfig, live_uuids: Collection[str]) -> bool:
    """Whether the VOTERs of ``new`` that are live form a majority of ``new`` (so it can commit)."""
    live = sum(1 for v in new.voters() if v in live_uuids)
    return live >= new.majority()


def unsafe_config(committed: RaftConfig, voter_uuids: Sequence[str]) -> RaftConfig:
    """The config of an UnsafeChangeConfig: only ``voter_uuids``, all VOTERs.

    DANGEROUS: this abandons the Raft majority. Entries committed by the lost replicas may be
    gone for good; use only when a majority of the replicas is permanently lost (seed 001,
    "Restoring availability after catastrophic data loss").
    """
    if not voter_uuids:
        raise InvalidArgumentError("an unsafe config needs at least one VOTER")
    if len(set(voter_uuids)) != len(voter_uuids):
        raise InvalidArgumentError(f"an unsafe config lists a peer twice: {list(voter_uuids)}")
    peers = []
    for uuid in voter_uuids:
        peer = committed.peer(uuid)
        if peer is None:
            raise InvalidArgumentError(f"{uuid} is not in the committed config")
        peers.append(replace(peer, member_type=MemberType.VOTER, promote=False))
    return RaftConfig(peers=tuple(peers), opid_index=committed.opid_index)
