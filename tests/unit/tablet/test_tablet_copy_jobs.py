"""StartTabletCopy's checks on the target (seed 000's state table): ALREADY_INPROGRESS for a
repeat, THROTTLED beyond the concurrency bound, a stale caller term refused against a
tombstone's last-logged term, a caller whose view of the replica's last-logged OpId is out of
date refused (seed 000's idempotency), and cancellation of a running job."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nyala.consensus.metadata import ConsensusMetadata
from nyala.consensus.runtime.cmeta_store import FileCmetaStore
from nyala.consensus.types import OpId, RaftConfig, RaftPeer
from nyala.errors import AlreadyInProgressError, IllegalStateError, ThrottledError
from nyala.schema import Column, Schema
from nyala.tablet.copy_io import CopyIoPool
from nyala.tablet.copy_jobs import JobState, TabletCopyJobs
from nyala.tablet.copy_source import CopySessionInfo, DataChunk, DataKind
from nyala.tablet.manager import TabletDirs, TabletManager
from nyala.tablet.replica import TabletReplica
from nyala.tablet.superblock import DataState, Partition, Superblock, write_superblock

SCHEMA = Schema([Column("id", "int64")], ["id"])
CONFIG = RaftConfig((RaftPeer("a", "h:1"),))


class StuckSource:
    """A source whose session never opens (the copy stays RUNNING until cancelled)."""

    async def begin(self, tablet_id: str) -> CopySessionInfo:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def fetch(
        self, session_id: str, kind: DataKind, name: str, offset: int, max_length_bytes: int
    ) -> DataChunk:
        raise AssertionError("no session")

    async def end(self, session_id: str, success: bool) -> None:
        pass


def _manager(tmp_path: Path) -> TabletManager:
    dirs = TabletDirs(tmp_path / "tm", tmp_path / "cm", tmp_path / "w", tmp_path / "d")
    for d in (dirs.tablet_meta, dirs.consensus_meta, dirs.wals, dirs.data):
        d.mkdir()
    return TabletManager(dirs)


def _tombstone(manager: TabletManager, tablet_id: str, last: OpId, term: int) -> None:
    sb = Superblock(
        tablet_id, "t", "t", SCHEMA, Partition(), CONFIG, DataState.TOMBSTONED, last, "test"
    )
    paths = manager.dirs.paths(tablet_id)
    FileCmetaStore(paths.cmeta).save(ConsensusMetadata(term, None, CONFIG))
    write_superblock(paths.superblock, sb)
    manager.open_all()


async def _noop_stop(tablet_id: str) -> None:
    pass


def _noop_start(replica: TabletReplica) -> None:
    pass


def test_start_checks_and_cancel(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    _tombstone(manager, "1" * 32, OpId(5, 70), term=6)

    async def run() -> None:
        jobs = TabletCopyJobs(
            manager,
            connect=lambda uuid, addr: StuckSource(),
            stop_replica=_noop_stop,
            start_replica=_noop_start,
            io=CopyIoPool(1),
            concurrency_max=1,
        )
        async with asyncio.TaskGroup() as group:
            jobs.attach(group)
            # A deposed leader (term 5 < the tombstone's term 6) is refused.
            with pytest.raises(IllegalStateError, match="stale"):
                jobs.start("1" * 32, "src", "h:1", caller_term=5)
            # A caller that saw a running log: the tombstone is not the log it judged.
            with pytest.raises(IllegalStateError, match="probe it again"):
                jobs.start("1" * 32, "src", "h:1", caller_term=6, target_last_op_id=OpId(5, 70))
            job = jobs.start("1" * 32, "src", "h:1", caller_term=6)
            with pytest.raises(AlreadyInProgressError):
                jobs.start("1" * 32, "src", "h:1", caller_term=6)
            with pytest.raises(ThrottledError):
                jobs.start("2" * 32, "src", "h:1", caller_term=1)
            await asyncio.sleep(0.01)
            assert jobs.cancel(job.job_id) is job
            await asyncio.sleep(0.01)
            assert job.state is JobState.CANCELLED
            with pytest.raises(IllegalStateError):
                jobs.cancel(job.job_id)
            # The slot is free again.
            other = jobs.start("2" * 32, "src", "h:1", caller_term=1)
            jobs.cancel(other.job_id)
        assert [j.state for j in jobs.jobs()] == [JobState.CANCELLED, JobState.CANCELLED]

    asyncio.run(run())
    replica = manager.lookup("1" * 32)
    assert replica is not None
    assert replica.superblock.data_state is DataState.TOMBSTONED  # untouched by the refusals
