"""Rows that break each rule of the write contract, and a model of what a write must do with
them (docs/write-semantics.md). The property tests of every write path (``Table.write``,
sessions, ``nyala table load``, the Spark writer) generate batches with ``RowSpec``s, resolve
them against a ``Model`` of the table, write them, and check the outcomes and the table's rows
with it.

The table (``SCHEMA``, ``PARTITIONING``): ``id`` int64 key; ``v`` string NOT NULL; ``small``
int8; ``blob`` binary; ``c0..c{ROW_CELLS - 1}`` binary, which together can make a row over the
row limit out of cells within the cell limit. Hash-partitioned in 2 buckets times 2 ranges of
``id`` with a gap between them: 4 tablets, and keys no tablet covers.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa

from nyala import _native
from nyala.partition import HashPartitioning, RangePartitioning
from nyala.rowops import OpType
from nyala.schema import Schema

CELL_BYTES_MAX: int = _native.CELL_BYTES_MAX
ROW_BYTES_MAX: int = _native.ROW_BYTES_MAX

#: Cells of ``CELL_BYTES_MAX`` bytes that together overrun ``ROW_BYTES_MAX``.
ROW_CELLS = ROW_BYTES_MAX // CELL_BYTES_MAX + 1
SCHEMA = Schema.parse(
    "id:int64, v:string, small:int8?, blob:binary?, "
    + ", ".join(f"c{i}:binary?" for i in range(ROW_CELLS)),
    key=["id"],
)
#: The covered key ranges; keys between and around them have no tablet.
RANGES = ((0, 1000), (2000, 3000))
PARTITIONING = [HashPartitioning("id", 2), RangePartitioning("id", bounds=RANGES)]
#: The columns a scan compares (the wide ``c*`` cells are null in every row that applies).
COMPARED = ("id", "v", "small", "blob")


class Kind(enum.Enum):
    """What a generated row does to the write contract."""

    GOOD = "good"
    NULL = "null in a NOT NULL column"
    RANGE = "value out of range for int8"
    CELL = "cell over the size limit"
    ROW = "row over the size limit"
    GAP = "no tablet covers the key"
    DUPLICATE = "insert of a present key"
    MISSING = "update or delete of an absent key"


@dataclasses.dataclass(frozen=True)
class RowSpec:
    """An abstract row: its kind and a choice among the keys that suit it (resolved against
    the model when the batch is made, so a generator needs no knowledge of the table)."""

    kind: Kind
    choice: int


@dataclasses.dataclass(frozen=True)
class Row:
    """A concrete row to write: its operation, key and values (``wide`` fills every ``c*``)."""

    op: OpType
    id: int
    v: str | None
    small: int
    blob: bytes | None
    wide: bool = False

    def values(self) -> dict[str, Any]:
        """The compared columns as the table would hold them after this row applied."""
        return {"id": self.id, "v": self.v, "small": self.small, "blob": self.blob}


@dataclasses.dataclass(frozen=True)
class Expected:
    """What must happen to one row: ``"applied"`` or ``"failed"`` with an ``ErrorCode``."""

    outcome: str
    code: str = ""


def covered(key: int) -> bool:
    """Whether a tablet covers ``key``."""
    return any(low <= key < high for low, high in RANGES)


class Model:
    """The rows a table must hold, and the fresh keys not used yet."""

    def __init__(self) -> None:
        self.rows: dict[int, dict[str, Any]] = {}
        self._fresh = 0

    def fresh_key(self) -> int:
        """A covered key never used before."""
        n = self._fresh
        self._fresh += 1
        for low, high in RANGES:
            if n < high - low:
                return low + n
            n -= high - low
        raise AssertionError("the model ran out of covered keys")

    def resolve(
        self, op: OpType, specs: Sequence[RowSpec], tag: int, present: set[int] | None = None
    ) -> list[Row]:
        """Concrete rows for ``specs`` written as ``op`` (deletes carry only keys). ``present``
        (the model's keys by default) is the key set the rows are chosen against, updated as
        if every row applied: pass one set to several calls written together."""
        present = set(self.rows) if present is None else present
        rows = []
        for i, spec in enumerate(specs):
            key = self._key(op, spec, present)
            if op in (OpType.INSERT, OpType.UPSERT):
                present.add(key)
            elif op is OpType.DELETE:
                present.discard(key)
            rows.append(_row(op, spec, key, f"v{tag}-{i}"))
        return rows

    def _key(self, op: OpType, spec: RowSpec, present: set[int]) -> int:
        existing = sorted(present)
        if spec.kind is Kind.GAP:
            return RANGES[0][1] + spec.choice % (RANGES[1][0] - RANGES[0][1])
        if spec.kind is Kind.MISSING or (op is OpType.INSERT and spec.kind is not Kind.DUPLICATE):
            return self.fresh_key()
        wants_existing = spec.kind is Kind.DUPLICATE or op in (OpType.UPDATE, OpType.DELETE)
        if existing and (wants_existing or spec.choice % 2):
            return existing[spec.choice % len(existing)]
        return self.fresh_key()

    def expect(self, rows: Sequence[Row]) -> list[Expected]:
        """What each row must do, in order, starting from the model's rows (not changed)."""
        present = set(self.rows)
        out = []
        for row in rows:
            expected = _expect(row, present)
            if expected.outcome == "applied":
                if row.op is OpType.DELETE:
                    present.discard(row.id)
                else:
                    present.add(row.id)
            out.append(expected)
        return out

    def settle(
        self,
        rows: Sequence[Row],
        outcomes: Sequence[str],
        lookup: Callable[[int], dict[str, Any] | None],
    ) -> None:
        """Applies the rows that applied, in order; an ``"unknown"`` row's key takes what the
        table holds (``lookup``)."""
        for row, outcome in zip(rows, outcomes, strict=True):
            if outcome == "applied":
                if row.op is OpType.DELETE:
                    self.rows.pop(row.id, None)
                else:
                    self.rows[row.id] = row.values()
            elif outcome == "unknown":
                found = lookup(row.id)
                if found is None:
                    self.rows.pop(row.id, None)
                else:
                    self.rows[row.id] = found


def _row(op: OpType, spec: RowSpec, key: int, v: str) -> Row:
    small = spec.choice % 100
    blob = bytes([spec.choice % 256]) * (spec.choice % 7)
    if spec.kind is Kind.NULL:
        return Row(op, key, None, small, blob)
    if spec.kind is Kind.RANGE:
        return Row(op, key, v, 128 + spec.choice % 1000, blob)
    if spec.kind is Kind.CELL:
        return Row(op, key, v, small, b"x" * (CELL_BYTES_MAX + 1 + spec.choice % 100))
    if spec.kind is Kind.ROW:
        return Row(op, key, v, small, None, wide=True)
    return Row(op, key, v, small, blob)


def _expect(row: Row, present: set[int]) -> Expected:
    # In the client's order: the row's values, then its tablet, then (at the tablet) its key.
    if row.op is not OpType.DELETE:
        breaks_rule = (
            row.v is None
            or not -128 <= row.small <= 127
            or (row.blob is not None and len(row.blob) > CELL_BYTES_MAX)
            or row.wide
        )
        if breaks_rule:
            return Expected("failed", "INVALID_ARGUMENT")
    if not covered(row.id):
        return Expected("failed", "NOT_FOUND")
    if row.op is OpType.INSERT and row.id in present:
        return Expected("failed", "ALREADY_PRESENT")
    if row.op in (OpType.UPDATE, OpType.DELETE) and row.id not in present:
        return Expected("failed", "NOT_FOUND")
    return Expected("applied")


def rows_table(rows: Sequence[Row]) -> pa.Table:
    """The rows as the caller's input: every column (``small`` as int64, so a value out of
    int8's range reaches the client), or only ``id`` when every row is a delete."""
    ids = pa.array([r.id for r in rows], pa.int64())
    if rows and all(r.op is OpType.DELETE for r in rows):
        return pa.table({"id": ids})
    wide_cell = b"w" * CELL_BYTES_MAX
    columns: dict[str, pa.Array] = {
        "id": ids,
        "v": pa.array([r.v for r in rows], pa.string()),
        "small": pa.array([r.small for r in rows], pa.int64()),
        "blob": pa.array([r.blob for r in rows], pa.binary()),
    }
    for i in range(ROW_CELLS):
        columns[f"c{i}"] = pa.array([wide_cell if r.wide else None for r in rows], pa.binary())
    return pa.table(columns)


def table_rows(scanned: pa.Table) -> dict[int, dict[str, Any]]:
    """A scan's rows by key, compared columns only."""
    return {r["id"]: r for r in scanned.select(list(COMPARED)).to_pylist()}


def outcome_names(codes: Iterable[int]) -> list[str]:
    """``RowOutcome`` values as ``"applied"``, ``"failed"``, ``"unknown"``."""
    names = {0: "applied", 1: "failed", 2: "unknown"}
    return [names[int(c)] for c in codes]


__all__ = [
    "COMPARED",
    "PARTITIONING",
    "RANGES",
    "ROW_CELLS",
    "SCHEMA",
    "Expected",
    "Kind",
    "Model",
    "Row",
    "RowSpec",
    "covered",
    "outcome_names",
    "rows_table",
    "table_rows",
]
