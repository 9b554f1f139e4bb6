"""The pure rules of a config change (``nyala.consensus.membership.apply_change``) when one
request carries more than one change (``more``, Kudu's BulkChangeConfig): all of them land in
one config, together they add or remove at most one VOTER, and each names another peer."""

from __future__ import annotations

import pytest

from nyala.consensus.membership import ChangeType, ConfigChange, PeerChange, apply_change
from nyala.consensus.types import MemberType, RaftConfig, RaftPeer
from nyala.errors import InvalidArgumentError, NotFoundError

A, B, C, D, E = "a", "b", "c", "d", "e"
CONFIG = RaftConfig(
    peers=tuple(RaftPeer(u, f"{u}:1") for u in (A, B, C)),
    opid_index=7,
)


def _non_voter(uuid: str, *, promote: bool = True) -> RaftPeer:
    return RaftPeer(uuid, f"{uuid}:1", MemberType.NON_VOTER, promote=promote)


def _marked(uuid: str) -> RaftPeer:
    return RaftPeer(uuid, "", MemberType.VOTER, replace=True)


def test_a_move_adds_the_non_voter_and_marks_the_old_voter_in_one_config() -> None:
    change = ConfigChange(
        ChangeType.ADD_PEER,
        _non_voter(D),
        more=(PeerChange(ChangeType.MODIFY_PEER, _marked(B)),),
    )
    new = apply_change(CONFIG, change)
    assert [p.uuid for p in new.peers] == [A, B, C, D]
    assert new.voters() == (A, B, C)
    b, d = new.peer(B), new.peer(D)
    assert b is not None
    assert b.replace
    assert b.address == "b:1"
    assert d is not None
    assert d.promote
    assert not d.is_voter
    assert new.opid_index == CONFIG.opid_index  # the caller stamps the entry's index


@pytest.mark.parametrize(
    ("first", "more"),
    [
        # two voters added
        (
            PeerChange(ChangeType.ADD_PEER, RaftPeer(D, "d:1")),
            PeerChange(ChangeType.ADD_PEER, RaftPeer(E, "e:1")),
        ),
        # one removed, another added: a swap
        (
            PeerChange(ChangeType.REMOVE_PEER, RaftPeer(C, "")),
            PeerChange(ChangeType.ADD_PEER, RaftPeer(D, "d:1")),
        ),
        # one removed, another demoted
        (
            PeerChange(ChangeType.REMOVE_PEER, RaftPeer(C, "")),
            PeerChange(ChangeType.MODIFY_PEER, _non_voter(B, promote=False)),
        ),
    ],
    ids=["two-added", "swap", "removed-and-demoted"],
)
def test_changes_that_add_or_remove_two_voters_together_are_refused(
    first: PeerChange, more: PeerChange
) -> None:
    change = ConfigChange(first.change_type, first.peer, more=(more,))
    with pytest.raises(InvalidArgumentError, match="one VOTER at a time"):
        apply_change(CONFIG, change)


def test_one_voter_added_with_non_voters_changed_alongside_is_allowed() -> None:
    with_non_voter = apply_change(CONFIG, ConfigChange(ChangeType.ADD_PEER, _non_voter(D)))
    change = ConfigChange(
        ChangeType.ADD_PEER,
        RaftPeer(E, "e:1"),
        more=(PeerChange(ChangeType.REMOVE_PEER, RaftPeer(D, "")),),
    )
    new = apply_change(with_non_voter, change)
    assert new.voters() == (A, B, C, E)
    assert new.peer(D) is None


def test_a_peer_named_twice_or_a_missing_peer_fails_the_whole_change() -> None:
    twice = ConfigChange(
        ChangeType.ADD_PEER,
        _non_voter(D),
        more=(PeerChange(ChangeType.MODIFY_PEER, _non_voter(D, promote=False)),),
    )
    with pytest.raises(InvalidArgumentError, match="names peer d twice"):
        apply_change(CONFIG, twice)
    missing = ConfigChange(
        ChangeType.ADD_PEER,
        _non_voter(D),
        more=(PeerChange(ChangeType.MODIFY_PEER, _marked(E)),),
    )
    with pytest.raises(NotFoundError):
        apply_change(CONFIG, missing)
