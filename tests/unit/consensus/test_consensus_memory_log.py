"""``MemoryLog`` through the ``RaftLog`` conformance suite, plus its crash model."""

from __future__ import annotations

from log_conformance import BIG_BYTES, RaftLogConformance

from nyala.consensus.log import RaftLog
from nyala.consensus.memory_log import MemoryLog
from nyala.consensus.types import MIN_OP_ID, EntryKind, OpId


class TestMemoryLog(RaftLogConformance):
    def new_log(self) -> RaftLog:
        return MemoryLog()

    def make_durable(self, log: RaftLog) -> None:
        assert isinstance(log, MemoryLog)
        log.sync()

    def reopen(self, log: RaftLog) -> RaftLog:
        assert isinstance(log, MemoryLog)
        return log.recover()


def test_a_crash_loses_exactly_the_non_durable_tail() -> None:
    log = MemoryLog()
    for i in range(5):
        log.append(1, EntryKind.WRITE, bytes([i]))
    log.sync(3)
    recovered = log.recover()
    assert recovered.last_op_id() == OpId(1, 3)
    assert recovered.durable_index() == 3


def test_sync_on_append_makes_everything_durable_at_once() -> None:
    leader = MemoryLog()
    leader.append(1, EntryKind.WRITE, b"x")
    follower = MemoryLog(sync_on_append=True)
    follower.append_replicated(MIN_OP_ID, leader.read_batch(0, BIG_BYTES), 0)
    assert follower.durable_index() == 1
    assert follower.recover().sync_on_append
