"""Session buffering, flushing and error collection, with the write step injected (the
cluster-backed path is covered by tests/integration/test_client.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pyarrow as pa
import pytest

from nyala import errors
from nyala.cli.table import parse_where
from nyala.client.scanner import predicate_to_pb
from nyala.client.session import Session
from nyala.client.write import RowError, WriteResult
from nyala.rowops import OpType, PreparedRows, prepare_op_batch
from nyala.schema import Schema

SCHEMA = Schema.parse("id:int64, v:string?", key=["id"])


class Recorder:
    """Stands in for the cluster: records every batch and fails the ids it is told to."""

    def __init__(self, failing: set[int] = frozenset(), delay_s: float = 0.0) -> None:  # type: ignore[assignment]
        self.batches: list[pa.RecordBatch] = []
        self.failing = set(failing)
        self.delay_s = delay_s
        self.lock = threading.Lock()

    def make(
        self, table: str, data: Any, op: OpType, ignore_extra: bool
    ) -> tuple[Any, PreparedRows]:
        return Info(SCHEMA), prepare_op_batch(data, op, SCHEMA, ignore_extra_columns=ignore_extra)

    def write(self, info: Any, prepared: PreparedRows) -> WriteResult:
        time.sleep(self.delay_s)
        batch = prepared.batch
        with self.lock:
            self.batches.append(batch)
        ids = batch.column("id").to_pylist()
        bad = [
            RowError(i, "ALREADY_PRESENT", "") for i, key in enumerate(ids) if key in self.failing
        ]
        return WriteResult.of(prepared.input, ["id"], failed=bad)

    def ids(self) -> list[int]:
        return sorted(i for b in self.batches for i in b.column("id").to_pylist())


class Info:
    """What a session needs of a table's info: its schema."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema


def test_manual_session_sends_on_flush_merged_per_table() -> None:
    rec = Recorder(failing={3})
    session = Session(rec.make, rec.write, flush="manual")
    session.insert("t", {"id": [1, 2], "v": ["a", "b"]})
    session.insert("t", {"id": [3, 4], "v": ["c", None]})
    assert rec.batches == []
    assert session.pending_rows == 4
    session.flush()
    assert len(rec.batches) == 1  # two applies, one merged batch
    assert rec.ids() == [1, 2, 3, 4]
    [error] = session.errors
    assert (error.table, error.code, error.values) == ("t", "ALREADY_PRESENT", {"id": 3, "v": "c"})
    assert (error.call, error.row, error.key) == (1, 0, {"id": 3})
    assert session.pop_errors() == [error]
    assert session.errors == []
    session.close()
    with pytest.raises(errors.IllegalStateError):
        session.upsert("t", {"id": [5], "v": ["e"]})


def test_background_session_flushes_by_rows_and_applies_back_pressure() -> None:
    rec = Recorder(delay_s=0.01)
    with Session(
        rec.make, rec.write, flush="background", flush_rows=50, buffer_bytes_max=4_000
    ) as session:
        for start in range(0, 1000, 10):
            session.upsert("t", {"id": list(range(start, start + 10)), "v": ["x"] * 10})
        assert session.pending_rows <= 1000
    assert rec.ids() == list(range(1000))
    assert len(rec.batches) > 1


def test_a_failed_flush_is_raised_by_the_next_flush_and_its_rows_are_errors() -> None:
    def broken(info: Any, prepared: PreparedRows) -> WriteResult:
        raise errors.TimedOutError("no tablet locations")

    session = Session(Recorder().make, broken, flush="manual")
    session.delete("t", {"id": [1]})
    with pytest.raises(errors.TimedOutError):
        session.flush()
    session.flush()  # reported once
    [error] = session.errors
    assert (error.code, error.key, error.outcome) == ("TIMED_OUT", {"id": 1}, "failed")
    with pytest.raises(errors.InvalidArgumentError):
        Session(Recorder().make, broken, flush="sometimes")


def test_row_problems_reach_errors_not_the_caller_and_errors_are_bounded() -> None:
    rec = Recorder(failing={7, 8, 9})
    with Session(
        rec.make, rec.write, flush="background", flush_interval_ms=10, session_error_rows_max=4
    ) as session:
        # A key that is null: refused at once, never sent, and the call does not raise.
        session.upsert("t", {"id": pa.array([1, None, 3], pa.int64()), "v": ["a", "b", "c"]})
        assert [(e.call, e.row, e.code) for e in session.errors] == [(0, 1, "INVALID_ARGUMENT")]
        session.insert("t", {"id": [7, 8, 9, 10], "v": ["x"] * 4})
    assert rec.ids() == [1, 3, 7, 8, 9, 10]
    assert len(session.errors) == 4  # 1 refused + 3 duplicates: the bound is reached
    assert not session.error_buffer_overflowed
    session = Session(rec.make, rec.write, session_error_rows_max=2)
    session.insert("t", {"id": [7, 8, 9], "v": ["x"] * 3})
    session.flush()
    assert len(session.errors) == 2
    assert session.error_buffer_overflowed
    assert len(session.pop_errors()) == 2
    assert not session.error_buffer_overflowed
    # A whole-input problem still raises at the call that gave it.
    with pytest.raises(errors.InvalidArgumentError, match="not in the table"):
        session.upsert("t", {"id": [1], "nope": [2]})
    extra = Session(rec.make, rec.write, ignore_extra_columns=True)
    extra.upsert("t", {"id": [12], "nope": [2]})
    extra.close()
    assert 12 in rec.ids()


def test_where_parsing_and_predicates() -> None:
    assert parse_where(SCHEMA, "id >= 10") == ("id", ">=", 10)
    assert parse_where(SCHEMA, "v is not null") == ("v", "is not null")
    assert parse_where(SCHEMA, "id in (1, 2,3)") == ("id", "in", [1, 2, 3])
    assert parse_where(SCHEMA, "v = 'a b'") == ("v", "=", "a b")
    for bad in ["id >= ten", "id", "nope = 1", "id in 1,2", "v is null 3"]:
        with pytest.raises(errors.InvalidArgumentError):
            parse_where(SCHEMA, bad)
    pb = predicate_to_pb(SCHEMA, ("id", "in", [1, 2]))
    assert [v.int_value for v in pb.values] == [1, 2]
    with pytest.raises(errors.InvalidArgumentError):
        predicate_to_pb(SCHEMA, ("id", "=", "x"))
    with pytest.raises(errors.InvalidArgumentError):
        predicate_to_pb(SCHEMA, ("id", "between", 1))
