"""The storage engine through the binding: apply, scan to pyarrow, predicates, projection,
flush/compaction/reopen, schema changes, snapshots and typed errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from nyala.common import metafile
from nyala.common.metafile import MetaKind
from nyala.errors import (
    AlreadyPresentError,
    IllegalStateError,
    InvalidArgumentError,
    NotFoundError,
)
from nyala.rowops import OpType, encode, make_op_batch
from nyala.schema import Column, Schema
from nyala.storage import RowStatus, StorageEngine

SCHEMA = Schema.parse("id:int64, v:double?, name:string?", key=["id"])


@pytest.fixture
def engine(tmp_path: Path) -> StorageEngine:
    return StorageEngine.create(tmp_path / "tablet", SCHEMA, background_flush=False)


def _rows(ids: np.ndarray) -> dict[str, object]:
    return {
        "id": ids.astype(np.int64),
        "v": ids.astype(np.float64) / 2,
        "name": pa.array([f"n{i}" for i in ids]),
    }


def test_apply_and_scan(engine: StorageEngine) -> None:
    result = engine.write(_rows(np.arange(100)), OpType.INSERT, 1)
    assert result.ok
    again = engine.write(_rows(np.array([5, 200])), OpType.INSERT, 2)
    assert again.errors() == [(0, RowStatus.ALREADY_PRESENT)]
    missing = engine.write({"id": np.array([7, 999])}, OpType.DELETE, 3)
    assert missing.errors() == [(1, RowStatus.NOT_FOUND)]
    table = engine.scan()
    assert isinstance(table, pa.Table)
    assert table.schema.names == ["id", "v", "name"]
    ids = table.column("id").to_pylist()
    assert ids == sorted({*range(100), 200} - {7})
    assert engine.last_applied_index == 3


def test_predicates_projection_limit_bounds(engine: StorageEngine) -> None:
    engine.write(_rows(np.arange(1000)), OpType.UPSERT, 1)
    for flushed in (False, True):
        if flushed:
            engine.flush()
        table = engine.scan(columns=["name", "id"], where=[("id", ">=", 990), ("v", "<", 497)])
        assert table.schema.names == ["name", "id"]
        assert table.column("id").to_pylist() == [990, 991, 992, 993]
        assert engine.scan(where=[("id", "in", [3, 5, 5000])]).column("id").to_pylist() == [3, 5]
        assert engine.scan(where=[("name", "=", "n42")]).num_rows == 1
        assert engine.scan(where=[("name", "is null", None)]).num_rows == 0
        assert engine.scan(where=[("name", "is not null", None)], limit=7).num_rows == 7
        ranged = engine.scan(columns=["id"], lower_bound={"id": 10}, upper_bound={"id": 13})
        assert ranged.column("id").to_pylist() == [10, 11, 12]
    with pytest.raises(InvalidArgumentError):
        engine.scan(where=[("v", "=", "not a number")])
    with pytest.raises(InvalidArgumentError):
        engine.scan(columns=["nope"])
    with pytest.raises(InvalidArgumentError):
        engine.scan(where=[("v", "~", 1.0)])


def test_ipc_bytes_path_and_malformed_input(engine: StorageEngine) -> None:
    batch = make_op_batch(_rows(np.arange(10)), OpType.UPSERT, SCHEMA)
    assert engine.apply(encode(batch), 1).ok
    assert engine.apply(encode(batch).to_pybytes(), 2).ok
    with pytest.raises(InvalidArgumentError, match="IPC"):
        engine.apply(b"\x00garbage", 3)
    bad = pa.record_batch({"id": pa.array([1], pa.int32()), "__op": pa.array([6], pa.uint8())})
    with pytest.raises(InvalidArgumentError, match="int64"):
        engine.apply(bad, 3)
    with pytest.raises(IllegalStateError):
        engine.apply(batch, 2)
    assert engine.scan().num_rows == 10


def test_rows_applied_from_a_log_batch_outlive_the_batch(
    engine: StorageEngine, tmp_path: Path
) -> None:
    """The MemRowSet keeps a log entry batch's bytes as its columns: they must stay valid
    after every Python reference to the batch and the log's cache copy are gone."""
    import gc

    from nyala.consensus.runtime.wal_log import WalLog, WalLogOptions
    from nyala.consensus.types import EntryKind
    from nyala.tablet.write_entry import RequestId, decode_write_entry, encode_write_entry

    ops = encode(make_op_batch(_rows(np.arange(500)), OpType.INSERT, SCHEMA)).to_pybytes()
    with WalLog(tmp_path / "wal", "t" * 32, WalLogOptions(sync="none")) as log:
        entry_bytes = encode_write_entry(RequestId("client", 1, 0), 0, ops, timestamp=77)
        log.append(1, EntryKind.WRITE, entry_bytes)
        log.append(1, EntryKind.NO_OP, b"")
        batch = log.read_whole_batch(0, 1)
        assert batch is not None
        wire = batch.wire_view()
        payload_start = 24 + 24  # batch header, entry header
        entry = decode_write_entry(wire[payload_start:])
        assert (len(wire) - len(entry.ops)) % 8 == 0  # aligned: Arrow keeps the bytes
        del wire, entry, batch
        through, outcomes, alter = engine.apply_committed(log, 0, 2)
        assert (through, alter) == (2, None)
        ((index, effect, statuses, failed, _msg, client, seq, watermark, size, stamp),) = outcomes
        assert (index, effect, failed, client, seq, watermark) == (1, 0, 0, "client", 1, 0)
        assert stamp == 77  # the entry's timestamp, for the write's answer
        assert size == len(ops)
        assert statuses == bytes(500)
        assert engine.admit("client", 1) == 1  # applied: a retry is a duplicate
        first = engine.request_outcome("client", 1)
        assert first is not None
        assert (first.op_index, first.timestamp, first.error) == (1, 77, None)
        assert first.result is not None
        assert first.result.ok
        log.wait_durable()
        log.evict_through(2)
    gc.collect()
    table = engine.scan()
    assert table.column("id").to_pylist() == list(range(500))
    assert table.column("name").to_pylist()[-1] == "n499"
    engine.flush()
    assert engine.scan().num_rows == 500
    # The request's outcome was persisted with the flush.
    reopened = StorageEngine.open(tmp_path / "tablet", background_flush=False)
    assert reopened.request_outcome("client", 1) == first
    assert reopened.request_count == 1


def test_flush_compact_reopen(tmp_path: Path) -> None:
    path = tmp_path / "tablet"
    engine = StorageEngine.create(path, SCHEMA, background_flush=False)
    engine.write(_rows(np.arange(0, 500)), OpType.INSERT, 1)
    assert engine.flush() is not None
    engine.write(_rows(np.arange(250, 750)), OpType.UPSERT, 2)
    engine.write({"id": np.arange(0, 100)}, OpType.DELETE, 3)
    engine.flush()
    assert engine.stats()["rowsets"] == 2
    assert engine.compact()
    assert engine.stats()["rowsets"] == 1
    del engine
    reopened = StorageEngine.open(path)
    assert reopened.last_flushed_index == 3
    assert reopened.scan(columns=["id"]).column("id").to_pylist() == list(range(100, 750))
    with pytest.raises(AlreadyPresentError):
        StorageEngine.create(path, SCHEMA)
    with pytest.raises(NotFoundError):
        StorageEngine.open(tmp_path / "absent")


def test_background_compaction_merges_newer_rowsets_and_keeps_their_tombstones(
    tmp_path: Path,
) -> None:
    engine = StorageEngine.create(tmp_path / "tablet", SCHEMA, background_flush=False)
    engine.write(_rows(np.arange(0, 20_000)), OpType.INSERT, 1)
    engine.flush()
    engine.write({"id": np.arange(0, 10)}, OpType.DELETE, 2)
    engine.flush()
    engine.write(_rows(np.arange(20_000, 20_010)), OpType.INSERT, 3)
    engine.flush()
    assert not engine.compact_some(0, 4)  # three rowsets: below the threshold
    large = engine.stats()["data_bytes"]
    assert engine.compact_some(0, 3)
    stats = engine.stats()
    assert stats["rowsets"] == 2, "the two small rowsets merged, the large one left alone"
    assert 0 < stats["compaction_bytes_written"] < large / 10
    assert stats["disk_rows"] == 20_000 + 10 + 10, "the 10 tombstones stay: they hide rows"
    assert engine.scan(columns=["id"]).column("id").to_pylist() == list(range(10, 20_010))


def test_schema_change_and_snapshot(engine: StorageEngine) -> None:
    engine.write(_rows(np.arange(5)), OpType.INSERT, 1)
    next_schema = engine.schema.add_column(Column("w", "int32", nullable=True)).rename_column(
        "name", "label"
    )
    engine.alter_schema(next_schema, 2)
    assert engine.schema == next_schema
    table = engine.scan()
    assert table.schema.names == ["id", "v", "label", "w"]
    assert table.column("w").null_count == 5
    with engine.pinned() as snapshot:
        assert snapshot.last_flushed_index == 2
        assert all(f.exists() for f in snapshot.files)
        # One container format for every metadata file: metafile.py reads the Rust manifest.
        payload = metafile.decode(MetaKind.ROWSET_MANIFEST, snapshot.manifest_image)
        on_disk = metafile.read(
            snapshot.files[0].parent / "rowset-manifest", MetaKind.ROWSET_MANIFEST
        )
        assert payload == on_disk
    with pytest.raises(InvalidArgumentError):
        engine.alter_schema(next_schema, 3)


def test_write_entry_carries_its_timestamp_and_older_versions_read_as_zero() -> None:
    """Format 3 puts the entry's hybrid time in the header; formats 1 and 2 (no timestamp)
    still decode, as timestamp 0, and every version keeps the op batch where it was written."""
    import struct

    from nyala.errors import InvalidArgumentError
    from nyala.tablet.write_entry import (
        KIND_ALTER_SCHEMA,
        RequestId,
        decode_write_entry,
        encode_alter_schema_entry,
        encode_write_entry,
    )

    ops = b"x" * 16
    for client in ("", "c", "client-7"):
        rid = RequestId(client, 3, 1) if client else None
        payload = encode_write_entry(rid, 4, ops, timestamp=(1 << 63) + 5)
        assert (len(payload) - len(ops)) % 8 == 0
        entry = decode_write_entry(payload)
        assert (entry.request_id, entry.schema_version, entry.timestamp) == (rid, 4, (1 << 63) + 5)
        assert bytes(entry.ops) == ops
    alter = decode_write_entry(encode_alter_schema_entry(2, b"{}", timestamp=77))
    assert (alter.kind, alter.timestamp, bytes(alter.ops)) == (KIND_ALTER_SCHEMA, 77, b"{}")
    # A version 2 payload, as written before timestamps: header, client, padding, ops.
    head = struct.pack("<4sBBHqqI", b"NYWR", 2, 0, 1, 9, 8, 4) + b"c"
    old = decode_write_entry(head + bytes(-len(head) % 8) + ops)
    assert (old.request_id, old.timestamp, bytes(old.ops)) == (RequestId("c", 9, 8), 0, ops)
    with pytest.raises(InvalidArgumentError, match="timestamp"):
        encode_write_entry(None, 1, ops, timestamp=-1)


def test_damaged_request_outcomes_are_corruption_not_an_empty_index(tmp_path: Path) -> None:
    """The manifest's request outcomes are checked on open: an image cut short (its
    container checksum recomputed, as a buggy writer would leave it) is refused."""
    import struct

    from nyala.common import metafile
    from nyala.errors import CorruptionError

    path = tmp_path / "tablet"
    engine = StorageEngine.create(path, SCHEMA, background_flush=False)
    engine.write(_rows(np.arange(3)), OpType.INSERT, 1)
    engine.flush()
    del engine
    manifest = path / "rowset-manifest"
    payload = metafile.read(manifest, metafile.MetaKind.ROWSET_MANIFEST)
    # The payload ends with the image: u32 length + bytes (docs/storage-format.md).
    image_len = 2 + 8 + 4  # version, expiry search timestamp, no clients
    (length,) = struct.unpack_from("<I", payload, len(payload) - image_len - 4)
    assert length == image_len
    cut = payload[: -image_len - 4] + struct.pack("<I", image_len - 1) + payload[-image_len:-1]
    metafile.write_atomic(manifest, metafile.MetaKind.ROWSET_MANIFEST, cut)
    with pytest.raises(CorruptionError, match="request outcomes"):
        StorageEngine.open(path, background_flush=False)
