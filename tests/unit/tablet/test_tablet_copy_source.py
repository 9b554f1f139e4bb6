"""Copy sessions on the source: the image lists pinned rowset files and anchored WAL segments,
chunks carry their CRC32C and the file length, only the session's files can be fetched, and
ending or idle expiry releases the WAL anchor and the storage pins; on a data channel the files
are served in the session's order until it ends, and use there keeps the session alive."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from nyala import _native
from nyala.common.clock import ManualClock
from nyala.consensus.metadata import decode_cmeta
from nyala.consensus.types import EntryKind, RaftConfig, RaftPeer
from nyala.errors import InvalidArgumentError, NotFoundError
from nyala.schema import Column, Schema
from nyala.tablet.copy_source import CopySessionManager, DataKind
from nyala.tablet.manager import TabletDirs, TabletManager
from nyala.tablet.superblock import Partition, decode_superblock

SCHEMA = Schema([Column("id", "int64"), Column("v", "string", nullable=True)], ["id"])
CONFIG = RaftConfig((RaftPeer("a", "h:1"),))
TABLET = "5" * 32


def _replica(tmp_path: Path) -> TabletManager:
    dirs = TabletDirs(tmp_path / "tm", tmp_path / "cm", tmp_path / "w", tmp_path / "d")
    for d in (dirs.tablet_meta, dirs.consensus_meta, dirs.wals, dirs.data):
        d.mkdir()
    manager = TabletManager(dirs)
    replica = manager.create_tablet(
        TABLET, table_id="t", table_name="t", schema=SCHEMA, partition=Partition(), config=CONFIG
    )
    assert replica.storage is not None
    assert replica.wal is not None
    replica.storage.write({"id": list(range(100)), "v": ["x"] * 100}, "insert", 1)
    replica.wal.append(1, EntryKind.NO_OP, b"")
    replica.storage.flush()
    return manager


def test_session_serves_its_image_and_expiry_releases_pins_and_anchor(tmp_path: Path) -> None:
    manager = _replica(tmp_path)
    replica = manager.replica(TABLET)
    clock = ManualClock()
    sessions = CopySessionManager(clock, idle_timeout_ms=1_000, chunk_bytes=1024)
    info = sessions.begin("target", replica)
    assert info.session_id == f"target-{TABLET}"
    assert decode_superblock(info.superblock).tablet_id == TABLET
    assert decode_cmeta(info.cmeta).committed_config == CONFIG
    assert info.last_flushed_index == 1
    assert info.rowset_files
    assert [f.name for f in info.wal_segments] == [p.name for p in replica.wal.segment_paths()]

    first = info.rowset_files[0]
    data = b""
    while len(data) < first.size_bytes:
        chunk = sessions.fetch(info.session_id, DataKind.ROWSET_FILE, first.name, len(data), 0)
        assert chunk.total_bytes == first.size_bytes
        assert len(chunk.data) <= 1024
        assert chunk.crc32c == _native.crc32c(chunk.data)
        data += chunk.data
    assert data == (replica.paths.data_dir / first.name).read_bytes()
    with pytest.raises(NotFoundError):
        sessions.fetch(info.session_id, DataKind.ROWSET_FILE, "../../etc/passwd", 0, 0)

    # The live WAL segment is served up to its durable end when the session began, whatever
    # is appended later.
    segment = info.wal_segments[-1]
    replica.wal.append(1, EntryKind.NO_OP, b"x" * 5000)
    assert replica.wal.wait_durable(10)
    live = replica.wal.segment_paths()[-1]
    served = b""
    while len(served) < segment.size_bytes:
        chunk = sessions.fetch(info.session_id, DataKind.WAL_SEGMENT, segment.name, len(served), 0)
        assert chunk.total_bytes == segment.size_bytes
        served += chunk.data
    assert served == live.read_bytes()[: segment.size_bytes]
    assert len(live.read_bytes().rstrip(b"\0")) > segment.size_bytes  # it did grow
    with pytest.raises(InvalidArgumentError):
        sessions.fetch(info.session_id, DataKind.ROWSET_FILE, first.name, first.size_bytes + 1, 0)

    session = sessions._sessions[info.session_id]
    clock.advance(999)
    assert sessions.expire_idle() == []
    clock.advance(2)
    assert sessions.expire_idle() == [info.session_id]
    with pytest.raises(NotFoundError):
        sessions.fetch(info.session_id, DataKind.ROWSET_FILE, first.name, 0, 0)
    # Anchor and pins are gone: releasing them again is refused.
    with pytest.raises(InvalidArgumentError):
        replica.wal.release_anchor(session.anchor)
    with pytest.raises(NotFoundError):
        replica.storage.release_snapshot(session.snapshot)
    manager.shutdown()


def test_a_session_on_the_data_channel_serves_its_files_in_order_until_it_ends(
    tmp_path: Path,
) -> None:
    manager = _replica(tmp_path)
    replica = manager.replica(TABLET)
    channel = _native.CopyDataServer(
        "127.0.0.1", 0, chunk_bytes_max=1024, connections_max=4, idle_timeout_ms=60_000
    )
    address = f"127.0.0.1:{channel.port}"
    clock = ManualClock()
    sessions = CopySessionManager(
        clock, idle_timeout_ms=1_000, chunk_bytes=1024, channel=channel, channel_address=address
    )
    info = sessions.begin("target", replica)
    assert info.data_channel_address == address
    assert len(info.data_channel_token) == 16
    assert sessions.begin("other", replica).data_channel_token != info.data_channel_token
    replica.wal.append(1, EntryKind.NO_OP, b"x" * 5000)  # the live segment grows meanwhile
    assert replica.wal.wait_durable(10)

    # Numbered rowset files first, then WAL segments, each with the session's length.
    listed = [*info.rowset_files, *info.wal_segments]
    out = tmp_path / "out"
    out.mkdir()
    fds = [os.open(out / f.name, os.O_WRONLY | os.O_CREAT) for f in listed]
    try:
        _native.CopyDownload().run(
            address,
            info.data_channel_token,
            [(i, fd, f.size_bytes) for i, (fd, f) in enumerate(zip(fds, listed, strict=True))],
            chunk_bytes=4096,
            streams=2,
            attempts=1,
            rate_bytes_per_s=0,
            timeout_ms=10_000,
        )
    finally:
        for fd in fds:
            os.close(fd)
    for f in info.rowset_files:
        assert (out / f.name).read_bytes() == (replica.paths.data_dir / f.name).read_bytes()
    for f in info.wal_segments:
        on_disk = (replica.paths.wal_dir / f.name).read_bytes()
        assert (out / f.name).read_bytes() == on_disk[: f.size_bytes]

    # Requests on the channel count as use: the manual clock's 2 s alone do not expire it,
    # a second of real silence on the channel too does.
    clock.advance(2_000)
    assert info.session_id not in sessions.expire_idle()
    time.sleep(1.1)
    assert info.session_id in sessions.expire_idle()
    assert channel.idle_ms(info.data_channel_token) is None  # no longer served
    fd = os.open(out / "again", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(NotFoundError, match="no such copy session"):
            _native.CopyDownload().run(
                address,
                info.data_channel_token,
                [(0, fd, listed[0].size_bytes)],
                chunk_bytes=4096,
                streams=1,
                attempts=1,
                rate_bytes_per_s=0,
                timeout_ms=10_000,
            )
    finally:
        os.close(fd)
    sessions.close_all()
    channel.close()
    manager.shutdown()
