"""Tablet copy, target side: the ``StartTabletCopy`` state machine and the job registry.

``TabletCopyJobs.start`` applies the seed's checks synchronously (seed 000, "Auto-vivifying
Tablet Copy protocol"), then runs the copy as a task of the server's task group:

* a copy of this tablet already running (or a replica ``COPYING``): ``AlreadyInProgressError``;
* the caller's term below the replica's current or last-logged term: ``IllegalStateError`` (a
  deposed leader must not overwrite newer data);
* the request names the replica's last-logged OpId as the caller last heard it
  (``target_last_op_id``, seed 000's idempotency) and the log has moved on since (or was
  tombstoned): ``IllegalStateError``; the caller probes again and asks with what it hears;
* a running ``READY`` replica the caller could still catch up from its log (its last-logged
  index is at or past the caller's first WAL index): ``IllegalStateError``, which also makes a
  leader's repeated request harmless right after a copy finished;
* more than ``concurrency_max`` copies running: ``ThrottledError``.

The job: a ``READY`` replica is tombstoned first; a session is opened on the source; the
superblock is written ``COPYING`` (fsync); cmeta is merged (``copy_cmeta``); rowset files and
WAL segments are downloaded in checked chunks in one pass (``copy_client``), then the rowset
manifest is written; the superblock is written ``READY`` (fsync) and the replica started. Any
failure, and a cancellation, leaves the replica ``TOMBSTONED`` with its last-logged OpId, able to
vote.

A successful job ends its source session only once the new replica has caught up with its
leader (``leader_contact``), or after ``CATCH_UP_WAIT_S``: the session's WAL anchor keeps the
entries after the copied log on the source until the leader has sent them, so a copy of a
tablet under write load is not GC'd out from under the new replica (nyala retains no WAL for
lagging followers; without it a copy longer than the flush interval needed a second copy).
Disk work runs on the copy I/O pool (``CopyIoPool``).

Owns: the jobs and their records (kept for listing after they end, ``history_max`` of them).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nyala.common import metafile
from nyala.consensus.metadata import decode_cmeta
from nyala.consensus.runtime.cmeta_store import FileCmetaStore
from nyala.consensus.types import MIN_OP_ID, OpId, Role
from nyala.errors import (
    AlreadyInProgressError,
    IllegalStateError,
    InvalidArgumentError,
    NotFoundError,
    ThrottledError,
)
from nyala.tablet.copy_client import (
    CopySource,
    DataChannel,
    DownloadOptions,
    Progress,
    download_files,
)
from nyala.tablet.copy_cmeta import merge_cmeta
from nyala.tablet.copy_io import CopyIoPool
from nyala.tablet.copy_source import CopySessionInfo, DataKind
from nyala.tablet.manager import TabletManager
from nyala.tablet.replica import TabletReplica, TabletState
from nyala.tablet.superblock import DataState, decode_superblock

log = logging.getLogger(__name__)

# The storage engine's manifest file name (rust/storage/src/manifest.rs, MANIFEST_FILE).
ROWSET_MANIFEST_FILE = "rowset-manifest"
END_SESSION_TIMEOUT_S = 5.0
#: How long a copied replica may take to catch up with its leader before its job ends the
#: source session (and with it the anchor on the source's WAL) anyway.
CATCH_UP_WAIT_S = 30.0
CATCH_UP_POLL_S = 0.05


class JobState(enum.Enum):
    """Where a copy job is."""

    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


@dataclass
class CopyJob:
    """One copy onto this server, as listed by ``/tablet-copies`` and ListTabletCopies."""

    job_id: str
    tablet_id: str
    source_uuid: str
    source_addr: str
    caller_term: int
    started_s: float = field(default_factory=time.time)  # wall clock, for display
    state: JobState = JobState.RUNNING
    progress: Progress = field(default_factory=Progress)
    error: str = ""
    finished_s: float | None = None
    cancel_requested: bool = False
    task: asyncio.Task[None] | None = None

    @property
    def elapsed_s(self) -> float:
        """Seconds since the job started (until it ended)."""
        end = self.finished_s if self.finished_s is not None else time.time()
        return max(0.0, end - self.started_s)

    @property
    def rate_bytes_per_s(self) -> float:
        """Average download rate so far."""
        elapsed = self.elapsed_s
        return self.progress.bytes_done / elapsed if elapsed > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        """The job as a JSON object."""
        return {
            "id": self.job_id,
            "tablet_id": self.tablet_id,
            "source_uuid": self.source_uuid,
            "source_addr": self.source_addr,
            "state": self.state.value,
            "bytes_done": self.progress.bytes_done,
            "bytes_total": self.progress.bytes_total,
            "rate_bytes_per_s": round(self.rate_bytes_per_s, 1),
            "elapsed_s": round(self.elapsed_s, 3),
            "error": self.error,
        }


SourceFactory = Callable[[str, str], CopySource]  # (source uuid, "host:port") -> source
StopReplica = Callable[[str], Awaitable[None]]
StartReplica = Callable[[TabletReplica], None]


class TabletCopyJobs:
    """Every tablet copy onto this server (see the module docstring)."""

    def __init__(
        self,
        tablets: TabletManager,
        *,
        connect: SourceFactory,
        stop_replica: StopReplica,
        start_replica: StartReplica,
        io: CopyIoPool,
        options: DownloadOptions | None = None,
        concurrency_max: int = 4,
        history_max: int = 100,
    ) -> None:
        assert concurrency_max > 0
        self._tablets = tablets
        self._connect = connect
        self._stop_replica = stop_replica
        self._start_replica = start_replica
        self._io = io
        self.options = options or DownloadOptions()
        self.concurrency_max = concurrency_max
        self._jobs: deque[CopyJob] = deque(maxlen=history_max)
        self._running: dict[str, CopyJob] = {}  # tablet id -> job
        self._ids = itertools.count(1)
        self._group: asyncio.TaskGroup | None = None
        # Bytes downloaded by jobs that ended (``bytes_fetched`` adds the running ones).
        self._bytes_fetched_ended = 0

    def attach(self, group: asyncio.TaskGroup | None) -> None:
        """The task group jobs run in (None: the server is not serving)."""
        self._group = group

    # --- StartTabletCopy --------------------------------------------------------------------

    def start(
        self,
        tablet_id: str,
        source_uuid: str,
        source_addr: str,
        caller_term: int,
        caller_log_first_index: int = 0,
        *,
        target_last_op_id: OpId | None = None,
    ) -> CopyJob:
        """Checks the request and starts the copy; returns its job (see the module docstring)."""
        group = self._group
        if group is None:
            raise IllegalStateError("the server is not serving")
        if not source_uuid or not source_addr:
            raise InvalidArgumentError("StartTabletCopy needs the source's uuid and address")
        if tablet_id in self._running:
            raise AlreadyInProgressError(f"tablet {tablet_id} is being copied here already")
        replica = self._tablets.lookup(tablet_id)
        if target_last_op_id is not None:
            _check_unchanged(tablet_id, replica, target_last_op_id)
        if replica is not None:
            self._check_replica(replica, caller_term, caller_log_first_index)
        if len(self._running) >= self.concurrency_max:
            raise ThrottledError(
                f"{len(self._running)} tablet copies are running here (at most "
                f"{self.concurrency_max}); retry later"
            )
        job = CopyJob(f"copy-{next(self._ids)}", tablet_id, source_uuid, source_addr, caller_term)
        self._running[tablet_id] = job
        self._jobs.append(job)
        job.task = group.create_task(self._run(job), name=f"tablet-copy-{tablet_id}")
        job.task.add_done_callback(lambda _: self._finished(job))
        log.info("tablet copy %s of %s from %s started", job.job_id, tablet_id, source_addr)
        return job

    @staticmethod
    def _check_replica(replica: TabletReplica, caller_term: int, caller_first_index: int) -> None:
        state = replica.superblock.data_state
        if state is DataState.COPYING:
            raise AlreadyInProgressError(f"tablet {replica.tablet_id} is being copied here")
        last_logged = replica.last_logged_op_id()
        current_term = _current_term(replica)
        if caller_term < max(last_logged.term, current_term):
            raise IllegalStateError(
                f"tablet {replica.tablet_id}: caller term {caller_term} is below this replica's "
                f"term {current_term} / last-logged {last_logged}; refusing a stale copy"
            )
        # The caller can catch a running replica up from its log only if that log still holds
        # the replica's last entry: an AppendEntries names the entry before its first by term,
        # and the term of an entry the caller GC'd is gone with it. So a replica whose last
        # entry is just before the caller's first is copied (a leader that GC'd it right after
        # serving a copy would otherwise ask again and again, and be refused every time).
        running = state is DataState.READY and replica.state is TabletState.RUNNING
        if running and last_logged.index >= caller_first_index:
            raise IllegalStateError(
                f"tablet {replica.tablet_id} is running with ops up to {last_logged.index}; the "
                f"caller's log starts at {caller_first_index}, so it can be caught up from it"
            )

    # --- listing and control ------------------------------------------------------------------

    def jobs(self) -> list[CopyJob]:
        """Running and recently finished jobs, oldest first."""
        return list(self._jobs)

    def cancel(self, job_id: str) -> CopyJob:
        """Cancels a running job (the replica ends up TOMBSTONED); ``NotFoundError`` if no job
        has that id, ``IllegalStateError`` if it already ended."""
        job = next((j for j in self._jobs if j.job_id == job_id), None)
        if job is None:
            raise NotFoundError(f"no tablet copy job {job_id!r}")
        if job.state is not JobState.RUNNING or job.task is None:
            raise IllegalStateError(f"tablet copy job {job_id} already ended: {job.state.value}")
        job.cancel_requested = True
        job.task.cancel()
        return job

    def bytes_fetched(self) -> int:
        """Bytes every copy onto this server downloaded so far (a counter)."""
        running = sum(job.progress.bytes_done for job in self._running.values())
        return self._bytes_fetched_ended + running

    def _finished(self, job: CopyJob) -> None:
        # A job cancelled before its task ever ran never reached ``_run``'s handlers.
        if job.state is JobState.RUNNING:
            job.state, job.error = JobState.CANCELLED, "cancelled before it started"
            job.finished_s = time.time()
        if self._running.get(job.tablet_id) is job:
            del self._running[job.tablet_id]
            self._bytes_fetched_ended += job.progress.bytes_done

    def cancel_all(self) -> None:
        """Server shutdown: stops every running job (a restart tombstones its replica)."""
        for job in list(self._running.values()):
            if job.task is not None:
                job.task.cancel()

    # --- the job ------------------------------------------------------------------------------

    async def _run(self, job: CopyJob) -> None:
        source = self._connect(job.source_uuid, job.source_addr)
        opened: list[CopySessionInfo] = []  # the session, once the source opened it
        try:
            replica = await self._attempt(job, source, opened)
            if opened and replica is not None and job.state is JobState.SUCCEEDED:
                await _await_caught_up(replica)  # the session's anchor holds until then
        finally:
            if opened:
                await _end_quietly(source, opened[0].session_id, job.state is JobState.SUCCEEDED)
            close = getattr(source, "close", None)
            if close is not None:
                await close()

    async def _attempt(
        self, job: CopyJob, source: CopySource, opened: list[CopySessionInfo]
    ) -> TabletReplica | None:
        """The copy itself; sets the job's final state and returns the replica (None if the
        copy never got to create it)."""
        replica: TabletReplica | None = None
        try:
            await self._tombstone_if_ready(job)
            opened.append(await source.begin(job.tablet_id))
            replica = await self._prepare(job, opened[0])
            await self._download(job, source, opened[0], replica)
            await self._io.run(self._tablets.finish_copy, replica)
            self._start_replica(replica)
            job.state = JobState.SUCCEEDED
            log.info(
                "tablet copy %s of %s done: %d bytes in %.2f s",
                job.job_id,
                job.tablet_id,
                job.progress.bytes_done,
                job.elapsed_s,
            )
        except asyncio.CancelledError:
            job.state, job.error = JobState.CANCELLED, "cancelled"
            await self._clean_up(job, replica)
            if not job.cancel_requested:
                raise  # the server is shutting down
        except Exception as exc:  # any failure tombstones the replica; the server goes on
            job.state, job.error = JobState.FAILED, f"{type(exc).__name__}: {exc}"
            log.warning("tablet copy %s of %s failed: %s", job.job_id, job.tablet_id, job.error)
            await self._clean_up(job, replica)
        finally:
            job.finished_s = time.time()
            if self._running.get(job.tablet_id) is job:
                del self._running[job.tablet_id]
        return replica

    async def _tombstone_if_ready(self, job: CopyJob) -> None:
        replica = self._tablets.lookup(job.tablet_id)
        if replica is None or replica.superblock.data_state is not DataState.READY:
            return
        await self._stop_replica(job.tablet_id)
        await self._io.run(
            self._tablets.delete_tablet,
            job.tablet_id,
            DataState.TOMBSTONED,
            reason=f"replaced by a tablet copy from {job.source_uuid}",
        )

    async def _prepare(self, job: CopyJob, session: CopySessionInfo) -> TabletReplica:
        remote = decode_superblock(session.superblock, name=f"superblock from {job.source_addr}")
        if remote.tablet_id != job.tablet_id:
            raise InvalidArgumentError(
                f"the source sent the superblock of tablet {remote.tablet_id}, not {job.tablet_id}"
            )
        reason = f"copying from {job.source_uuid} ({job.job_id})"
        replica = await self._io.run(self._tablets.begin_copy, remote, reason)
        # On the event loop, like tombstoned voting: no vote interleaves with the merge.
        store = FileCmetaStore(replica.paths.cmeta)
        try:
            local = store.load()
        except NotFoundError:
            local = None
        store.save(merge_cmeta(local, decode_cmeta(session.cmeta, name="cmeta from the source")))
        files = (*session.rowset_files, *session.wal_segments)
        job.progress.bytes_total = sum(f.size_bytes for f in files) + len(session.rowset_manifest)
        return replica

    async def _download(
        self,
        job: CopyJob,
        source: CopySource,
        session: CopySessionInfo,
        replica: TabletReplica,
    ) -> None:
        data_dir, wal_dir = replica.paths.data_dir, replica.paths.wal_dir
        rowsets = [(DataKind.ROWSET_FILE, f, data_dir / f.name) for f in session.rowset_files]
        segments = [(DataKind.WAL_SEGMENT, f, wal_dir / f.name) for f in session.wal_segments]
        # One pass over every file, so the chunks in flight never drain between kinds; the
        # replica stays COPYING (nothing trusts these files) until the READY superblock.
        channel = (
            DataChannel(session.data_channel_address, session.data_channel_token)
            if session.data_channel_address and self.options.use_data_channel
            else None
        )
        await download_files(
            source,
            session.session_id,
            [*rowsets, *segments],  # all of them, in the session's order (the channel's numbers)
            self.options,
            job.progress,
            self._io,
            channel,
        )
        # The manifest names the rowsets: it goes in once they are all durable.
        manifest = data_dir / ROWSET_MANIFEST_FILE
        await self._io.run(_write_durably, manifest, session.rowset_manifest)
        job.progress.bytes_done += len(session.rowset_manifest)

    async def _clean_up(self, job: CopyJob, replica: TabletReplica | None) -> None:
        if replica is None:
            return
        reason = f"tablet copy {job.job_id} from {job.source_uuid} {job.state.value}: {job.error}"
        try:
            # Shielded: a cancelled job must still leave a tombstone, never a half copy.
            await asyncio.shield(self._io.run(self._tablets.fail_copy, replica, reason))
        except Exception as exc:
            # The superblock says COPYING: the next startup tombstones it.
            log.error("tablet %s: tombstoning after a failed copy failed: %s", job.tablet_id, exc)


def _check_unchanged(tablet_id: str, replica: TabletReplica | None, seen: OpId) -> None:
    """Seed 000's idempotency: the caller decided on a copy from this replica's last-logged
    OpId ``seen``; a log that moved on since (or was tombstoned) is not the log it judged."""
    last = replica.last_logged_op_id() if replica is not None and replica.wal is not None else None
    if last != seen:
        now = "no running log" if last is None else f"its last-logged op is {last}"
        raise IllegalStateError(
            f"tablet {tablet_id}: the caller saw last-logged op {seen}, but {now} now; "
            "probe it again"
        )


async def _await_caught_up(replica: TabletReplica) -> None:
    """Waits until the copied replica has had everything its leader committed (the leader
    replicates to it from its copied log), for at most ``CATCH_UP_WAIT_S``."""
    deadline = time.monotonic() + CATCH_UP_WAIT_S
    while time.monotonic() < deadline:
        runtime = replica.runtime
        if runtime is None or runtime.ended:
            return  # stopped meanwhile: nobody will catch it up from this session
        core = runtime.core
        if core.active_config.peer(core.uuid) is None:
            return  # copied outside the config (by hand): no leader will replicate to it
        if core.leader_contact() is not None or core.role is Role.LEADER:
            return
        await asyncio.sleep(CATCH_UP_POLL_S)
    log.info(
        "tablet %s: not caught up %.0f s after its copy; ending the session anyway",
        replica.tablet_id,
        CATCH_UP_WAIT_S,
    )


def _current_term(replica: TabletReplica) -> int:
    runtime = replica.runtime
    if runtime is not None:
        return runtime.core.term
    try:
        return FileCmetaStore(replica.paths.cmeta).load().current_term
    except NotFoundError:
        return MIN_OP_ID.term


def _write_durably(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    metafile.fsync_dir(path.parent)


async def _end_quietly(source: CopySource, session_id: str, success: bool) -> None:
    with contextlib.suppress(Exception, asyncio.CancelledError):
        async with asyncio.timeout(END_SESSION_TIMEOUT_S):
            await source.end(session_id, success)
