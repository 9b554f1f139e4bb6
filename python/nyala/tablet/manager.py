"""The tablet manager: every replica of one server, their creation, startup and deletion.

It owns the per-tablet files under the fs root's ``tablet-meta``, ``consensus-meta``, ``wals``
and ``data`` directories (DESIGN.md §6) and the ordering of their changes, so that a crash at
any point leaves a state that startup can finish (seed 000, "Tablet deletion", "Tablet
startup"):

* create: cmeta and storage first, the superblock last (its presence makes the replica exist;
  files without a superblock are leftovers of a crashed create and are cleared on retry);
* tombstone (seed 000, "Tablet deletion"): stop; for a replica that held data, make a
  quarantine directory and copy the superblock into it (``nyala.tablet.quarantine``); write
  the superblock TOMBSTONED with the last-logged OpId and the quarantine directory; copy cmeta
  into the quarantine and move the WAL and data directories there (without a quarantine, as
  for a failed or interrupted copy, they are deleted). cmeta stays forever, so the replica can
  still vote and is never amnesiac;
* delete: as tombstone (state DELETED), then cmeta, then the superblock last;
* startup: ``DELETED`` → finish the removal; ``COPYING`` → tombstone; ``TOMBSTONED`` → finish
  moving (or deleting) data and WAL if a crash interrupted it; ``READY`` → open. A replica that
  fails to open (or whose superblock is damaged) is ``FAILED`` with the reason; the others are
  unaffected.

Methods block on disk and are serialised by one lock; async callers run them in a thread.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nyala.common import metafile
from nyala.common.clock import HybridClock
from nyala.consensus.runtime.wal_log import DurabilitySignals, WalLogOptions
from nyala.consensus.types import MIN_OP_ID, OpId, RaftConfig
from nyala.errors import (
    AlreadyPresentError,
    CasFailedError,
    IllegalStateError,
    InvalidArgumentError,
    NyalaError,
    ServiceUnavailableError,
    TabletFailedError,
    TabletNotFoundError,
)
from nyala.schema import Schema
from nyala.storage import FLUSH_THRESHOLD_BYTES
from nyala.tablet.quarantine import CMETA_FILE, DATA_DIR, SUPERBLOCK_FILE, WAL_DIR, Quarantine
from nyala.tablet.replica import (
    HISTORY_MAX_AGE_S_DEFAULT,
    ReplicaPaths,
    TabletReplica,
    TabletState,
)
from nyala.tablet.superblock import (
    DataState,
    Partition,
    Superblock,
    read_superblock,
    write_superblock,
)

log = logging.getLogger(__name__)

_TABLET_ID_CHARS = frozenset("0123456789abcdef")


def is_tablet_id(name: str) -> bool:
    """True for 32 lowercase hex digits."""
    return len(name) == 32 and set(name) <= _TABLET_ID_CHARS


@dataclass(frozen=True)
class TabletDirs:
    """The four per-tablet directories of an fs root, and its quarantine (None: tombstones
    delete at once, as in tools and tests that need no quarantine)."""

    tablet_meta: Path
    consensus_meta: Path
    wals: Path
    data: Path
    quarantine: Path | None = None

    def paths(self, tablet_id: str) -> ReplicaPaths:
        """Where the files of ``tablet_id`` live."""
        assert is_tablet_id(tablet_id), tablet_id
        return ReplicaPaths(
            superblock=self.tablet_meta / tablet_id,
            cmeta=self.consensus_meta / tablet_id,
            wal_dir=self.wals / tablet_id,
            data_dir=self.data / tablet_id,
        )


@dataclass(frozen=True)
class TabletStatus:
    """One replica as ListTablets reports it."""

    tablet_id: str
    table_id: str
    table_name: str
    state: str  # a TabletState name
    data_state: str  # a DataState name, or UNKNOWN when the superblock is unreadable
    state_reason: str
    # Bytes of the replica's WAL and data files; None unless asked for (``statuses(sizes=True)``,
    # a walk of its directories).
    on_disk_bytes: int | None
    schema: Schema | None
    partition: Partition | None


@dataclass
class _Failed:
    """A tablet whose superblock could not be read: listed as FAILED, never opened."""

    tablet_id: str
    reason: str


class TabletManager:
    """All replicas of one server."""

    def __init__(
        self,
        dirs: TabletDirs,
        wal_options: WalLogOptions | None = None,
        *,
        flush_threshold_bytes: int = FLUSH_THRESHOLD_BYTES,
        quarantine: Quarantine | None = None,
        hybrid_clock: HybridClock | None = None,
        history_max_age_s: float = HISTORY_MAX_AGE_S_DEFAULT,
    ) -> None:
        self.dirs = dirs
        #: The server's hybrid clock, shared by its replicas (docs/consistency.md).
        self.clock = hybrid_clock or HybridClock()
        self.history_max_age_s = history_max_age_s
        if quarantine is None and dirs.quarantine is not None:
            quarantine = Quarantine(dirs.quarantine)
        self.quarantine = quarantine
        self._wal_options = wal_options or WalLogOptions()
        # One eventfd for every replica's WAL durability signals (no descriptor per replica).
        self.durability_signals = DurabilitySignals()
        self._flush_threshold_bytes = flush_threshold_bytes
        self._lock = threading.Lock()
        self._replicas: dict[str, TabletReplica] = {}
        self._unreadable: dict[str, _Failed] = {}
        self._creating: set[str] = set()  # tablets whose files create_tablet is making
        self._version = 0  # moves whenever a replica is added, replaced or removed

    def _new_replica(self, sb: Superblock, paths: ReplicaPaths) -> TabletReplica:
        return TabletReplica(
            sb,
            paths,
            self._wal_options,
            self._flush_threshold_bytes,
            durability_signals=self.durability_signals,
            hybrid_clock=self.clock,
            history_max_age_s=self.history_max_age_s,
        )

    # --- startup and shutdown ---------------------------------------------------------------

    def open_all(self) -> None:
        """Loads every superblock and brings each replica to its steady state; the READY ones'
        files (cmeta, storage, WAL recovery) are opened ``PARALLEL_OPENS_MAX`` at a time."""
        with self._lock:
            ready = []
            for path in sorted(self.dirs.tablet_meta.iterdir()):
                if is_tablet_id(path.name):
                    replica = self._open_one(path.name)
                    if replica is not None:
                        ready.append(replica)
            _in_parallel(TabletReplica.open, ready)

    def _open_one(self, tablet_id: str) -> TabletReplica | None:
        """Registers one replica and rolls its data state forward; returns it if it is READY
        and still has to be opened."""
        paths = self.dirs.paths(tablet_id)
        try:
            sb = read_superblock(paths.superblock)
            if sb.tablet_id != tablet_id:
                raise InvalidArgumentError(f"superblock names tablet {sb.tablet_id}")
        except NyalaError as exc:
            log.error("tablet %s: superblock unreadable: %s", tablet_id, exc)
            self._unreadable[tablet_id] = _Failed(tablet_id, f"{type(exc).__name__}: {exc}")
            self._version += 1
            return None
        replica = self._new_replica(sb, paths)
        try:
            if sb.data_state is DataState.DELETED:
                self._finish_delete(replica)
                return None
            if sb.data_state is DataState.COPYING:
                # Seed 000 "Tablet startup" step 2: a half-copied replica deletes itself.
                self._tombstone_files(
                    replica, replica.last_logged_op_id(), "copy interrupted", quarantine=False
                )
            elif sb.data_state is DataState.TOMBSTONED:
                self._finish_quarantine(replica.paths, sb)  # roll an interrupted tombstone forward
                replica.state = TabletState.STOPPED
                replica.state_reason = f"tombstoned: {sb.state_reason}"
        except NyalaError as exc:
            replica.fail(f"{type(exc).__name__}: {exc}")
            self._replicas[tablet_id] = replica
            self._version += 1
            return None
        self._replicas[tablet_id] = replica
        self._version += 1
        return replica if replica.superblock.data_state is DataState.READY else None

    def shutdown(self) -> None:
        """Closes every replica's files, ``PARALLEL_OPENS_MAX`` at a time."""
        with self._lock:
            closing = [r for r in self._replicas.values() if r.state is not TabletState.FAILED]
            _in_parallel(TabletReplica.close, closing)

    # --- create -----------------------------------------------------------------------------

    def create_tablet(
        self,
        tablet_id: str,
        *,
        table_id: str,
        table_name: str,
        schema: Schema,
        partition: Partition,
        config: RaftConfig,
    ) -> TabletReplica:
        """Creates and opens a replica; a repeat of the same request returns the same one.

        ``AlreadyPresentError`` if the tablet exists with another table, partition or initial
        config, or is tombstoned (a tombstone is replaced by tablet copy, not by creation).
        """
        if not is_tablet_id(tablet_id):
            raise InvalidArgumentError(f"tablet id {tablet_id!r} is not 32 lowercase hex digits")
        if not config.voters():
            raise InvalidArgumentError("the initial config has no VOTER")
        sb = Superblock(
            tablet_id=tablet_id,
            table_id=table_id,
            table_name=table_name,
            schema=schema,
            partition=partition,
            initial_config=config,
        )
        with self._lock:
            existing = self._existing(tablet_id)
            if existing is not None:
                return self._same_request(existing, sb)
            if tablet_id in self._creating:
                raise ServiceUnavailableError(f"tablet {tablet_id} is being created here")
            self._creating.add(tablet_id)
        # The files are made without the lock: every RPC routed to a replica looks it up under
        # it, and a creation's fsyncs held it long enough to stall the event loop of a server
        # creating hundreds of tablets (issue "Thousands of tablet replicas per server").
        try:
            replica = self._new_replica(sb, self.dirs.paths(tablet_id))
            self._clear_leftovers(replica.paths)
            replica.create_files()
            write_superblock(replica.paths.superblock, sb)
            replica.open()
            with self._lock:
                self._replicas[tablet_id] = replica
                self._version += 1
        finally:
            with self._lock:
                self._creating.discard(tablet_id)
        log.info("created tablet %s of table %s (%s)", tablet_id, table_name, table_id)
        return replica

    def _existing(self, tablet_id: str) -> TabletReplica | None:
        if tablet_id in self._unreadable:
            raise TabletFailedError(
                f"tablet {tablet_id} exists but failed: {self._unreadable[tablet_id].reason}"
            )
        return self._replicas.get(tablet_id)

    @staticmethod
    def _same_request(existing: TabletReplica, sb: Superblock) -> TabletReplica:
        old = existing.superblock
        if old.data_state is not DataState.READY:
            raise AlreadyPresentError(
                f"tablet {sb.tablet_id} exists here as {old.data_state.value}"
            )
        same = (
            old.table_id == sb.table_id
            and old.partition == sb.partition
            and old.initial_config == sb.initial_config
            and old.schema.version <= sb.schema.version
        )
        if not same:
            raise AlreadyPresentError(
                f"tablet {sb.tablet_id} exists here with another table, partition or config"
            )
        return existing

    @staticmethod
    def _clear_leftovers(paths: ReplicaPaths) -> None:
        # Only reached without a superblock: nothing here was ever a live replica.
        paths.cmeta.unlink(missing_ok=True)
        TabletManager._remove_data_and_wal(paths)

    # --- tombstone and delete ---------------------------------------------------------------

    def delete_tablet(
        self,
        tablet_id: str,
        delete_type: DataState,
        *,
        reason: str = "",
        cas_config_opid_index_le: int | None = None,
    ) -> None:
        """Tombstones (``TOMBSTONED``) or removes (``DELETED``) a replica.

        Tombstoning a tombstone is a no-op. ``CasFailedError`` if the replica's committed config
        is newer than ``cas_config_opid_index_le``.
        """
        if delete_type not in (DataState.TOMBSTONED, DataState.DELETED):
            raise InvalidArgumentError(
                f"delete type must be TOMBSTONED or DELETED, not {delete_type}"
            )
        with self._lock:
            if tablet_id in self._unreadable and delete_type is DataState.DELETED:
                # The superblock is unreadable, but the files are still ours to remove.
                paths = self.dirs.paths(tablet_id)
                qdir = self._begin_quarantine(paths)
                if qdir is not None:
                    Quarantine.copy_in(qdir, paths.cmeta, CMETA_FILE)
                self._finish_quarantine(paths, None, qdir)
                self._remove_all(paths)
                del self._unreadable[tablet_id]
                self._version += 1
                return
            replica = self._replicas.get(tablet_id)
            if replica is None:
                raise TabletNotFoundError(f"tablet {tablet_id} is not on this server")
            self._check_cas(replica, cas_config_opid_index_le)
            state = replica.superblock.data_state
            if delete_type is DataState.TOMBSTONED and state is DataState.TOMBSTONED:
                return
            last_logged = replica.last_logged_op_id()
            replica.close()
            held_data = state is DataState.READY
            if delete_type is DataState.TOMBSTONED:
                self._tombstone_files(replica, last_logged, reason, quarantine=held_data)
                return
            qdir = self._begin_quarantine(replica.paths) if held_data else None
            sb = replica.superblock.with_state(
                DataState.DELETED,
                last_logged=last_logged,
                reason=reason,
                quarantine_dir="" if qdir is None else str(qdir),
            )
            write_superblock(replica.paths.superblock, sb)
            replica.superblock = sb
            self._finish_delete(replica)

    @staticmethod
    def _check_cas(replica: TabletReplica, index_le: int | None) -> None:
        if index_le is None or replica.cmeta is None:
            return
        committed = replica.cmeta.committed_config.opid_index
        if committed > index_le:
            raise CasFailedError(
                f"tablet {replica.tablet_id}: committed config index {committed} > {index_le}",
                committed_opid_index=committed,
            )

    def _tombstone_files(
        self, replica: TabletReplica, last_logged: OpId, reason: str, *, quarantine: bool
    ) -> None:
        qdir = self._begin_quarantine(replica.paths) if quarantine else None
        sb = replica.superblock.with_state(
            DataState.TOMBSTONED,
            last_logged=last_logged,
            reason=reason,
            quarantine_dir="" if qdir is None else str(qdir),
        )
        # The superblock goes first: from here on, startup rolls the deletion forward.
        write_superblock(replica.paths.superblock, sb)
        replica.superblock = sb
        self._finish_quarantine(replica.paths, sb)
        replica.state = TabletState.STOPPED
        replica.state_reason = f"tombstoned: {reason}" if reason else "tombstoned"
        where = f", data and WAL quarantined in {qdir}" if qdir is not None else ""
        log.info(
            "tombstoned tablet %s at last-logged op %s%s", replica.tablet_id, last_logged, where
        )

    def _begin_quarantine(self, paths: ReplicaPaths) -> Path | None:
        """Seed 000's deletion steps 2 and 3: a quarantine directory holding a copy of the
        superblock as it is now (None when this server keeps no quarantine)."""
        if self.quarantine is None:
            return None
        qdir = self.quarantine.new_dir(paths.superblock.name)
        Quarantine.copy_in(qdir, paths.superblock, SUPERBLOCK_FILE)
        return qdir

    @staticmethod
    def _finish_quarantine(
        paths: ReplicaPaths, sb: Superblock | None, qdir: Path | None = None
    ) -> None:
        """Seed 000's deletion steps 5 and 6 (again after a crash): cmeta copied, WAL and data
        moved into the superblock's quarantine directory; without one (or once it was purged),
        WAL and data are deleted."""
        if qdir is None and sb is not None and sb.quarantine_dir:
            qdir = Path(sb.quarantine_dir)
        if qdir is None or not qdir.is_dir():
            TabletManager._remove_data_and_wal(paths)
            return
        Quarantine.copy_in(qdir, paths.cmeta, CMETA_FILE)
        Quarantine.move_in(qdir, paths.wal_dir, WAL_DIR)
        Quarantine.move_in(qdir, paths.data_dir, DATA_DIR)

    def _finish_delete(self, replica: TabletReplica) -> None:
        self._finish_quarantine(replica.paths, replica.superblock)
        self._remove_all(replica.paths)
        self._replicas.pop(replica.tablet_id, None)
        self._version += 1
        log.info("deleted tablet %s", replica.tablet_id)

    @staticmethod
    def _remove_all(paths: ReplicaPaths) -> None:
        TabletManager._remove_data_and_wal(paths)
        paths.cmeta.unlink(missing_ok=True)
        metafile.fsync_dir(paths.cmeta.parent)
        # The superblock goes last: while it exists, startup finishes this deletion.
        paths.superblock.unlink(missing_ok=True)
        metafile.fsync_dir(paths.superblock.parent)

    @staticmethod
    def _remove_data_and_wal(paths: ReplicaPaths) -> None:
        for directory in (paths.data_dir, paths.wal_dir):
            if directory.exists():
                shutil.rmtree(directory)
                metafile.fsync_dir(directory.parent)

    # --- tablet copy (target side; nyala.tablet.copy_jobs drives these) ---------------------

    def begin_copy(self, remote: Superblock, reason: str) -> TabletReplica:
        """First step of a copy onto an absent or tombstoned replica: the source's superblock
        written here as ``COPYING`` (fsync), keeping the last-logged OpId of a tombstone so the
        replica can still vote, and empty data and WAL directories."""
        tablet_id = remote.tablet_id
        with self._lock:
            if tablet_id in self._creating:
                raise IllegalStateError(f"tablet {tablet_id} is being created here")
            existing = self._existing(tablet_id)
            if existing is not None and existing.superblock.data_state is not DataState.TOMBSTONED:
                raise IllegalStateError(
                    f"tablet {tablet_id} is {existing.superblock.data_state.value} here; a copy"
                    " needs it absent or tombstoned"
                )
            paths = self.dirs.paths(tablet_id)
            if existing is None:
                self._clear_leftovers(paths)
            else:
                # A tombstone's leftovers (a roll-forward that has not run yet) go where it says.
                self._finish_quarantine(paths, existing.superblock)
            last = None if existing is None else existing.superblock.tombstone_last_logged_opid
            sb = dataclasses.replace(
                remote,
                data_state=DataState.COPYING,
                tombstone_last_logged_opid=last,
                state_reason=reason,
                quarantine_dir="",
            )
            write_superblock(paths.superblock, sb)
            paths.data_dir.mkdir(parents=True, exist_ok=True)
            paths.wal_dir.mkdir(parents=True, exist_ok=True)
            replica = self._new_replica(sb, paths)
            replica.state_reason = reason
            self._replicas[tablet_id] = replica
            self._version += 1
            return replica

    def finish_copy(self, replica: TabletReplica) -> None:
        """Last step of a copy: the superblock ``READY`` (fsync), then the replica opened.
        ``TabletFailedError`` if it does not open (the caller tombstones it)."""
        with self._lock:
            assert replica.superblock.data_state is DataState.COPYING
            sb = replica.superblock.with_state(DataState.READY)
            write_superblock(replica.paths.superblock, sb)
            replica.superblock = sb
            replica.open()
            if replica.state is TabletState.FAILED:
                raise TabletFailedError(f"copied tablet failed to open: {replica.state_reason}")

    def fail_copy(self, replica: TabletReplica, reason: str) -> None:
        """A failed or cancelled copy: the replica becomes ``TOMBSTONED`` (and can vote)."""
        with self._lock:
            if replica.runtime is None and replica.wal is not None:
                replica.close()
            last = replica.superblock.tombstone_last_logged_opid or MIN_OP_ID
            self._tombstone_files(replica, last, reason, quarantine=False)

    def startable(self) -> list[TabletReplica]:
        """Replicas whose files are open and whose Raft is not running yet."""
        with self._lock:
            return [
                r
                for r in self._replicas.values()
                if r.storage is not None and r.runtime is None and r.state is not TabletState.FAILED
            ]

    @property
    def version(self) -> int:
        """A number that moves whenever a replica is added, replaced or removed (unreadable
        ones included): equal numbers, the same replicas as ``replicas`` listed then."""
        return self._version

    def replicas(self) -> list[TabletReplica]:
        """Every replica with a readable superblock."""
        with self._lock:
            return list(self._replicas.values())

    def lookup(self, tablet_id: str) -> TabletReplica | None:
        """The replica of ``tablet_id`` in any state, or None."""
        with self._lock:
            return self._replicas.get(tablet_id)

    # --- lookup -----------------------------------------------------------------------------

    def replica(self, tablet_id: str) -> TabletReplica:
        """The replica of ``tablet_id``; ``TabletNotFoundError`` / ``TabletFailedError``."""
        with self._lock:
            if tablet_id in self._unreadable:
                raise TabletFailedError(
                    f"tablet {tablet_id} failed: {self._unreadable[tablet_id].reason}"
                )
            replica = self._replicas.get(tablet_id)
            if replica is None or replica.superblock.data_state is not DataState.READY:
                raise TabletNotFoundError(f"tablet {tablet_id} is not on this server")
            if replica.state is TabletState.FAILED:
                raise TabletFailedError(f"tablet {tablet_id} failed: {replica.state_reason}")
            return replica

    def statuses(self, *, sizes: bool = True) -> list[TabletStatus]:
        """Every replica (tombstones and failures included), sorted by tablet id. ``sizes``:
        with each replica's bytes on disk, which lists and stats every file of its directories
        (for ListTablets and /tablets, not for every heartbeat)."""
        with self._lock:
            out = [self._status(r, sizes) for r in self._replicas.values()]
            out += self._unreadable_statuses(sizes)
        return sorted(out, key=lambda s: s.tablet_id)

    def unreadable_statuses(self) -> list[TabletStatus]:
        """The FAILED statuses of replicas whose superblock could not be read (``statuses``
        lists them with the others; ``replicas`` cannot)."""
        with self._lock:
            return self._unreadable_statuses(False)

    def _unreadable_statuses(self, sizes: bool) -> list[TabletStatus]:
        return [
            TabletStatus(
                f.tablet_id,
                "",
                "",
                "FAILED",
                "UNKNOWN",
                f.reason,
                0 if sizes else None,
                None,
                None,
            )
            for f in self._unreadable.values()
        ]

    @staticmethod
    def replica_status(replica: TabletReplica) -> TabletStatus:
        """One replica's status, without its size (``status_of`` for a replica in hand)."""
        return TabletManager._status(replica, False)

    def status_of(self, tablet_id: str) -> TabletStatus | None:
        """One replica's status (without its size); None if this server has no such replica
        (an unreadable one included: ``statuses`` lists those)."""
        replica = self.lookup(tablet_id)
        return None if replica is None else self._status(replica, False)

    @staticmethod
    def _status(replica: TabletReplica, sizes: bool) -> TabletStatus:
        sb = replica.superblock
        return TabletStatus(
            tablet_id=sb.tablet_id,
            table_id=sb.table_id,
            table_name=sb.table_name,
            state=replica.state.value,
            data_state=sb.data_state.value,
            state_reason=replica.state_reason,
            on_disk_bytes=replica.on_disk_bytes() if sizes else None,
            schema=sb.schema,
            partition=sb.partition,
        )


#: Replicas opened or closed at once at start-up and shutdown: their WAL recovery, storage
#: open and final syncs are mostly waits for the disk, which overlap; bounded so that a server
#: with thousands of replicas neither starts thousands of threads nor floods the disk.
PARALLEL_OPENS_MAX = max(4, 2 * (os.cpu_count() or 1))


def _in_parallel(action: Callable[[TabletReplica], None], replicas: list[TabletReplica]) -> None:
    """Runs ``action`` on every replica, ``PARALLEL_OPENS_MAX`` at a time; re-raises the first
    error once all have run (``TabletReplica.open`` keeps its own errors as FAILED)."""
    if len(replicas) <= 1:
        for replica in replicas:
            action(replica)
        return
    workers = min(PARALLEL_OPENS_MAX, len(replicas))
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="replica-open") as pool:
        for future in [pool.submit(action, r) for r in replicas]:
            future.result()
