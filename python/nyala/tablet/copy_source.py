"""Tablet copy, source side: copy sessions over one replica's consistent image.

A session is opened by a target that is about to copy a tablet (``begin``). It captures, in
this order, so that the image is consistent:

1. a WAL anchor at the first op not yet flushed to rowsets, so no entry the target needs to
   replay is garbage-collected while the session lives;
2. a storage snapshot: the rowset files are pinned (compaction cannot delete them) and the
   rowset manifest at that moment is kept; its ``last_flushed_index`` is at or above the
   anchor, so the WAL still holds every op after it;
3. the superblock, then the WAL segment list (taken after the snapshot, so it covers it),
   then the consensus metadata.

``fetch`` reads one chunk of one file of the session (offset, max length) and returns it with
its CRC32C and the file's length; only files of the session can be named. ``end`` releases the
anchor and the pins; so does idle expiry (``expire_idle``), for targets that vanished.

Owns: sessions and their open files. Never writes anything of the replica.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from nyala import _native
from nyala.common.clock import Clock
from nyala.consensus.metadata import encode_cmeta
from nyala.consensus.runtime.cmeta_store import FileCmetaStore
from nyala.consensus.runtime.wal_log import WalLog
from nyala.errors import InvalidArgumentError, NotFoundError, NyalaError, TabletNotRunningError
from nyala.storage import StorageEngine, StorageSnapshot
from nyala.tablet.replica import TabletReplica
from nyala.tablet.superblock import DataState, encode_superblock

log = logging.getLogger(__name__)

CHUNK_BYTES_DEFAULT = 4 << 20
SESSION_IDLE_TIMEOUT_MS_DEFAULT = 600_000


class DataKind(enum.Enum):
    """Which kind of file a chunk comes from."""

    ROWSET_FILE = "ROWSET_FILE"  # a DiskRowSet file, by base name
    WAL_SEGMENT = "WAL_SEGMENT"  # a WAL segment, by file name


@dataclass(frozen=True, slots=True)
class DataFile:
    """One file of a session's image: its name and its length when the session began."""

    name: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class CopySessionInfo:
    """What ``begin`` answers: the image's metadata and the list of files to fetch."""

    session_id: str
    idle_timeout_ms: int
    superblock: bytes  # payload of nyala.tablet.superblock (state READY on the source)
    cmeta: bytes  # payload of nyala.consensus.metadata
    rowset_manifest: bytes  # the storage manifest file's full contents at the snapshot
    last_flushed_index: int
    rowset_files: tuple[DataFile, ...]
    wal_segments: tuple[DataFile, ...]


@dataclass(frozen=True, slots=True)
class DataChunk:
    """``data`` at ``offset`` of a file of ``total_bytes``; ``crc32c`` covers ``data``."""

    offset: int
    data: bytes
    total_bytes: int
    crc32c: int


@dataclass
class CopySession:
    """One open session: what it pins and the files it may serve."""

    info: CopySessionInfo
    replica: TabletReplica
    # The handles the anchor and the pins belong to (the replica may reopen new ones).
    wal: WalLog
    storage: StorageEngine
    anchor: int
    snapshot: StorageSnapshot
    paths: dict[tuple[DataKind, str], Path]
    last_used_ms: int
    fds: dict[Path, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)  # guards fds


class CopySessionManager:
    """Every copy session this server serves as a source."""

    def __init__(
        self,
        clock: Clock,
        *,
        idle_timeout_ms: int = SESSION_IDLE_TIMEOUT_MS_DEFAULT,
        chunk_bytes: int = CHUNK_BYTES_DEFAULT,
    ) -> None:
        assert idle_timeout_ms > 0
        assert chunk_bytes > 0
        self._clock = clock
        self.idle_timeout_ms = idle_timeout_ms
        self.chunk_bytes = chunk_bytes
        self._sessions: dict[str, CopySession] = {}
        self._lock = threading.Lock()

    @staticmethod
    def session_id(requestor_uuid: str, tablet_id: str) -> str:
        """One session per (target, tablet): a retried copy replaces the earlier session."""
        return f"{requestor_uuid}-{tablet_id}"

    def begin(self, requestor_uuid: str, replica: TabletReplica) -> CopySessionInfo:
        """Opens a session over ``replica``'s current image (see the module docstring)."""
        wal, storage = replica.wal, replica.storage
        if replica.superblock.data_state is not DataState.READY or wal is None or storage is None:
            raise TabletNotRunningError(
                f"tablet {replica.tablet_id} cannot be copied from here: {replica.state.value}"
            )
        session_id = self.session_id(requestor_uuid, replica.tablet_id)
        self.end(session_id, missing_ok=True)
        anchor = wal.register_anchor(storage.last_flushed_index + 1)
        try:
            snapshot = storage.snapshot()
        except BaseException:
            wal.release_anchor(anchor)
            raise
        try:
            session = self._capture(session_id, replica, anchor, snapshot)
        except BaseException:
            storage.release_snapshot(snapshot)
            wal.release_anchor(anchor)
            raise
        with self._lock:
            self._sessions[session_id] = session
        log.info(
            "copy session %s: %d rowset files, %d WAL segments, flushed through %d",
            session_id,
            len(session.info.rowset_files),
            len(session.info.wal_segments),
            snapshot.last_flushed_index,
        )
        return session.info

    def _capture(
        self, session_id: str, replica: TabletReplica, anchor: int, snapshot: StorageSnapshot
    ) -> CopySession:
        wal = replica.wal
        assert wal is not None
        superblock = encode_superblock(replica.superblock)
        segments = wal.segment_paths()  # after the snapshot: covers every op after its index
        cmeta = encode_cmeta(FileCmetaStore(replica.paths.cmeta).load())
        paths: dict[tuple[DataKind, str], Path] = {}
        rowset_files = []
        for path in snapshot.files:
            paths[(DataKind.ROWSET_FILE, path.name)] = path
            rowset_files.append(DataFile(path.name, path.stat().st_size))
        wal_segments = []
        for path in segments:
            paths[(DataKind.WAL_SEGMENT, path.name)] = path
            wal_segments.append(DataFile(path.name, path.stat().st_size))
        info = CopySessionInfo(
            session_id=session_id,
            idle_timeout_ms=self.idle_timeout_ms,
            superblock=superblock,
            cmeta=cmeta,
            rowset_manifest=snapshot.manifest_image,
            last_flushed_index=snapshot.last_flushed_index,
            rowset_files=tuple(rowset_files),
            wal_segments=tuple(wal_segments),
        )
        storage = replica.storage
        assert storage is not None
        return CopySession(
            info, replica, wal, storage, anchor, snapshot, paths, self._clock.now_ms()
        )

    def fetch(
        self, session_id: str, kind: DataKind, name: str, offset: int, max_length_bytes: int
    ) -> DataChunk:
        """Reads one chunk (blocking; run it in a thread). ``NotFoundError`` for an unknown
        session or a file not in it, ``InvalidArgumentError`` for an offset past the end."""
        session = self._touch(session_id)
        path = session.paths.get((kind, name))
        if path is None:
            raise NotFoundError(f"copy session {session_id} has no {kind.value} {name!r}")
        length = min(max_length_bytes or self.chunk_bytes, self.chunk_bytes)
        fd = self._fd(session, path)
        total = os.fstat(fd).st_size
        if offset > total:
            raise InvalidArgumentError(f"offset {offset} is past the end of {name} ({total} bytes)")
        data = os.pread(fd, min(length, total - offset), offset)
        return DataChunk(offset, data, total, _native.crc32c(data))

    @staticmethod
    def _fd(session: CopySession, path: Path) -> int:
        with session.lock:
            fd = session.fds.get(path)
            if fd is None:
                fd = session.fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            return fd

    def _touch(self, session_id: str) -> CopySession:
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                raise NotFoundError(f"no copy session {session_id} (ended or expired)")
            session.last_used_ms = self._clock.now_ms()
            return session

    def end(self, session_id: str, *, missing_ok: bool = False) -> None:
        """Releases a session's anchor, pins and files."""
        with self._lock:
            session = self._sessions.pop(session_id, None)
        if session is None:
            if not missing_ok:
                raise NotFoundError(f"no copy session {session_id} (ended or expired)")
            return
        self._release(session)

    @staticmethod
    def _release(session: CopySession) -> None:
        with session.lock:
            fds, session.fds = session.fds, {}
        for fd in fds.values():
            os.close(fd)
        # A replica closed meanwhile (tombstoned, restarted) took its anchors and pins along.
        try:
            session.wal.release_anchor(session.anchor)
        except NyalaError as exc:
            log.debug("copy session %s: anchor already gone: %s", session.info.session_id, exc)
        try:
            session.storage.release_snapshot(session.snapshot)
        except NyalaError as exc:
            log.debug("copy session %s: pins already gone: %s", session.info.session_id, exc)

    def expire_idle(self) -> list[str]:
        """Ends the sessions idle for longer than the timeout; returns their ids."""
        now = self._clock.now_ms()
        with self._lock:
            idle = [
                sid
                for sid, s in self._sessions.items()
                if now - s.last_used_ms > self.idle_timeout_ms
            ]
        for sid in idle:
            log.info("copy session %s expired after %d ms idle", sid, self.idle_timeout_ms)
            self.end(sid, missing_ok=True)
        return idle

    def session_ids(self) -> list[str]:
        """The open sessions."""
        with self._lock:
            return sorted(self._sessions)

    def close_all(self) -> None:
        """Ends every session (server shutdown)."""
        for sid in self.session_ids():
            self.end(sid, missing_ok=True)
