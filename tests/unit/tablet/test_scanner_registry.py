"""ScannerRegistry: continue, keep-alive and expiry on an injected clock."""

from __future__ import annotations

import pyarrow as pa
import pytest

from nyala import errors
from nyala.tserver.scanners import ScannerRegistry


def test_idle_scanners_expire_and_touched_ones_do_not() -> None:
    now = [0.0]
    registry = ScannerRegistry(ttl_ms=1_000, clock=lambda: now[0])
    batch = pa.RecordBatch.from_pydict({"id": [1]})
    idle = registry.open("t" * 32, 5, [batch])
    busy = registry.open("t" * 32, 5, [batch, batch])
    now[0] = 0.9
    assert registry.get(busy.scanner_id) is busy  # keep-alive
    now[0] = 1.5
    with pytest.raises(errors.ScannerExpiredError):
        registry.get(idle.scanner_id)
    assert registry.get(busy.scanner_id).snapshot_index == 5
    registry.close(busy.scanner_id)
    assert len(registry) == 0
