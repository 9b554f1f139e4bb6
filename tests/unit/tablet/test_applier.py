"""The applier over a real log and storage engine: one native call per committed range, the
outcome per WRITE entry (applied, refused, duplicate, stale), schema changes handed back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from nyala.consensus.runtime.wal_log import WalLog, WalLogOptions
from nyala.consensus.types import EntryKind
from nyala.rowops import OpType, encode, make_op_batch
from nyala.schema import Schema
from nyala.storage import RowStatus, StorageEngine
from nyala.tablet.applier import Applier
from nyala.tablet.write_entry import RequestId, encode_alter_schema_entry, encode_write_entry

SCHEMA = Schema.parse("id:int64, v:double?", key=["id"])


def _ops(ids: list[int], op: OpType = OpType.INSERT) -> bytes:
    batch = make_op_batch({"id": np.array(ids, dtype=np.int64)}, op, SCHEMA)
    return bytes(encode(batch).to_pybytes())


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[tuple[WalLog, StorageEngine]]:
    engine = StorageEngine.create(tmp_path / "tablet", SCHEMA, background_flush=False)
    with WalLog(tmp_path / "wal", "t" * 32, WalLogOptions(sync="none")) as log:
        yield log, engine


def test_a_committed_range_is_applied_with_an_outcome_per_write(
    parts: tuple[WalLog, StorageEngine],
) -> None:
    log, engine = parts
    alters: list[tuple[int, int, bytes]] = []
    applier = Applier(log, engine, lambda i, v, doc: alters.append((i, v, doc)))
    rid = RequestId("c", 1, 1)
    log.append(1, EntryKind.NO_OP, b"")
    log.append(1, EntryKind.WRITE, encode_write_entry(rid, 0, _ops([1, 2])))  # 2
    log.append(1, EntryKind.WRITE, encode_write_entry(rid, 0, _ops([3])))  # 3: duplicate
    log.append(1, EntryKind.WRITE, encode_write_entry(None, 0, _ops([2, 4])))  # 4
    log.append(1, EntryKind.WRITE, encode_write_entry(RequestId("c", 2, 1), 0, b"junk"))  # 5
    log.append(1, EntryKind.WRITE, encode_alter_schema_entry(1, b"{}"))  # 6
    log.append(1, EntryKind.WRITE, encode_write_entry(RequestId("c", 3, 3), 0, _ops([5])))  # 7
    log.append(1, EntryKind.WRITE, encode_write_entry(RequestId("c", 1, 1), 0, _ops([6])))  # 8
    with applier.collecting():
        applier.apply(1, 8)
        assert applier.applied_index == 8
        first = applier.take_outcome(2)
        assert first is not None
        assert first.result is not None
        assert first.result.ok
        assert applier.take_outcome(3) == first  # the duplicate answers with the first
        fourth = applier.take_outcome(4)
        assert fourth is not None
        assert fourth.result is not None
        assert fourth.result.errors() == [(0, RowStatus.ALREADY_PRESENT)]
        refused = applier.take_outcome(5)
        assert refused is not None
        assert refused.result is None
        assert refused.error
        assert alters == [(6, 1, b"{}")]
        stale = applier.take_outcome(8)  # seq 1 < first incomplete 3, forgotten
        assert stale is not None
        assert stale.error == "stale retry of a completed request"
    assert sorted(engine.scan().column("id").to_pylist()) == [1, 2, 4, 5]
    assert (applier.rows_written, applier.rows_failed) == (4, 1)
    assert applier.outcome_of(rid) is None
    assert applier.is_stale(rid)
    assert applier.outcome_of(RequestId("c", 3, 3)) is not None


def test_a_range_is_applied_once_across_calls_and_restarts_above_storage(
    parts: tuple[WalLog, StorageEngine],
) -> None:
    log, engine = parts
    for i in range(50):
        log.append(1, EntryKind.WRITE, encode_write_entry(RequestId("c", i, 0), 0, _ops([i])))
    applier = Applier(log, engine)
    applier.apply(1, 20)
    applier.apply(10, 50)  # overlapping range: what was applied is not applied again
    assert engine.scan().num_rows == 50
    assert engine.last_applied_index == 50
    # A new applier over the same storage (a restart) starts above its last applied index.
    again = Applier(log, engine)
    again.apply(1, 50)
    assert again.applied_index == 50


def test_without_a_collector_the_counts_are_kept_and_no_outcome(
    parts: tuple[WalLog, StorageEngine],
) -> None:
    """A follower's applier: nobody collects outcomes, so none is built, but the rows and
    bytes written and the failures by code count as on the leader."""
    log, engine = parts
    applier = Applier(log, engine, None)
    log.append(1, EntryKind.WRITE, encode_write_entry(None, 0, _ops([1, 2])))
    log.append(1, EntryKind.WRITE, encode_write_entry(None, 0, _ops([2, 3])))
    applier.apply(1, 2)
    assert applier.applied_index == 2
    assert (applier.rows_written, applier.rows_failed) == (3, 1)
    assert applier.rows_failed_by_code == {"ALREADY_PRESENT": 1}
    assert applier.bytes_written > 0
    assert applier.take_outcome(1) is None
    assert applier.take_outcome(2) is None
    assert sorted(engine.scan().column("id").to_pylist()) == [1, 2, 3]
