"""Range partition pruning on a multi-column range key: a scan keeps every tablet that could
hold a matching row. Checked against brute force: for random range bounds (with a hash level
in front) and random predicates on the range columns, every partition that holds some row of
a dense value domain meeting the predicates must survive pruning (no false pruning); and on
simple layouts pruning does drop the partitions that cannot match (by the first column, and by
the second one when the first is fixed by '=')."""

from __future__ import annotations

import datetime as dt
import itertools
import operator
from collections.abc import Callable
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from nyala.client.meta_cache import TableInfo, TabletLocation
from nyala.client.scanner import Scanner
from nyala.errors import InvalidArgumentError
from nyala.partition import (
    HashPartitioning,
    PartitionSchema,
    RangeSpec,
    create_partitions,
    encode_key,
)
from nyala.schema import Schema

D = dt.date
#: Range key layouts: the schema text (range columns first, in order) and the key.
LAYOUTS = [
    ("a:int8, b:int32, h:int64", ["a", "b"]),
    ("a:string, b:int8, h:int64", ["a", "b"]),
    ("a:date, b:string, h:int64", ["a", "b"]),
    ("a:int16, h:int64", ["a"]),
    ("a:string, h:int64", ["a"]),
    ("a:varchar(2), b:int8, h:int64", ["a", "b"]),
]
#: A domain of each type dense around the values predicates and bounds use, with its ends.
DOMAINS: dict[str, list[Any]] = {
    "int8": [-128, *range(-4, 5), 127],
    "int16": [-(2**15), *range(-4, 5), 2**15 - 1],
    "int32": [-(2**31), -1, 0, 1, 2**31 - 1],
    "string": ["", "\x00", "a", "a\x00", "a\x00b", "ab", "b", "bb", "ÿ"],
    "varchar(2)": ["", "\x00", "a", "a\x00", "ab", "b", "bb"],
    "date": [D(1, 1, 1), D(1969, 12, 31), D(1970, 1, 1), D(1970, 1, 2), D(2024, 2, 29)],
}
COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
#: Predicate values that are not of the column's type or do not fit it (pruning skips them).
ODD_VALUES: list[Any] = [1.5, 1000, 2**40, "x", None, "abc"]


def prune(layout: int, bounds: list[tuple[bytes, bytes]], where: list[tuple[Any, ...]]) -> Any:
    """The schema, the partitions (with a hash level of 2 buckets in front) and those a scan
    keeps; None if the scan refuses a literal."""
    text, range_columns = LAYOUTS[layout]
    schema = Schema.parse(text, key=[*range_columns, "h"])
    partition_schema = PartitionSchema((HashPartitioning(["h"], 2),), tuple(range_columns))
    partitions = create_partitions(partition_schema, RangeSpec(bounds=tuple(bounds)))
    tablets = [TabletLocation(f"t{i}", p, (), "") for i, p in enumerate(partitions)]
    info = TableInfo("t1", "t", schema, partition_schema, 3)
    try:
        scanner = Scanner(None, None, info, where=where, timeout_ms=1_000)  # type: ignore[arg-type]
    except InvalidArgumentError:
        return None  # a literal the column's type refuses: no scan to prune
    return schema, partitions, {t.partition for t in scanner._prune_ranges(tablets)}


def matches(value: Any, op: str, literal: Any) -> bool:
    """What storage answers for a first-column value (comparison across types never holds)."""
    if op == "in":
        return any(matches(value, "=", v) for v in literal)
    if isinstance(literal, bool) or literal is None:
        return False
    if isinstance(value, int) and isinstance(literal, (int, float)):
        return COMPARE[op](value, literal)
    if type(value) is not type(literal):
        return False
    return COMPARE[op](value, literal)


@st.composite
def cases(draw: st.DrawFn) -> tuple[int, list[tuple[bytes, bytes]], list[tuple[Any, ...]]]:
    layout = draw(st.integers(0, len(LAYOUTS) - 1))
    text, range_columns = LAYOUTS[layout]
    types = [c.split(":")[1] for c in text.split(", ")][: len(range_columns)]
    rows = [tuple(r) for r in itertools.product(*(DOMAINS[t] for t in types))]
    keys = sorted({encode_key(types, r) for r in rows})
    cuts = sorted(set(draw(st.lists(st.sampled_from(keys), min_size=1, max_size=6))))
    edges = [b"" if draw(st.booleans()) else cuts[0], *cuts[1:], b""]
    if len(cuts) > 1 and draw(st.booleans()):
        edges[-1] = cuts[-1]
    ranges = [
        (low, high)
        for low, high in itertools.pairwise(edges)
        if (not high or low < high) and draw(st.booleans())
    ]
    where = []
    for column, type_ in zip(range_columns, types, strict=True):
        literals = DOMAINS[type_] + ([] if type_ == "date" else ODD_VALUES)
        predicate = st.one_of(
            st.tuples(st.sampled_from(sorted(COMPARE)), st.sampled_from(literals)),
            st.tuples(st.just("="), st.sampled_from(literals)),  # fixes a prefix more often
            st.tuples(st.just("in"), st.lists(st.sampled_from(literals), max_size=3)),
        )
        where += [(column, op, v) for op, v in draw(st.lists(predicate, max_size=2))]
    return layout, ranges or [(b"", b"")], where


@given(cases())
@settings(max_examples=400, deadline=None)
def test_no_partition_that_could_hold_a_matching_row_is_pruned(
    case: tuple[int, list[tuple[bytes, bytes]], list[tuple[Any, ...]]],
) -> None:
    layout, bounds, where = case
    pruned = prune(layout, bounds, where)
    assume(pruned is not None)
    schema, partitions, kept = pruned
    _, range_columns = LAYOUTS[layout]
    types = [schema.column(c).type for c in range_columns]
    rows = list(itertools.product(*(DOMAINS[t] for t in types)))
    for partition in partitions:
        low, high = partition.range_bounds()
        holds = [
            row
            for row in rows
            if low <= encode_key(types, row) and (not high or encode_key(types, row) < high)
        ]
        matching = [
            r for r in holds if all(matches(r[range_columns.index(c)], op, v) for c, op, v in where)
        ]
        assert not matching or partition in kept, (partition, matching[0], where)


def test_the_first_range_column_prunes_a_multi_column_range_key() -> None:
    def day(n: int) -> D:
        return D(2024, 1, 1) + dt.timedelta(days=n)

    types = ["date", "string"]
    bounds = [
        (encode_key(types, [day(i), ""]), encode_key(types, [day(i + 1), ""])) for i in range(5)
    ]  # one range a day, each split by no second column value

    def kept_days(*where: tuple[Any, ...]) -> list[int]:
        _, partitions, kept = prune(2, bounds, list(where))
        first = [p for p in partitions if p.hash_buckets == (0,)]
        return [i for i, p in enumerate(first) if p in kept]

    assert kept_days() == [0, 1, 2, 3, 4]
    assert kept_days(("a", ">=", day(3))) == [3, 4]
    assert kept_days(("a", ">", day(3))) == [4]
    assert kept_days(("a", "<", day(1))) == [0]
    assert kept_days(("a", "<=", day(1)), ("a", ">", day(0))) == [1]
    assert kept_days(("a", "=", day(2))) == [2]
    assert kept_days(("a", "in", [day(0), day(4)])) == [0, 1, 2, 3, 4]  # the hull of the values
    assert kept_days(("a", "<", day(0))) == []
    assert kept_days(("a", "=", day(1)), ("a", "=", day(3))) == []  # contradictory
    assert kept_days(("b", "=", "x")) == [0, 1, 2, 3, 4]  # the second column alone: no bound
    assert kept_days(("a", "!=", day(2))) == [0, 1, 2, 3, 4]


def test_the_second_range_column_prunes_once_the_first_is_fixed() -> None:
    types = ["int8", "int32"]
    # Ranges (a, b): [(1, 0), (1, 10)), [(1, 10), (1, 20)), [(1, 20), (2, 0)), [(2, 0), (2, 10)).
    cuts = [(1, 0), (1, 10), (1, 20), (2, 0), (2, 10)]
    bounds = list(itertools.pairwise(encode_key(types, c) for c in cuts))

    def kept(*where: tuple[Any, ...]) -> list[int]:
        _, partitions, kept = prune(0, bounds, list(where))
        first = [p for p in partitions if p.hash_buckets == (0,)]
        return [i for i, p in enumerate(first) if p in kept]

    assert kept(("a", "=", 1), ("b", ">=", 10)) == [1, 2]
    assert kept(("a", "=", 1), ("b", "<", 10)) == [0]
    assert kept(("a", "=", 1), ("b", "=", 25)) == [2]
    assert kept(("a", "=", 2), ("b", "in", [1, 5])) == [3]
    assert kept(("a", "in", [1]), ("b", "<", 10)) == [0]  # one value fixes it too
    assert kept(("a", ">=", 1), ("b", "<", 10)) == [0, 1, 2, 3]  # not fixed: b says nothing
    assert kept(("a", "in", [1, 2]), ("b", "<", 10)) == [0, 1, 2, 3]


def test_every_single_predicate_against_one_partition_per_domain_key() -> None:
    """Exhaustive over the domains: partitions cut at every domain key (so each holds one
    domain row; the last holds the largest and is unbounded), every single predicate of every
    operator and value on the first column, and on the second with the first fixed."""
    for layout, (text, range_columns) in enumerate(LAYOUTS):
        types = [c.split(":")[1] for c in text.split(", ")][: len(range_columns)]
        rows = sorted(
            itertools.product(*(DOMAINS[t] for t in types)), key=lambda r: encode_key(types, r)
        )
        keys = [encode_key(types, r) for r in rows]
        bounds = list(itertools.pairwise([*sorted({b"", *keys}), b""]))
        values = DOMAINS[types[0]] + ([] if types[0] == "date" else ODD_VALUES)
        predicates = [(op, v) for op in COMPARE for v in values]
        predicates += [("in", list(pair)) for pair in itertools.combinations(values[:6], 2)]
        wheres = [[(range_columns[0], op, v)] for op, v in predicates]
        if len(types) == 2:  # the first column fixed, every single predicate on the second
            second = DOMAINS[types[1]] + ([] if types[1] == "date" else ODD_VALUES)
            wheres += [
                [(range_columns[0], "=", fixed), (range_columns[1], op, v)]
                for fixed in DOMAINS[types[0]][::2]
                for op in COMPARE
                for v in second
            ]
        for where in wheres:
            pruned = prune(layout, bounds, where)
            if pruned is None:
                continue
            _, partitions, kept = pruned
            for partition in partitions:
                low, high = partition.range_bounds()
                holds = [
                    r
                    for r, k in zip(rows, keys, strict=True)
                    if low <= k and (not high or k < high)
                ]
                if any(
                    all(matches(r[i], op, v) for i, (_, op, v) in enumerate(where)) for r in holds
                ):
                    assert partition in kept, (text, where, holds)
