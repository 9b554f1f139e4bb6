"""The conformance suite of the ``RaftLog`` plug-in point (STYLE.md 12).

Every implementation of ``nyala.consensus.log.RaftLog`` -- ``MemoryLog`` now, the Rust
WAL-backed log later -- runs these same tests: subclass ``RaftLogConformance`` in a
``Test...`` class and implement its three hooks. Batches fed to ``append_replicated`` are always
produced by another log of the same implementation (``read_batch``), as on a real leader.
"""

from __future__ import annotations

import pytest

from nyala.consensus.log import RaftLog
from nyala.consensus.types import MIN_OP_ID, EntryKind, OpId
from nyala.errors import CorruptionError, InvalidArgumentError

BIG_BYTES = 1 << 30


class RaftLogConformance:
    """Tests every ``RaftLog`` must pass. Not collected itself (no ``Test`` prefix)."""

    #: True for a log whose appended entries become durable on their own (a background
    #: syncer): a test cannot then see an entry that is "not durable yet".
    syncs_in_background = False

    def new_log(self) -> RaftLog:
        """A fresh, empty log."""
        raise NotImplementedError

    def make_durable(self, log: RaftLog) -> None:
        """Waits until everything appended so far is durable."""
        raise NotImplementedError

    def reopen(self, log: RaftLog) -> RaftLog:
        """Simulates a crash and restart: the log as recovered from storage."""
        raise NotImplementedError

    # --- helpers ----------------------------------------------------------------------------

    def leader_log(self, terms: list[int], payload_bytes: int = 10) -> RaftLog:
        log = self.new_log()
        for i, term in enumerate(terms, start=1):
            log.append(term, EntryKind.WRITE, bytes([i % 256]) * payload_bytes)
        return log

    # --- the leader side ---------------------------------------------------------------------

    def test_empty_log(self) -> None:
        log = self.new_log()
        assert log.last_op_id() == MIN_OP_ID
        assert log.term_at(0) == 0
        assert log.term_at(1) is None
        assert log.durable_index() == 0
        assert log.read_batch(0, BIG_BYTES) is None
        assert list(log.config_entries_after(0)) == []

    def test_append_assigns_consecutive_indexes(self) -> None:
        log = self.new_log()
        assert log.append(1, EntryKind.NO_OP, b"") == OpId(1, 1)
        assert log.append(1, EntryKind.WRITE, b"x") == OpId(1, 2)
        assert log.append(3, EntryKind.WRITE, b"y") == OpId(3, 3)
        assert log.last_op_id() == OpId(3, 3)
        assert [log.term_at(i) for i in range(5)] == [0, 1, 1, 3, None]

    def test_append_refuses_a_lower_term(self) -> None:
        log = self.leader_log([2])
        with pytest.raises(InvalidArgumentError):
            log.append(1, EntryKind.WRITE, b"x")
        assert log.last_op_id() == OpId(2, 1)

    def test_append_many_appends_each_payload_in_turn(self) -> None:
        log = self.leader_log([1])
        assert log.append_many(2, EntryKind.WRITE, [b"a", b"", b"c" * 300], BIG_BYTES) == [
            OpId(2, 2),
            OpId(2, 3),
            OpId(2, 4),
        ]
        assert log.append_many(2, EntryKind.WRITE, [], BIG_BYTES) == []
        with pytest.raises(InvalidArgumentError):
            log.append_many(1, EntryKind.WRITE, [b"x", b"y"], BIG_BYTES)
        assert log.last_op_id() == OpId(2, 4)
        assert log.append(2, EntryKind.WRITE, b"d") == OpId(2, 5)
        batch = log.read_batch(1, BIG_BYTES)
        assert batch is not None
        assert (batch.first_op_id, batch.last_op_id) == (OpId(2, 2), OpId(2, 5))
        follower = self.new_log()
        follower.append_replicated(MIN_OP_ID, log.read_batch(0, BIG_BYTES), 0)
        assert follower.last_op_id() == OpId(2, 5)
        self.make_durable(log)
        recovered = self.reopen(log)
        assert [recovered.term_at(i) for i in range(1, 7)] == [1, 2, 2, 2, 2, None]

    def test_read_batch_respects_the_byte_limit_but_returns_one_entry(self) -> None:
        log = self.leader_log([1] * 10, payload_bytes=100)
        one = log.read_batch(0, 1)
        assert one is not None
        assert (one.first_op_id, one.last_op_id) == (OpId(1, 1), OpId(1, 1))
        batch = log.read_batch(2, 350)
        assert batch is not None
        assert batch.first_op_id == OpId(1, 3)
        assert batch.size_bytes <= 350
        count = batch.last_op_id.index - batch.first_op_id.index + 1
        assert 2 <= count <= 3
        everything = log.read_batch(0, BIG_BYTES)
        assert everything is not None
        assert everything.last_op_id == OpId(1, 10)
        assert everything.size_bytes >= 10 * 100

    def test_read_batch_at_or_after_the_end(self) -> None:
        log = self.leader_log([1, 1])
        assert log.read_batch(2, BIG_BYTES) is None
        with pytest.raises(InvalidArgumentError):
            log.read_batch(3, BIG_BYTES)

    def test_batches_expose_config_entries_only(self) -> None:
        log = self.new_log()
        log.append(1, EntryKind.NO_OP, b"")
        log.append(1, EntryKind.WRITE, b"row data")
        log.append(1, EntryKind.CONFIG_CHANGE, b"config-1")
        log.append(1, EntryKind.WRITE, b"more rows")
        batch = log.read_batch(0, BIG_BYTES)
        assert batch is not None
        assert list(batch.config_entries()) == [(OpId(1, 3), b"config-1")]
        assert list(log.config_entries_after(2)) == [(OpId(1, 3), b"config-1")]
        assert list(log.config_entries_after(3)) == []

    # --- the follower side -------------------------------------------------------------------

    def test_append_replicated_into_an_empty_log(self) -> None:
        leader = self.leader_log([1, 1, 2])
        follower = self.new_log()
        batch = leader.read_batch(0, BIG_BYTES)
        result = follower.append_replicated(MIN_OP_ID, batch, 0)
        assert result.matched
        assert result.last_received == OpId(2, 3)
        assert result.truncated_from is None
        assert follower.last_op_id() == OpId(2, 3)

    def test_heartbeat_matches_without_entries(self) -> None:
        follower = self.leader_log([1, 1])
        result = follower.append_replicated(OpId(1, 2), None, 0)
        assert result.matched
        assert result.last_received == OpId(1, 2)
        assert follower.last_op_id() == OpId(1, 2)

    def test_mismatch_beyond_the_end_hints_the_end(self) -> None:
        follower = self.leader_log([1, 1])
        result = follower.append_replicated(OpId(1, 7), None, 0)
        assert not result.matched
        assert result.hint_index == 3
        assert follower.last_op_id() == OpId(1, 2)

    def test_mismatch_hint_skips_the_conflicting_term(self) -> None:
        follower = self.leader_log([1, 2, 2, 2, 2])
        result = follower.append_replicated(OpId(3, 5), None, 1)
        assert not result.matched
        assert result.hint_index == 2  # the whole run of term 2 at once
        assert follower.last_op_id() == OpId(2, 5)

    def test_mismatch_hint_stops_above_the_commit_index(self) -> None:
        follower = self.leader_log([2, 2, 2, 2])
        result = follower.append_replicated(OpId(3, 4), None, 2)
        assert not result.matched
        assert result.hint_index == 3

    def test_duplicate_batch_is_idempotent(self) -> None:
        leader = self.leader_log([1, 1, 1])
        follower = self.new_log()
        batch = leader.read_batch(0, BIG_BYTES)
        follower.append_replicated(MIN_OP_ID, batch, 0)
        self.make_durable(follower)
        again = follower.append_replicated(MIN_OP_ID, batch, 0)
        assert again.matched
        assert again.truncated_from is None
        assert follower.last_op_id() == OpId(1, 3)
        assert follower.durable_index() == 3

    def test_stale_shorter_batch_keeps_the_longer_matching_log(self) -> None:
        leader = self.leader_log([1, 1, 1, 1])
        follower = self.new_log()
        follower.append_replicated(MIN_OP_ID, leader.read_batch(0, BIG_BYTES), 0)
        short = leader.read_batch(0, 1)
        result = follower.append_replicated(MIN_OP_ID, short, 0)
        assert result.matched
        assert result.last_received == OpId(1, 1)
        assert follower.last_op_id() == OpId(1, 4)

    def test_conflicting_suffix_is_truncated_and_replaced(self) -> None:
        follower = self.leader_log([1, 1, 1, 1])
        self.make_durable(follower)
        leader = self.leader_log([1, 1, 3])
        batch = leader.read_batch(2, BIG_BYTES)
        result = follower.append_replicated(OpId(1, 2), batch, 1)
        assert result.matched
        assert result.truncated_from == 3
        assert result.last_received == OpId(3, 3)
        assert follower.last_op_id() == OpId(3, 3)
        assert follower.term_at(4) is None
        # The replaced entry 3 no longer counts as durable; the new one may already be
        # (synced in the background) or not yet.
        assert follower.durable_index() <= (3 if self.syncs_in_background else 2)
        self.make_durable(follower)
        assert follower.durable_index() == 3

    def test_truncating_committed_entries_is_refused(self) -> None:
        follower = self.leader_log([1, 1, 1])
        leader = self.leader_log([1, 2, 2])
        batch = leader.read_batch(1, BIG_BYTES)
        with pytest.raises(CorruptionError):
            follower.append_replicated(OpId(1, 1), batch, 2)
        assert follower.term_at(2) == 1

    def test_batch_must_follow_the_preceding_entry(self) -> None:
        leader = self.leader_log([1, 1, 1])
        follower = self.leader_log([1])
        batch = leader.read_batch(2, BIG_BYTES)
        with pytest.raises(InvalidArgumentError):
            follower.append_replicated(OpId(1, 1), batch, 0)

    def test_config_entries_survive_replication(self) -> None:
        leader = self.new_log()
        leader.append(1, EntryKind.NO_OP, b"")
        leader.append(1, EntryKind.CONFIG_CHANGE, b"cfg")
        follower = self.new_log()
        follower.append_replicated(MIN_OP_ID, leader.read_batch(0, BIG_BYTES), 0)
        assert list(follower.config_entries_after(-1)) == [(OpId(1, 2), b"cfg")]

    # --- durability -------------------------------------------------------------------------

    def test_durable_entries_survive_a_restart(self) -> None:
        log = self.leader_log([1, 1, 2])
        self.make_durable(log)
        assert log.durable_index() == 3
        reopened = self.reopen(log)
        assert reopened.last_op_id() == OpId(2, 3)
        assert reopened.durable_index() == 3
        assert reopened.append(2, EntryKind.WRITE, b"next") == OpId(2, 4)

    def test_durable_index_never_passes_the_last_entry(self) -> None:
        log = self.leader_log([1, 1])
        assert log.durable_index() <= 2
        self.make_durable(log)
        log.append(1, EntryKind.WRITE, b"x")
        assert log.durable_index() <= log.last_op_id().index
