"""TabletManager on a real fs layout: create, reopen, tombstone, delete, crash roll-forward, and
the quarantine of what tombstones and deletes take away (moved, copied, purged)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from nyala import errors
from nyala.common import metafile
from nyala.consensus.runtime.cmeta_store import FileCmetaStore
from nyala.consensus.runtime.wal_log import WalLogOptions
from nyala.consensus.types import EntryKind, OpId, RaftConfig, RaftPeer
from nyala.schema import Column, Schema
from nyala.tablet import DataState, Partition, TabletDirs, TabletManager
from nyala.tablet.quarantine import Quarantine
from nyala.tablet.replica import OPENED_REASON, TabletState
from nyala.tablet.superblock import (
    Superblock,
    decode_superblock,
    encode_superblock,
    read_superblock,
    write_superblock,
)

SCHEMA = Schema([Column("id", "int64"), Column("v", "string", nullable=True)], ["id"])
CONFIG = RaftConfig(
    peers=tuple(RaftPeer(uuid=c * 32, address=f"127.0.0.1:{7050 + i}") for i, c in enumerate("abc"))
)
T1, T2 = "1" * 32, "2" * 32
WAL_OPTIONS = WalLogOptions(segment_size_bytes=1 << 20)


def _manager(dirs: TabletDirs, *, open_all: bool = True) -> TabletManager:
    manager = TabletManager(dirs, WAL_OPTIONS)
    if open_all:
        manager.open_all()
    return manager


def _create(manager: TabletManager, tablet_id: str = T1, config: RaftConfig = CONFIG) -> None:
    manager.create_tablet(
        tablet_id,
        table_id="t" * 32,
        table_name="events",
        schema=SCHEMA,
        partition=Partition(hash_buckets=(3,), key_start=b"\x00\x01", key_end=b""),
        config=config,
    )


def _statuses(manager: TabletManager) -> dict[str, tuple[str, str]]:
    return {s.tablet_id: (s.state, s.data_state) for s in manager.statuses()}


def test_superblock_round_trips_and_damage_is_corruption(tmp_path: Path) -> None:
    sb = Superblock(T1, "tbl", "events", SCHEMA, Partition((1, 2), b"a", b"z"), CONFIG)
    sb = sb.with_state(DataState.TOMBSTONED, last_logged=OpId(3, 17), reason="moved")
    assert decode_superblock(encode_superblock(sb)) == sb
    write_superblock(tmp_path / T1, sb)
    assert read_superblock(tmp_path / T1) == sb
    with pytest.raises(errors.CorruptionError, match="malformed superblock"):
        decode_superblock(b'{"format": 1, "tablet_id": "x"}')
    with pytest.raises(errors.NotSupportedError):
        decode_superblock(b'{"format": 99}')


def test_create_writes_superblock_cmeta_storage_and_wal(dirs: TabletDirs) -> None:
    manager = _manager(dirs)
    _create(manager)
    paths = dirs.paths(T1)
    assert read_superblock(paths.superblock).data_state is DataState.READY
    cmeta = FileCmetaStore(paths.cmeta).load()
    assert cmeta.current_term == 0
    assert cmeta.committed_config == CONFIG
    assert paths.data_dir.is_dir()
    assert paths.wal_dir.is_dir()
    replica = manager.replica(T1)
    assert replica.state is TabletState.NOT_STARTED
    assert replica.state_reason == OPENED_REASON
    assert replica.storage is not None
    assert replica.storage.schema == SCHEMA
    manager.shutdown()


def test_statuses_count_bytes_on_disk_only_when_asked(dirs: TabletDirs) -> None:
    manager = _manager(dirs)
    _create(manager, T1)
    _create(manager, T2)
    paths = dirs.paths(T1)
    on_disk = sum(
        f.stat().st_size
        for root in (paths.wal_dir, paths.data_dir)
        for f in root.rglob("*")
        if f.is_file()
    )
    assert on_disk > 0  # the WAL's first segment at least
    sized = {s.tablet_id: s for s in manager.statuses()}
    assert sized[T1].on_disk_bytes == on_disk
    # The heartbeat's form: the same report without walking the tablets' directories.
    unsized = manager.statuses(sizes=False)
    assert [s.on_disk_bytes for s in unsized] == [None, None]
    assert [dataclasses.replace(s, on_disk_bytes=0) for s in unsized] == [
        dataclasses.replace(s, on_disk_bytes=0) for s in sized.values()
    ]
    manager.shutdown()


def test_create_is_idempotent_for_the_same_request_only(dirs: TabletDirs) -> None:
    manager = _manager(dirs)
    _create(manager)
    _create(manager)  # same tablet, same config: succeeds again
    other = RaftConfig(peers=CONFIG.peers[:2])
    with pytest.raises(errors.AlreadyPresentError):
        _create(manager, config=other)
    with pytest.raises(errors.InvalidArgumentError):
        _create(manager, tablet_id="not-hex")
    manager.shutdown()


def test_reopen_after_restart_opens_ready_replicas(dirs: TabletDirs) -> None:
    manager = _manager(dirs)
    _create(manager)
    replica = manager.replica(T1)
    assert replica.storage is not None
    replica.storage.write({"id": [1, 2], "v": ["a", None]}, "insert", 1)
    replica.storage.flush()
    manager.shutdown()

    again = _manager(dirs)
    reopened = again.replica(T1)
    assert reopened.storage is not None
    assert reopened.storage.scan().num_rows == 2
    assert _statuses(again) == {T1: ("NOT_STARTED", "READY")}
    again.shutdown()


def test_tombstone_keeps_cmeta_and_last_logged_op_and_drops_data_and_wal(
    dirs: TabletDirs,
) -> None:
    manager = _manager(dirs)
    _create(manager)
    replica = manager.replica(T1)
    assert replica.wal is not None
    replica.wal.append(1, EntryKind.NO_OP, b"")
    replica.wal.append(2, EntryKind.NO_OP, b"")
    assert replica.wal.wait_durable(10.0)
    manager.delete_tablet(T1, DataState.TOMBSTONED, reason="moved away")
    paths = dirs.paths(T1)
    assert not paths.data_dir.exists()
    assert not paths.wal_dir.exists()
    assert FileCmetaStore(paths.cmeta).load().committed_config == CONFIG
    sb = read_superblock(paths.superblock)
    assert sb.data_state is DataState.TOMBSTONED
    assert sb.tombstone_last_logged_opid == OpId(2, 2)
    assert sb.state_reason == "moved away"
    with pytest.raises(errors.TabletNotFoundError):
        manager.replica(T1)
    manager.delete_tablet(T1, DataState.TOMBSTONED)  # again: nothing to do
    with pytest.raises(errors.AlreadyPresentError):
        _create(manager)  # a tombstone is replaced by tablet copy, not by creation

    again = _manager(dirs)
    assert _statuses(again) == {T1: ("STOPPED", "TOMBSTONED")}
    assert read_superblock(paths.superblock).tombstone_last_logged_opid == OpId(2, 2)


def test_delete_removes_everything_and_allows_recreation(dirs: TabletDirs) -> None:
    manager = _manager(dirs)
    _create(manager)
    manager.delete_tablet(T1, DataState.DELETED, reason="table dropped")
    paths = dirs.paths(T1)
    for p in (paths.superblock, paths.cmeta, paths.data_dir, paths.wal_dir):
        assert not p.exists(), p
    assert manager.statuses() == []
    with pytest.raises(errors.TabletNotFoundError):
        manager.delete_tablet(T1, DataState.DELETED)
    _create(manager)
    assert _statuses(manager) == {T1: ("NOT_STARTED", "READY")}
    manager.shutdown()


def test_delete_cas_refuses_a_replica_with_a_newer_config(dirs: TabletDirs) -> None:
    manager = _manager(dirs)
    _create(manager)
    FileCmetaStore(dirs.paths(T1).cmeta).save(
        FileCmetaStore(dirs.paths(T1).cmeta)
        .load()
        .__class__(current_term=2, voted_for=None, committed_config=CONFIG.with_opid_index(5))
    )
    manager.shutdown()
    manager = _manager(dirs)
    with pytest.raises(errors.CasFailedError) as info:
        manager.delete_tablet(T1, DataState.TOMBSTONED, cas_config_opid_index_le=4)
    assert info.value.committed_opid_index == 5
    manager.delete_tablet(T1, DataState.TOMBSTONED, cas_config_opid_index_le=5)
    assert _statuses(manager) == {T1: ("STOPPED", "TOMBSTONED")}


def test_startup_rolls_an_interrupted_delete_forward(dirs: TabletDirs) -> None:
    manager = _manager(dirs)
    _create(manager)
    manager.shutdown()
    paths = dirs.paths(T1)
    # A crash right after the DELETED superblock was written: everything else is still there.
    sb = read_superblock(paths.superblock).with_state(DataState.DELETED, last_logged=OpId(1, 1))
    write_superblock(paths.superblock, sb)
    again = _manager(dirs)
    assert again.statuses() == []
    for p in (paths.superblock, paths.cmeta, paths.data_dir, paths.wal_dir):
        assert not p.exists(), p


def test_startup_finishes_an_interrupted_tombstone(dirs: TabletDirs) -> None:
    manager = _manager(dirs)
    _create(manager)
    manager.shutdown()
    paths = dirs.paths(T1)
    sb = read_superblock(paths.superblock).with_state(DataState.TOMBSTONED, last_logged=OpId(4, 9))
    write_superblock(paths.superblock, sb)
    again = _manager(dirs)
    assert _statuses(again) == {T1: ("STOPPED", "TOMBSTONED")}
    assert not paths.data_dir.exists()
    assert not paths.wal_dir.exists()
    assert paths.cmeta.exists()


def test_startup_turns_copying_into_tombstoned_keeping_last_opid(dirs: TabletDirs) -> None:
    manager = _manager(dirs)
    _create(manager)
    manager.shutdown()
    paths = dirs.paths(T1)
    sb = read_superblock(paths.superblock).with_state(DataState.COPYING, last_logged=OpId(7, 70))
    write_superblock(paths.superblock, sb)
    again = _manager(dirs)
    assert _statuses(again) == {T1: ("STOPPED", "TOMBSTONED")}
    after = read_superblock(paths.superblock)
    assert after.data_state is DataState.TOMBSTONED
    assert after.tombstone_last_logged_opid == OpId(7, 70)
    assert not paths.data_dir.exists()


def test_a_damaged_superblock_fails_only_that_tablet(dirs: TabletDirs) -> None:
    manager = _manager(dirs)
    _create(manager, T1)
    _create(manager, T2)
    manager.shutdown()
    raw = bytearray(dirs.paths(T1).superblock.read_bytes())
    raw[-3] ^= 0xFF
    dirs.paths(T1).superblock.write_bytes(bytes(raw))
    again = _manager(dirs)
    statuses = {s.tablet_id: s for s in again.statuses()}
    assert statuses[T1].state == "FAILED"
    assert "checksum" in statuses[T1].state_reason
    assert (statuses[T2].state, statuses[T2].data_state) == ("NOT_STARTED", "READY")
    with pytest.raises(errors.TabletFailedError):
        again.replica(T1)
    with pytest.raises(errors.TabletFailedError):
        _create(again, T1)
    again.replica(T2)
    # An operator may still remove the damaged replica.
    again.delete_tablet(T1, DataState.DELETED)
    assert [s.tablet_id for s in again.statuses()] == [T2]
    again.shutdown()


def test_a_damaged_cmeta_fails_only_that_tablet(dirs: TabletDirs) -> None:
    manager = _manager(dirs)
    _create(manager, T1)
    _create(manager, T2)
    manager.shutdown()
    metafile.write_atomic(dirs.paths(T2).cmeta, metafile.MetaKind.CONSENSUS_META, b"{oops")
    again = _manager(dirs)
    statuses = {s.tablet_id: s for s in again.statuses()}
    assert statuses[T2].state == "FAILED"
    assert "CorruptionError" in statuses[T2].state_reason
    assert statuses[T1].state == "NOT_STARTED"
    again.shutdown()


def test_leftovers_of_a_crashed_create_are_cleared_by_the_retry(dirs: TabletDirs) -> None:
    paths = dirs.paths(T1)
    paths.data_dir.mkdir()
    (paths.data_dir / "junk").write_bytes(b"half-created")
    paths.cmeta.write_bytes(b"half-written")
    manager = _manager(dirs)
    assert manager.statuses() == []  # no superblock: the tablet does not exist
    _create(manager)
    assert FileCmetaStore(paths.cmeta).load().committed_config == CONFIG
    assert not (paths.data_dir / "junk").exists()
    manager.shutdown()


# --- quarantine ----------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now_s = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now_s


def _quarantined(dirs: TabletDirs, clock: _Clock, free: list[int]) -> TabletManager:
    assert dirs.quarantine is not None
    quarantine = Quarantine(
        dirs.quarantine,
        retention_s=3600,
        disk_free_bytes_min=100,
        now_s=clock,
        disk_free_bytes=lambda _: free[0],
    )
    manager = TabletManager(dirs, WAL_OPTIONS, quarantine=quarantine)
    manager.open_all()
    return manager


def test_tombstone_quarantines_wal_and_data_with_copies_of_superblock_and_cmeta(
    quarantined_dirs: TabletDirs,
) -> None:
    dirs = quarantined_dirs
    clock = _Clock()
    manager = _quarantined(dirs, clock, [10**12])
    _create(manager)
    replica = manager.replica(T1)
    assert replica.wal is not None
    assert replica.storage is not None
    replica.wal.append(1, EntryKind.NO_OP, b"")
    assert replica.wal.wait_durable(10.0)
    replica.storage.write({"id": [1, 2], "v": ["a", "b"]}, "insert", 1)
    replica.storage.flush()
    paths = dirs.paths(T1)
    wal_files = sorted(p.name for p in paths.wal_dir.iterdir())
    data_files = sorted(p.name for p in paths.data_dir.iterdir())
    before = paths.superblock.read_bytes()
    manager.delete_tablet(T1, DataState.TOMBSTONED, reason="moved away")

    assert manager.quarantine is not None
    [entry] = manager.quarantine.entries()
    assert entry.tablet_id == T1
    assert entry.created_s == clock.now_s
    q = entry.path
    assert (q / "superblock").read_bytes() == before  # the READY superblock, as it was
    assert read_superblock(q / "superblock").data_state is DataState.READY
    assert FileCmetaStore(q / "cmeta").load().committed_config == CONFIG
    assert sorted(p.name for p in (q / "wal").iterdir()) == wal_files
    assert sorted(p.name for p in (q / "data").iterdir()) == data_files
    assert not paths.wal_dir.exists()
    assert not paths.data_dir.exists()
    sb = read_superblock(paths.superblock)
    assert sb.data_state is DataState.TOMBSTONED
    assert sb.quarantine_dir == str(q)
    assert paths.cmeta.exists()  # the tombstone still votes


def test_startup_finishes_moving_an_interrupted_tombstone_into_its_quarantine(
    quarantined_dirs: TabletDirs,
) -> None:
    dirs = quarantined_dirs
    clock = _Clock()
    manager = _quarantined(dirs, clock, [10**12])
    _create(manager)
    manager.shutdown()
    assert manager.quarantine is not None
    paths = dirs.paths(T1)
    # A crash right after the TOMBSTONED superblock naming the quarantine was written.
    qdir = manager.quarantine.new_dir(T1)
    sb = read_superblock(paths.superblock).with_state(
        DataState.TOMBSTONED, last_logged=OpId(1, 1), quarantine_dir=str(qdir)
    )
    write_superblock(paths.superblock, sb)
    again = _quarantined(dirs, clock, [10**12])
    assert _statuses(again) == {T1: ("STOPPED", "TOMBSTONED")}
    assert (qdir / "wal").is_dir()
    assert (qdir / "data").is_dir()
    assert (qdir / "cmeta").exists()
    assert not paths.wal_dir.exists()
    assert not paths.data_dir.exists()


def test_delete_quarantines_then_removes_cmeta_and_superblock(quarantined_dirs: TabletDirs) -> None:
    dirs = quarantined_dirs
    manager = _quarantined(dirs, _Clock(), [10**12])
    _create(manager)
    manager.delete_tablet(T1, DataState.DELETED, reason="table dropped")
    paths = dirs.paths(T1)
    for p in (paths.superblock, paths.cmeta, paths.data_dir, paths.wal_dir):
        assert not p.exists(), p
    assert manager.quarantine is not None
    [entry] = manager.quarantine.entries()
    assert {p.name for p in entry.path.iterdir()} == {"superblock", "cmeta", "wal", "data"}


def test_quarantine_is_purged_after_its_retention_and_while_the_disk_is_short(
    quarantined_dirs: TabletDirs,
) -> None:
    dirs = quarantined_dirs
    clock = _Clock()
    free = [10**12]
    manager = _quarantined(dirs, clock, free)
    quarantine = manager.quarantine
    assert quarantine is not None
    for tablet_id in (T1, T2):
        _create(manager, tablet_id)
        manager.delete_tablet(tablet_id, DataState.TOMBSTONED)
        clock.now_s += 1000
    assert [e.tablet_id for e in quarantine.entries()] == [T1, T2]
    assert quarantine.enforce() == []  # young enough, and the disk has room
    clock.now_s += 1700  # T1's entry is 3700 s old, T2's 2700 s
    assert [e.tablet_id for e in quarantine.enforce()] == [T1]
    free[0] = 50  # short of the 100 bytes asked for: the oldest goes, however young
    assert [e.tablet_id for e in quarantine.enforce()] == [T2]
    assert quarantine.entries() == []


def test_a_failed_copy_is_not_quarantined(quarantined_dirs: TabletDirs) -> None:
    dirs = quarantined_dirs
    manager = _quarantined(dirs, _Clock(), [10**12])
    _create(manager)
    manager.shutdown()
    paths = dirs.paths(T1)
    sb = read_superblock(paths.superblock).with_state(DataState.COPYING)
    write_superblock(paths.superblock, sb)
    again = _quarantined(dirs, _Clock(), [10**12])
    assert _statuses(again) == {T1: ("STOPPED", "TOMBSTONED")}
    assert again.quarantine is not None
    assert again.quarantine.entries() == []
    assert not paths.wal_dir.exists()
    assert not paths.data_dir.exists()
