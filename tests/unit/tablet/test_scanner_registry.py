"""ScannerRegistry over real storage cursors: continue, keep-alive, expiry on an injected
clock, and what an expired or closed scanner lets go of."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

from nyala import errors
from nyala.rowops import OpType
from nyala.schema import Schema
from nyala.storage import StorageEngine
from nyala.tserver.scanners import ScannerRegistry

SCHEMA = Schema.parse("id:int64, v:double?", key=["id"])


@pytest.fixture
def engine(tmp_path: Path) -> StorageEngine:
    engine = StorageEngine.create(tmp_path / "tablet", SCHEMA, background_flush=False)
    ids = np.arange(1_000, dtype=np.int64)
    engine.write({"id": ids, "v": ids / 2}, OpType.INSERT, 1)
    engine.flush()
    return engine


def test_idle_scanners_expire_and_touched_ones_do_not(engine: StorageEngine) -> None:
    now = [0.0]
    registry = ScannerRegistry(ttl_ms=1_000, clock=lambda: now[0])
    idle = registry.open("t" * 32, 5, engine.open_scan(), batch_bytes_max=1024)
    busy = registry.open("t" * 32, 5, engine.open_scan(), batch_bytes_max=1024)
    now[0] = 0.9
    assert registry.get(busy.scanner_id) is busy  # keep-alive
    now[0] = 1.5
    with pytest.raises(errors.ScannerExpiredError):
        registry.get(idle.scanner_id)
    scanner = registry.get(busy.scanner_id)
    assert scanner.snapshot_index == 5
    batch = scanner.cursor.next_batch(scanner.batch_bytes_max)
    assert batch is not None
    assert 0 < batch.num_rows < 1_000  # a page, not the whole result
    registry.close(busy.scanner_id)
    assert len(registry) == 0


def test_expiry_lets_go_of_the_files_a_cursor_pins(engine: StorageEngine, tmp_path: Path) -> None:
    now = [0.0]
    registry = ScannerRegistry(ttl_ms=1_000, clock=lambda: now[0])
    pinned = sorted((tmp_path / "tablet").glob("rs-*.parquet"))
    registry.open("t" * 32, 1, engine.open_scan(), batch_bytes_max=1024)
    engine.write({"id": np.array([5_000], dtype=np.int64)}, OpType.INSERT, 2)
    engine.flush()
    assert engine.compact()
    assert all(p.exists() for p in pinned), "the open cursor keeps the replaced rowsets"
    now[0] = 2.0
    assert registry.expire() == 1
    gc.collect()
    assert not any(p.exists() for p in pinned), "expiry released them"
    assert len(list((tmp_path / "tablet").glob("rs-*.parquet"))) == 1
