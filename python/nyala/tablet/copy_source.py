"""Tablet copy, source side: copy sessions over one replica's consistent image.

A session is opened by a target that is about to copy a tablet (``begin``). It captures, in
this order, so that the image is consistent:

1. a WAL anchor at the first op not yet flushed to rowsets, so no entry the target needs to
   replay is garbage-collected while the session lives;
2. a storage snapshot: the rowset files are pinned (compaction cannot delete them) and the
   rowset manifest at that moment is kept; its ``last_flushed_index`` is at or above the
   anchor, so the WAL still holds every op after it;
3. the superblock, then the WAL's copy image (taken after the snapshot, so it covers it),
   then the consensus metadata.

The copy image (``rust/wal/src/copy_image.rs``) is every WAL segment up to the durable end at
that moment, each with a fixed length: the active segment is served up to its durable end
however much the leader appends meanwhile, because only the bytes before it never change. The
target's log then opens with exactly the entries durable when the session began. (Before, the
active segment was listed with its preallocated size and read chunk by chunk at different
moments: a partial page read early and its continuation read later did not fit together, and
the copied log did not open.) Every file is opened when the session begins and served with
that fixed length (``nyala._native.CopyFile``), so a segment GC'd meanwhile stays readable.

``file`` names one file of the session for the server to read a chunk of (only files of the
session can be named); ``fetch`` reads one chunk with its CRC32C, for callers in the same
process. With a data channel (``nyala._native.CopyDataServer``, docs/tablet-copy.md), each
session's files are also served there under a random token, numbered in the order the
session lists them (rowset files, then WAL segments); its requests count as use of the
session. ``end`` releases the anchor and the pins and stops serving the files; so does idle
expiry (``expire_idle``), for targets that vanished.

Owns: sessions and their open files. Never writes anything of the replica.
"""

from __future__ import annotations

import enum
import logging
import secrets
import threading
import time
from dataclasses import dataclass

from nyala import _native
from nyala.common.clock import Clock
from nyala.consensus.metadata import encode_cmeta
from nyala.consensus.runtime.cmeta_store import FileCmetaStore
from nyala.consensus.runtime.wal_log import WalLog
from nyala.errors import NotFoundError, NyalaError, TabletNotRunningError
from nyala.storage import StorageEngine, StorageSnapshot
from nyala.tablet.replica import TabletReplica
from nyala.tablet.superblock import DataState, encode_superblock

log = logging.getLogger(__name__)

CHUNK_BYTES_DEFAULT = 4 << 20
SESSION_IDLE_TIMEOUT_MS_DEFAULT = 600_000
#: How long a session waits for the WAL to be durable through the snapshot's flushed index
#: (only a follower source can have applied and flushed ops it has not synced yet).
DURABLE_WAIT_S = 10.0


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
    # The data channel serving the session's files ("host:port"; "" when there is none) and
    # the token that names the session there.
    data_channel_address: str = ""
    data_channel_token: bytes = b""


@dataclass(frozen=True, slots=True)
class DataChunk:
    """``data`` at ``offset`` of a file of ``total_bytes``; ``crc32c`` covers ``data``, which
    may be a view into the message it arrived in (the target takes it without a copy)."""

    offset: int
    data: bytes | memoryview
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
    # Every file the session may serve, open, with the length it serves.
    files: dict[tuple[DataKind, str], _native.CopyFile]
    last_used_ms: int


class CopySessionManager:
    """Every copy session this server serves as a source."""

    def __init__(
        self,
        clock: Clock,
        *,
        idle_timeout_ms: int = SESSION_IDLE_TIMEOUT_MS_DEFAULT,
        chunk_bytes: int = CHUNK_BYTES_DEFAULT,
        channel: _native.CopyDataServer | None = None,
        channel_address: str = "",
    ) -> None:
        """``channel``, if given, also serves every session's files; targets reach it at
        ``channel_address`` (``host:port``)."""
        assert idle_timeout_ms > 0
        assert chunk_bytes > 0
        assert (channel is None) == (not channel_address)
        self._clock = clock
        self.idle_timeout_ms = idle_timeout_ms
        self.chunk_bytes = chunk_bytes
        self.channel = channel
        self._channel_address = channel_address
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
        if self.channel is not None:
            self.channel.register(session.info.data_channel_token, list(session.files.values()))
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
        wal, storage = replica.wal, replica.storage
        assert wal is not None
        assert storage is not None
        superblock = encode_superblock(replica.superblock)
        segments = _wal_image(wal, snapshot.last_flushed_index)  # after the snapshot: covers it
        cmeta = encode_cmeta(FileCmetaStore(replica.paths.cmeta).load())
        files: dict[tuple[DataKind, str], _native.CopyFile] = {}
        for path in snapshot.files:
            files[(DataKind.ROWSET_FILE, path.name)] = _native.CopyFile.open(str(path))
        for segment in segments:
            files[(DataKind.WAL_SEGMENT, segment.name)] = segment
        info = CopySessionInfo(
            session_id=session_id,
            idle_timeout_ms=self.idle_timeout_ms,
            superblock=superblock,
            cmeta=cmeta,
            rowset_manifest=snapshot.manifest_image,
            last_flushed_index=snapshot.last_flushed_index,
            rowset_files=tuple(
                DataFile(name, f.length)
                for (kind, name), f in files.items()
                if kind is DataKind.ROWSET_FILE
            ),
            wal_segments=tuple(DataFile(f.name, f.length) for f in segments),
            # Numbered by the order of ``files``: rowset files, then WAL segments, as listed.
            data_channel_address=self._channel_address,
            data_channel_token=secrets.token_bytes(16) if self.channel is not None else b"",
        )
        return CopySession(
            info, replica, wal, storage, anchor, snapshot, files, self._clock.now_ms()
        )

    def file(self, session_id: str, kind: DataKind, name: str) -> _native.CopyFile:
        """The file ``name`` of the session, open, with the fixed length it is served with.
        ``NotFoundError`` for an unknown session or a file not in it."""
        session = self._touch(session_id)
        file = session.files.get((kind, name))
        if file is None:
            raise NotFoundError(f"copy session {session_id} has no {kind.value} {name!r}")
        return file

    def chunk_length(self, max_length_bytes: int) -> int:
        """The bytes of a chunk asked for with ``max_length_bytes`` (0: the chunk size)."""
        return min(max_length_bytes or self.chunk_bytes, self.chunk_bytes)

    def fetch(
        self, session_id: str, kind: DataKind, name: str, offset: int, max_length_bytes: int
    ) -> DataChunk:
        """Reads one chunk (blocking; run it in a thread). ``NotFoundError`` for an unknown
        session or a file not in it, ``InvalidArgumentError`` for an offset past the end."""
        file = self.file(session_id, kind, name)
        data, crc = file.read(offset, self.chunk_length(max_length_bytes))
        return DataChunk(offset, data, file.length, crc)

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

    def _release(self, session: CopySession) -> None:
        if self.channel is not None:
            self.channel.unregister(session.info.data_channel_token)
        session.files.clear()  # the files close once no chunk read holds them
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
                if self._idle_ms(s, now) > self.idle_timeout_ms
            ]
        for sid in idle:
            log.info("copy session %s expired after %d ms idle", sid, self.idle_timeout_ms)
            self.end(sid, missing_ok=True)
        return idle

    def _idle_ms(self, session: CopySession, now_ms: int) -> int:
        """How long ``session`` has had no request, over either path."""
        idle = now_ms - session.last_used_ms
        if self.channel is not None:
            on_channel = self.channel.idle_ms(session.info.data_channel_token)
            if on_channel is not None:
                idle = min(idle, on_channel)
        return idle

    def session_ids(self) -> list[str]:
        """The open sessions."""
        with self._lock:
            return sorted(self._sessions)

    def anchors_of(self, tablet_id: str) -> dict[int, str]:
        """WAL anchor id -> session id of the sessions open on ``tablet_id`` (the web UI names
        who holds each anchor)."""
        with self._lock:
            return {
                s.anchor: sid
                for sid, s in self._sessions.items()
                if s.replica.tablet_id == tablet_id
            }

    def close_all(self) -> None:
        """Ends every session (server shutdown)."""
        for sid in self.session_ids():
            self.end(sid, missing_ok=True)


def _wal_image(wal: WalLog, flushed_index: int) -> list[_native.CopyFile]:
    """The WAL's copy image, once it is durable through ``flushed_index``: the rowsets hold
    every op up to there, so the copied log must reach it too. A leader has synced every op
    it applied; a follower may apply an op its own log has not synced yet (the commit index
    comes from the leader), so it waits for that sync here."""
    deadline = time.monotonic() + DURABLE_WAIT_S
    while True:
        durable = wal.durable_index()  # before the image: it can only be at least this
        image = wal.copy_image()
        if durable >= flushed_index:
            return image
        if time.monotonic() > deadline:
            raise TabletNotRunningError(
                f"the WAL is durable through {durable} only, below the flushed index "
                f"{flushed_index}, after {DURABLE_WAIT_S} s"
            )
        time.sleep(0.01)
