"""The WGL checker on known-good and known-bad register histories, and against brute force."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nyala.chaos.history import EventType, History, Operation, pair_events
from nyala.chaos.linearizability import check_key, check_registers, register_step

OK, FAIL, INFO = EventType.OK, EventType.FAIL, EventType.INFO


def op(
    f: str, inp: Any, out: Any, start: int, end: int | None, status: EventType = OK, p: int = 0
) -> Operation:
    return Operation(p, f, "k", inp, out, status, start, end)


def w(v: int, start: int, end: int | None, status: EventType = OK) -> Operation:
    return op("write", v, None, start, end, status)


def r(v: int | None, start: int, end: int | None, status: EventType = OK) -> Operation:
    return op("read", None, v, start, end, status)


def valid(*ops: Operation) -> bool | None:
    return check_key("k", ops).valid


def test_empty_history_is_linearizable() -> None:
    assert valid() is True


def test_sequential_write_then_read() -> None:
    assert valid(w(1, 0, 1), r(1, 2, 3)) is True


def test_stale_read_after_completed_write_is_not_linearizable() -> None:
    assert valid(w(1, 0, 1), w(2, 2, 3), r(1, 4, 5)) is False


def test_read_of_never_written_value_is_not_linearizable() -> None:
    assert valid(w(1, 0, 1), r(7, 2, 3)) is False


def test_read_of_initial_value_before_any_write() -> None:
    assert valid(r(None, 0, 1), w(1, 2, 3), r(1, 4, 5)) is True
    assert valid(w(1, 0, 1), r(None, 2, 3)) is False


def test_concurrent_write_and_reads_may_see_either_order() -> None:
    # A write overlapping two reads: old-then-new is fine ...
    assert valid(w(1, 0, 1), w(2, 2, 10), r(1, 3, 4), r(2, 5, 6)) is True
    # ... but once a read saw the new value, a later read may not see the old one.
    assert valid(w(1, 0, 1), w(2, 2, 10), r(2, 3, 4), r(1, 5, 6)) is False


def test_concurrent_reads_may_disagree_while_write_in_flight() -> None:
    # Two reads overlapping each other and a write: one sees old, one new, any order.
    assert valid(w(1, 0, 1), w(2, 2, 10), r(2, 3, 6), r(1, 4, 7)) is True


def test_indeterminate_write_that_took_effect() -> None:
    assert valid(w(1, 0, 1), w(2, 2, None, INFO), r(2, 20, 21)) is True


def test_indeterminate_write_that_did_not_take_effect() -> None:
    assert valid(w(1, 0, 1), w(2, 2, None, INFO), r(1, 20, 21), r(1, 30, 31)) is True


def test_indeterminate_write_may_take_effect_late_but_only_once() -> None:
    # Seen, then unseen again: the value 2 cannot disappear without another write.
    assert valid(w(1, 0, 1), w(2, 2, None, INFO), r(2, 5, 6), r(1, 8, 9)) is False
    # It may take effect long after other operations completed.
    assert valid(w(1, 0, 1), w(2, 2, None, INFO), r(1, 5, 6), w(3, 7, 8), r(2, 9, 10)) is True


def test_failed_write_must_not_be_visible() -> None:
    assert valid(w(1, 0, 1), w(2, 2, 3, FAIL), r(2, 4, 5)) is False
    assert valid(w(1, 0, 1), w(2, 2, 3, FAIL), r(1, 4, 5)) is True


def test_indeterminate_reads_are_ignored() -> None:
    assert valid(w(1, 0, 1), r(99, 2, None, INFO)) is True


def test_lost_acknowledged_write() -> None:
    assert valid(w(1, 0, 1), w(2, 2, 3), r(1, 10, 11)) is False


def test_cas_semantics() -> None:
    def cas(
        old: int, new: int, out: bool | None, s: int, e: int | None, st: EventType = OK
    ) -> Operation:
        return op("cas", (old, new), out, s, e, st)

    assert valid(w(1, 0, 1), cas(1, 2, True, 2, 3), r(2, 4, 5)) is True
    assert valid(w(1, 0, 1), cas(3, 2, True, 2, 3)) is False
    assert valid(w(1, 0, 1), cas(1, 2, False, 2, 3)) is False
    assert valid(w(1, 0, 1), cas(3, 2, False, 2, 3), r(1, 4, 5)) is True
    assert valid(w(1, 0, 1), cas(1, 2, None, 2, None, INFO), r(2, 4, 5)) is True


def test_many_concurrent_writers_stays_tractable() -> None:
    # 10 overlapping writes then a read of one of them: the cache keeps this small.
    ops = [w(v, v, 100 + v) for v in range(10)]
    ops.append(r(7, 200, 201))
    result = check_key("k", ops)
    assert result.valid is True
    assert result.states < 20_000


def test_states_max_gives_up_with_unknown() -> None:
    ops = [w(v, v, 100 + v) for v in range(12)]
    ops.append(r(99, 200, 201))
    assert check_key("k", ops, states_max=50).valid is None


def test_check_registers_is_per_key_and_uses_recorded_history() -> None:
    clock = iter(range(1000))
    history = History(clock_ns=lambda: next(clock))
    history.invoke(0, "write", "a", 1)
    history.ok(0)
    history.invoke(1, "write", "b", 5)
    history.ok(1)
    history.invoke(0, "read", "a")
    history.ok(0, 1)
    history.invoke(1, "read", "b")
    history.ok(1, 1)  # b was never 1
    result = check_registers(history.operations())
    assert [k.key for k in result.anomalies] == ["b"]
    assert result.valid is False


def test_open_invocation_at_end_is_indeterminate() -> None:
    clock = iter(range(1000))
    history = History(clock_ns=lambda: next(clock))
    history.invoke(0, "write", "a", 1)
    ops = pair_events(history.events())
    assert ops[0].status is INFO
    assert ops[0].complete_ns is None


# --- brute force -----------------------------------------------------------------------


def brute_force(ops: list[Operation]) -> bool:
    """Tries every order of every subset that keeps the definite ops and real-time order."""
    ops = [o for o in ops if o.status is not FAIL and not (o.status is INFO and o.f == "read")]

    def search(done: frozenset[int], state: Any) -> bool:
        if all(i in done for i, o in enumerate(ops) if o.status is OK):
            return True
        for i, o in enumerate(ops):
            if i in done:
                continue
            # o may go next only if no pending definite op finished before o began.
            blocked = any(
                j not in done and p.complete_ns is not None and p.complete_ns < o.invoke_ns
                for j, p in enumerate(ops)
            )
            if blocked:
                continue
            accepted, new_state = register_step(state, o)
            if accepted and search(done | {i}, new_state):
                return True
        return False

    return search(frozenset(), None)


@st.composite
def histories(draw: st.DrawFn) -> list[Operation]:
    count = draw(st.integers(0, 6))
    ops = []
    for _ in range(count):
        start = draw(st.integers(0, 30))
        end = start + draw(st.integers(1, 12))
        status = draw(st.sampled_from([OK, OK, OK, FAIL, INFO]))
        f = draw(st.sampled_from(["read", "write", "write", "cas"]))
        value = draw(st.integers(1, 3))
        inp: Any
        out: Any
        if f == "write":
            inp, out = value, None
        elif f == "read":
            inp, out = None, draw(st.sampled_from([None, 1, 2, 3]))
        else:
            inp, out = (draw(st.sampled_from([None, 1, 2, 3])), value), draw(st.booleans())
        ops.append(op(f, inp, out, start, None if status is INFO else end, status))
    return ops


@settings(max_examples=200, deadline=None)
@given(histories())
def test_agrees_with_brute_force(ops: list[Operation]) -> None:
    assert check_key("k", ops).valid is brute_force(ops)


def test_failed_cas_observes_an_unread_indeterminate_write() -> None:
    # Found by the brute-force comparison: the cas saw "not None" although no read returned
    # the indeterminate write's value, so that write must not be dropped.
    failed_cas = op("cas", (None, 1), False, 0, 1)
    assert valid(failed_cas, w(1, 2, 3), w(1, 0, None, INFO)) is True


def test_many_unread_indeterminate_writes_stay_cheap() -> None:
    ops = [w(v, v, None, INFO) for v in range(100, 160)]
    ops += [w(1, 0, 1), r(1, 500, 501)]
    result = check_key("k", ops)
    assert result.valid is True
    assert result.ops == 2
