"""The set checker on histories with lost, duplicated, phantom and stale rows."""

from __future__ import annotations

from typing import Any

from nyala.chaos.history import EventType, Operation
from nyala.chaos.set_checker import check_set

OK, FAIL, INFO = EventType.OK, EventType.FAIL, EventType.INFO


def add(e: int, start: int, end: int | None, status: EventType = OK) -> Operation:
    return Operation(0, "add", None, e, None, status, start, end)


def read(out: list[Any], start: int, end: int) -> Operation:
    return Operation(1, "read", None, None, out, OK, start, end)


def test_every_acknowledged_add_present_is_valid() -> None:
    result = check_set([add(1, 0, 1), add(2, 2, 3)], [1, 2])
    assert result.valid
    assert result.acknowledged == 2


def test_lost_acknowledged_add() -> None:
    result = check_set([add(1, 0, 1), add(2, 2, 3)], [1])
    assert result.lost == [2]
    assert not result.valid


def test_indeterminate_adds_may_or_may_not_appear() -> None:
    ops = [add(1, 0, 1), add(2, 2, None, INFO), add(3, 4, None, INFO)]
    result = check_set(ops, [1, 3])
    assert result.valid
    assert result.recovered == 1
    assert result.indeterminate == 2


def test_failed_add_that_appears_is_phantom() -> None:
    result = check_set([add(1, 0, 1), add(2, 2, 3, FAIL)], [1, 2])
    assert result.phantom == [2]


def test_never_attempted_element_is_phantom() -> None:
    assert check_set([add(1, 0, 1)], [1, 42]).phantom == [42]


def test_duplicated_element() -> None:
    assert check_set([add(1, 0, 1)], [1, 1]).duplicated == [1]


def test_read_missing_add_acknowledged_before_it_is_stale() -> None:
    ops = [add(1, 0, 1), add(2, 2, 3), read([1], 4, 5)]
    result = check_set(ops, [1, 2])
    assert result.stale_reads == 1


def test_read_concurrent_with_add_may_miss_it() -> None:
    ops = [add(1, 0, 1), add(2, 2, 10), read([1], 4, 5), read([1, 2], 6, 7)]
    assert check_set(ops, [1, 2]).valid


def test_read_showing_add_invoked_after_it_is_anomalous() -> None:
    ops = [add(1, 0, 1), read([1, 2], 2, 3), add(2, 4, 5)]
    assert check_set(ops, [1, 2]).future_reads == 1
