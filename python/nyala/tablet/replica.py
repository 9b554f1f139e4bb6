"""One tablet replica on this server: its superblock, consensus metadata, WAL and storage.

``TabletReplica`` owns the open handles of one replica and its runtime state
(``TabletState``). It opens what the superblock points at and closes it again; the
``TabletManager`` decides when (create, startup, tombstone, delete). Raft is not driven from
here yet: until the asyncio runtime lands, an opened replica reports ``NOT_STARTED`` with a
reason that says so, rather than claiming to be ``RUNNING``.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from pathlib import Path

from nyala.consensus.core import bootstrap_cmeta
from nyala.consensus.metadata import ConsensusMetadata, FileCmetaStore
from nyala.consensus.types import MIN_OP_ID, OpId
from nyala.errors import IllegalStateError
from nyala.storage import StorageEngine
from nyala.tablet.superblock import DataState, Superblock
from nyala.wal import Log, LogOptions

log = logging.getLogger(__name__)

NOT_WIRED_REASON = "storage, WAL and cmeta open; the Raft runtime is not wired in yet"


class TabletState(enum.Enum):
    """Runtime state of a replica (names match ``nyala.TabletState`` on the wire)."""

    NOT_STARTED = "NOT_STARTED"
    BOOTSTRAPPING = "BOOTSTRAPPING"
    RUNNING = "RUNNING"
    FAILED = "FAILED"  # offline; ``state_reason`` says why
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"


@dataclass(frozen=True)
class ReplicaPaths:
    """Where one replica's files live (DESIGN.md §6)."""

    superblock: Path
    cmeta: Path
    wal_dir: Path
    data_dir: Path


class TabletReplica:
    """The open parts of one replica; created by ``TabletManager`` only."""

    def __init__(self, superblock: Superblock, paths: ReplicaPaths, wal_options: LogOptions):
        self.superblock = superblock
        self.paths = paths
        self._wal_options = wal_options
        self.state = TabletState.NOT_STARTED
        self.state_reason = ""
        self.cmeta: ConsensusMetadata | None = None
        self.storage: StorageEngine | None = None
        self.wal: Log | None = None

    @property
    def tablet_id(self) -> str:
        """The tablet's id (32 hex digits)."""
        return self.superblock.tablet_id

    def create_files(self) -> None:
        """Lays down a new replica's cmeta (initial config, term 0) and empty storage.

        Called before the superblock is written: a crash in between leaves files that no
        superblock points at, which the next CreateTablet clears (``clear_leftovers``).
        """
        assert self.superblock.data_state is DataState.READY
        bootstrap_cmeta(FileCmetaStore(self.paths.cmeta), self.superblock.initial_config)
        StorageEngine.create(self.paths.data_dir, self.superblock.schema)

    def open(self) -> None:
        """Opens cmeta, storage and the WAL of a READY replica; FAILED (with why) on error."""
        if self.superblock.data_state is not DataState.READY:
            raise IllegalStateError(
                f"tablet {self.tablet_id} is {self.superblock.data_state.value}, not READY"
            )
        self.state = TabletState.BOOTSTRAPPING
        try:
            self.cmeta = FileCmetaStore(self.paths.cmeta).load()
            self.storage = StorageEngine.open(self.paths.data_dir)
            self.wal = Log(self.paths.wal_dir, self.tablet_id, self._wal_options)
        except Exception as exc:  # any failure keeps this replica offline, never the server
            self.close()
            self.fail(f"{type(exc).__name__}: {exc}")
            log.warning("tablet %s failed to start: %s", self.tablet_id, self.state_reason)
            return
        self.state = TabletState.NOT_STARTED
        self.state_reason = NOT_WIRED_REASON

    def fail(self, reason: str) -> None:
        """Marks the replica offline with ``reason``."""
        self.state = TabletState.FAILED
        self.state_reason = reason

    def last_logged_op_id(self) -> OpId:
        """The last OpId in the WAL (what a tombstone keeps so the replica can still vote)."""
        if self.wal is not None:
            term, index = self.wal.last_op_id
            return OpId(term, index)
        if self.superblock.tombstone_last_logged_opid is not None:
            return self.superblock.tombstone_last_logged_opid
        return MIN_OP_ID

    def close(self) -> None:
        """Releases the open handles; the files stay."""
        self.state = TabletState.STOPPING
        if self.wal is not None:
            self.wal.close()
        self.wal = None
        # Dropping the last reference stops the engine's background work (Rust Drop).
        self.storage = None
        self.state = TabletState.STOPPED

    def on_disk_bytes(self) -> int:
        """Bytes of the replica's WAL and data files."""
        total = 0
        for root in (self.paths.wal_dir, self.paths.data_dir):
            if root.is_dir():
                total += sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
        return total
