"""The tablet server's choice of MemRowSets to flush under memory pressure."""

from __future__ import annotations

from nyala.tserver.server import memrowsets_to_flush


def test_nothing_is_flushed_while_the_memrowsets_fit() -> None:
    assert memrowsets_to_flush({"a": 400, "b": 600}, 1000) == []
    assert memrowsets_to_flush({}, 0) == []


def test_the_largest_are_flushed_first_until_the_rest_fit() -> None:
    sizes = {"a": 300, "b": 900, "c": 500, "d": 100}
    assert memrowsets_to_flush(sizes, 1000) == ["b"]
    assert memrowsets_to_flush(sizes, 500) == ["b", "c"]
    assert memrowsets_to_flush(sizes, 0) == ["b", "c", "a", "d"]


def test_empty_memrowsets_are_never_flushed_and_ties_go_by_tablet_id() -> None:
    assert memrowsets_to_flush({"x": 0, "y": 0}, 0) == []
    assert memrowsets_to_flush({"b": 700, "a": 700}, 1000) == ["a"]
