"""Tablet copy's consensus-metadata merge (seed 000, "Consensus metadata merge") and tombstoned
voting with the merged cmeta and the tombstone's last-logged OpId."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nyala.consensus.messages import VoteDenial, VoteRequest
from nyala.consensus.metadata import ConsensusMetadata
from nyala.consensus.runtime.cmeta_store import FileCmetaStore
from nyala.consensus.runtime.wal_log import WalLogOptions
from nyala.consensus.types import OpId, RaftConfig, RaftPeer
from nyala.errors import TabletNotFoundError
from nyala.schema import Column, Schema
from nyala.tablet.copy_cmeta import merge_cmeta
from nyala.tablet.copy_vote import tombstoned_vote
from nyala.tablet.manager import TabletDirs
from nyala.tablet.replica import TabletReplica
from nyala.tablet.superblock import DataState, Partition, Superblock

OLD = RaftConfig((RaftPeer("a", "h:1"), RaftPeer("b", "h:2"), RaftPeer("c", "h:3")), 5)
NEW = RaftConfig((RaftPeer("a", "h:1"), RaftPeer("b", "h:2"), RaftPeer("d", "h:4")), 9)


def test_no_local_cmeta_adopts_remote_term_and_config_but_not_its_vote() -> None:
    merged = merge_cmeta(None, ConsensusMetadata(4, "b", NEW))
    assert merged == ConsensusMetadata(4, None, NEW)


def test_higher_remote_term_wins_and_drops_the_local_vote() -> None:
    merged = merge_cmeta(ConsensusMetadata(3, "c", OLD), ConsensusMetadata(7, "a", NEW))
    assert merged == ConsensusMetadata(7, None, NEW)


def test_equal_terms_keep_the_local_vote_and_adopt_the_remote_config() -> None:
    merged = merge_cmeta(ConsensusMetadata(7, "c", OLD), ConsensusMetadata(7, "a", NEW))
    assert merged == ConsensusMetadata(7, "c", NEW)


def test_lower_remote_term_keeps_local_term_and_vote() -> None:
    merged = merge_cmeta(ConsensusMetadata(9, "c", OLD), ConsensusMetadata(6, None, NEW))
    assert merged == ConsensusMetadata(9, "c", NEW)


@given(
    local_term=st.integers(0, 50),
    remote_term=st.integers(0, 50),
    local_vote=st.sampled_from([None, "a", "c"]),
    remote_vote=st.sampled_from([None, "b", "d"]),
)
def test_merge_never_lowers_the_term_nor_forgets_a_vote_in_it(
    local_term: int, remote_term: int, local_vote: str | None, remote_vote: str | None
) -> None:
    local = ConsensusMetadata(local_term, local_vote, OLD)
    merged = merge_cmeta(local, ConsensusMetadata(remote_term, remote_vote, NEW))
    assert merged.current_term == max(local_term, remote_term)
    assert merged.committed_config == NEW
    if merged.current_term == local_term:
        assert merged.voted_for == local_vote  # never amnesiac about a vote in its term
    else:
        assert merged.voted_for is None  # the remote's vote is not ours


SCHEMA = Schema([Column("id", "int64")], ["id"])
TABLET = "e" * 32


def _tombstone(tmp_path: Path, last: OpId, meta: ConsensusMetadata | None) -> TabletReplica:
    dirs = TabletDirs(tmp_path / "tm", tmp_path / "cm", tmp_path / "w", tmp_path / "d")
    for d in (dirs.tablet_meta, dirs.consensus_meta, dirs.wals, dirs.data):
        d.mkdir()
    sb = Superblock(TABLET, "t", "t", SCHEMA, Partition(), OLD, DataState.TOMBSTONED, last)
    replica = TabletReplica(sb, dirs.paths(TABLET), WalLogOptions())
    if meta is not None:
        FileCmetaStore(replica.paths.cmeta).save(meta)
    return replica


def _ask(replica: TabletReplica, term: int, last: OpId, *, pre: bool = False, src: str = "a"):
    return tombstoned_vote(replica, VoteRequest(src, "b", term, last, pre_election=pre))


def test_tombstone_grants_an_up_to_date_candidate_and_saves_the_vote_first(
    tmp_path: Path,
) -> None:
    replica = _tombstone(tmp_path, OpId(3, 40), ConsensusMetadata(3, None, OLD))
    answer = _ask(replica, 4, OpId(3, 40))
    assert answer.granted
    assert answer.term == 4
    assert FileCmetaStore(replica.paths.cmeta).load() == ConsensusMetadata(4, "a", OLD)
    # The same candidate again: granted; another candidate in that term: refused.
    assert _ask(replica, 4, OpId(3, 40)).granted
    other = _ask(replica, 4, OpId(3, 50), src="c")
    assert not other.granted
    assert other.denial is VoteDenial.ALREADY_VOTED


def test_tombstone_refuses_a_candidate_behind_its_last_logged_opid(tmp_path: Path) -> None:
    replica = _tombstone(tmp_path, OpId(3, 40), ConsensusMetadata(3, None, OLD))
    answer = _ask(replica, 5, OpId(3, 39))
    assert not answer.granted
    assert answer.denial is VoteDenial.LAST_OPID_TOO_OLD
    # The higher term was still adopted (and saved) before answering.
    assert FileCmetaStore(replica.paths.cmeta).load() == ConsensusMetadata(5, None, OLD)


def test_tombstone_refuses_a_stale_term_and_prevotes_change_nothing(tmp_path: Path) -> None:
    replica = _tombstone(tmp_path, OpId(3, 40), ConsensusMetadata(6, "c", OLD))
    stale = _ask(replica, 5, OpId(9, 99))
    assert not stale.granted
    assert stale.denial is VoteDenial.TERM_TOO_OLD
    assert stale.term == 6
    assert _ask(replica, 7, OpId(3, 40), pre=True).granted
    assert FileCmetaStore(replica.paths.cmeta).load() == ConsensusMetadata(6, "c", OLD)


def test_tombstone_without_cmeta_cannot_vote(tmp_path: Path) -> None:
    replica = _tombstone(tmp_path, OpId(0, 0), None)
    with pytest.raises(TabletNotFoundError):
        _ask(replica, 1, OpId(0, 0))
