"""Row versions in the storage engine (MVCC) against a plain-Python model of versioned rows.

Random inserts, updates, upserts and deletes at non-decreasing timestamps, with random flushes,
compactions at random ancient history marks and reopens in between; then every snapshot scan
at or above the history GC mark, diff scans between random pairs of timestamps, and the latest
scan must equal the model exactly, predicates on changed columns included.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nyala.errors import IllegalStateError, InvalidArgumentError
from nyala.rowops import OpType, make_op_batch
from nyala.schema import Schema
from nyala.storage import RowStatus, StorageEngine

SCHEMA = Schema.parse("id:int64, v:int64?, s:string?", key=["id"])
KEYS = 24
Row = tuple[int | None, str | None]


@dataclass
class Model:
    """Per key, every version in op order as (timestamp, row or None for a deletion)."""

    versions: dict[int, list[tuple[int, Row | None]]] = field(default_factory=dict)

    def at(self, ts: int | None) -> dict[int, Row]:
        """The rows visible at ``ts`` (None: the newest)."""
        out: dict[int, Row] = {}
        for key, versions in self.versions.items():
            visible = [row for t, row in versions if ts is None or t <= ts]
            if visible and visible[-1] is not None:
                out[key] = visible[-1]
        return out

    def live(self, key: int) -> bool:
        versions = self.versions.get(key)
        return bool(versions) and versions[-1][1] is not None  # type: ignore[index]

    def apply(self, op: OpType, key: int, row: Row, ts: int) -> RowStatus:
        live = self.live(key)
        if op in (OpType.INSERT, OpType.INSERT_IGNORE):
            if live:
                return RowStatus.ALREADY_PRESENT if op == OpType.INSERT else RowStatus.OK
            self.versions.setdefault(key, []).append((ts, row))
        elif op == OpType.UPSERT:
            self.versions.setdefault(key, []).append((ts, row))
        elif op in (OpType.UPDATE, OpType.DELETE):
            if not live:
                return RowStatus.NOT_FOUND
            self.versions[key].append((ts, row if op == OpType.UPDATE else None))
        return RowStatus.OK


def _table(rows: dict[int, Row]) -> list[tuple[int, int | None, str | None]]:
    return [(k, *rows[k]) for k in sorted(rows)]


def _scanned(table: pa.Table) -> list[tuple[int, int | None, str | None]]:
    d = table.to_pydict()
    return list(zip(d["id"], d["v"], d["s"], strict=True))


def _diff(model: Model, start: int, end: int) -> list[tuple[int, int | None, str | None, bool]]:
    before, after = model.at(start), model.at(end)
    out = []
    for key in sorted(before.keys() | after.keys()):
        if key in after and before.get(key) != after[key]:
            out.append((key, *after[key], False))
        elif key not in after:
            out.append((key, None, None, True))
    return out


OPS = [OpType.INSERT, OpType.UPSERT, OpType.UPDATE, OpType.DELETE, OpType.INSERT_IGNORE]

write_step = st.tuples(
    st.just("write"),
    st.integers(0, 2),  # timestamp advance (0: the same timestamp as the previous batch)
    st.lists(
        st.tuples(
            st.sampled_from(OPS),
            st.integers(0, KEYS - 1),
            st.one_of(st.none(), st.integers(-5, 5)),
            st.sampled_from([None, "a", "bb"]),
        ),
        min_size=1,
        max_size=8,
        unique_by=lambda r: r[1],
    ),
)
maintenance_step = st.tuples(
    st.sampled_from(["flush", "compact", "reopen"]), st.integers(0, 100), st.just([])
)
steps = st.lists(st.one_of(write_step, write_step, maintenance_step), min_size=1, max_size=25)


class Harness:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.engine = StorageEngine.create(path, SCHEMA, background_flush=False)
        self.model = Model()
        self.ts = 1
        self.index = 0

    def write(self, advance: int, rows: list[tuple[OpType, int, int | None, str | None]]) -> None:
        self.ts += advance
        self.index += 1
        data = {
            "id": np.array([r[1] for r in rows], dtype=np.int64),
            "v": pa.array([r[2] for r in rows], type=pa.int64()),
            "s": pa.array([r[3] for r in rows], type=pa.string()),
        }
        ops = np.array([int(r[0]) for r in rows], dtype=np.uint8)
        batch = make_op_batch(data, ops, SCHEMA)
        result = self.engine.apply(batch, self.index, self.ts)
        expected = [self.model.apply(op, key, (v, s), self.ts) for op, key, v, s in rows]
        assert [RowStatus(int(x)) for x in result.statuses] == expected

    def maintain(self, kind: str, mark_percent: int) -> None:
        if kind == "flush":
            self.engine.flush()
        elif kind == "compact":
            mark = self.ts * mark_percent // 100
            self.engine.compact(ancient_history_mark=mark)
            assert self.engine.history_gc_mark >= min(mark, self.engine.history_gc_mark)
        else:
            # A replica replays its WAL after a restart; here the flush stands in for that.
            self.engine.flush()
            mark = self.engine.history_gc_mark
            del self.engine
            self.engine = StorageEngine.open(self.path, background_flush=False)
            assert self.engine.history_gc_mark == mark

    def check(self, data: st.DataObject) -> None:
        engine, model = self.engine, self.model
        mark = engine.history_gc_mark
        assert _scanned(engine.scan()) == _table(model.at(None))
        for ts in range(mark, self.ts + 2):
            assert _scanned(engine.scan(snapshot_ts=ts)) == _table(model.at(ts)), ts
        if mark > 0:
            with pytest.raises(InvalidArgumentError, match=f"history GC mark {mark}"):
                engine.scan(snapshot_ts=mark - 1)
        ts = data.draw(st.integers(mark, self.ts + 1), label="predicate ts")
        bound = data.draw(st.integers(-5, 5), label="v bound")
        got = engine.scan(["id", "v"], [("v", ">=", bound)], snapshot_ts=ts).to_pydict()
        want = [(k, r[0]) for k, r in sorted(model.at(ts).items()) if r[0] is not None]
        assert list(zip(got["id"], got["v"], strict=True)) == [w for w in want if w[1] >= bound]
        limit = data.draw(st.integers(1, 5), label="limit")
        cursor = engine.open_scan(["id"], lower_bound={"id": 3}, limit=limit, snapshot_ts=ts)
        ids: list[int] = []
        while (batch := cursor.next_batch(64)) is not None:
            ids.extend(batch.column(0).to_pylist())
        assert ids == [k for k in sorted(model.at(ts)) if k >= 3][:limit]
        for _ in range(3):
            start = data.draw(st.integers(mark, self.ts + 1), label="diff start")
            end = data.draw(st.integers(start, self.ts + 1), label="diff end")
            diff = engine.diff_scan(start, end).to_pydict()
            got_diff = list(zip(diff["id"], diff["v"], diff["s"], diff["is_deleted"], strict=True))
            assert got_diff == _diff(model, start, end), (start, end)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(steps=steps, data=st.data())
def test_versions_match_the_model(steps: list[tuple[str, int, Any]], data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        harness = Harness(Path(tmp) / "tablet")
        for kind, number, rows in steps:
            if kind == "write":
                harness.write(number, rows)
            else:
                harness.maintain(kind, number)
        harness.check(data)


def test_snapshot_scan_picks_versions_in_memory_and_on_disk(tmp_path: Path) -> None:
    engine = StorageEngine.create(tmp_path / "t", SCHEMA, background_flush=False)
    engine.write({"id": [1, 2], "v": [10, 20], "s": ["a", "b"]}, OpType.INSERT, 1, 100)
    engine.flush()
    engine.write({"id": [1], "v": [11], "s": ["a2"]}, OpType.UPDATE, 2, 200)
    engine.write({"id": [2]}, OpType.DELETE, 3, 300)
    for flushed in (False, True):
        if flushed:
            engine.flush()
        assert _scanned(engine.scan(snapshot_ts=99)) == []
        assert _scanned(engine.scan(snapshot_ts=150)) == [(1, 10, "a"), (2, 20, "b")]
        assert _scanned(engine.scan(snapshot_ts=250)) == [(1, 11, "a2"), (2, 20, "b")]
        assert _scanned(engine.scan()) == [(1, 11, "a2")]
        # A predicate matches the visible version only, never an older one.
        assert engine.scan(["id"], [("v", "=", 10)]).num_rows == 0
        assert engine.scan(["id"], [("v", "=", 10)], snapshot_ts=150).num_rows == 1
    diff = engine.diff_scan(150, 300).to_pydict()
    assert diff == {
        "id": [1, 2],
        "v": [11, None],
        "s": ["a2", None],
        "is_deleted": [False, True],
    }
    assert engine.compact(ancient_history_mark=250)
    assert engine.history_gc_mark == 250
    assert _scanned(engine.scan(snapshot_ts=250)) == [(1, 11, "a2"), (2, 20, "b")]
    with pytest.raises(InvalidArgumentError, match="history GC mark 250"):
        engine.scan(snapshot_ts=150)
    with pytest.raises(InvalidArgumentError, match="history GC mark 250"):
        engine.diff_scan(100, 300)
    with pytest.raises(IllegalStateError, match="timestamp 299"):
        engine.write({"id": [3], "v": [3], "s": ["c"]}, OpType.INSERT, 4, 299)


def test_data_written_before_row_versions_opens_and_reads_as_timestamp_0(tmp_path: Path) -> None:
    """``data/storage_pre_mvcc`` was written by the engine before row versions (manifest
    payload version 1, rowsets without ``__ts``): two rowsets, the second with updates and a
    tombstone. It opens, every row reads as timestamp 0, and new versions stack on top."""
    import shutil

    path = tmp_path / "tablet"
    shutil.copytree(Path(__file__).parent / "data" / "storage_pre_mvcc", path)
    engine = StorageEngine.open(path, background_flush=False)
    old: list[tuple[int, int | None, str | None]] = [(i, i, f"s{i}") for i in range(10)]
    old[3:5] = [(3, 30, "u3"), (4, 40, "u4")]
    del old[5]
    assert engine.history_gc_mark == 0
    assert _scanned(engine.scan()) == old
    assert _scanned(engine.scan(snapshot_ts=0)) == old
    assert engine.write({"id": [1], "v": [1], "s": ["x"]}, OpType.INSERT, 4, 50).errors() == [
        (0, RowStatus.ALREADY_PRESENT)
    ]
    engine.write({"id": [0], "v": [100], "s": ["new"]}, OpType.UPDATE, 5, 100)
    engine.flush()
    assert engine.compact(ancient_history_mark=0)
    engine = StorageEngine.open(path, background_flush=False)
    assert _scanned(engine.scan(snapshot_ts=99)) == old
    assert _scanned(engine.scan())[0] == (0, 100, "new")
    assert engine.diff_scan(0, 100).to_pydict()["id"] == [0]


def test_versions_straddling_read_batches(tmp_path: Path) -> None:
    """A rowset is read in batches of 64 Ki rows: a key whose versions straddle two batches
    still yields exactly its visible version (keys 1.. have two versions, key 0 one, so the
    versions of key 32768 are rows 65535 and 65536)."""
    engine = StorageEngine.create(tmp_path / "t", SCHEMA, background_flush=False)
    keys = 70_000
    ids = np.arange(keys, dtype=np.int64)
    engine.write({"id": ids, "v": ids}, OpType.INSERT, 1, 10)
    engine.flush()
    engine.write({"id": ids[1:], "v": -ids[1:], "s": [None] * (keys - 1)}, OpType.UPDATE, 2, 20)
    engine.flush()
    assert engine.compact(ancient_history_mark=0)
    for ts, want in ((10, ids), (None, np.concatenate([[0], -ids[1:]])), (20, None)):
        table = engine.scan(["id", "v"], snapshot_ts=ts)
        assert table.column("id").to_numpy().tolist() == ids.tolist()
        expected = np.concatenate([[0], -ids[1:]]) if want is None else want
        assert table.column("v").to_numpy().tolist() == expected.tolist()
    mid = engine.scan(["id"], [("v", "<", 0)], snapshot_ts=10)
    assert mid.num_rows == 0
