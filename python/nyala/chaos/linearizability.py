"""A Wing–Gong linearizability checker with memoization (Lowe's WGL), per key, for registers.

The search walks the history's call/return entries in time order. At a call it tries to
linearize that operation now (the model must accept it); at a return whose operation is not
linearized yet it backtracks. A cache of (set of linearized operations, model state) cuts
every branch that reaches a configuration already explored, which is what makes the search
practical (Lowe, "Testing for linearizability", 2017; the same algorithm as Knossos/Porcupine).

Indeterminate operations have no return entry: they may be linearized anywhere after their
call, or never. Definitely failed operations are dropped. Indeterminate reads are dropped too
(they constrain nothing and change nothing).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nyala.chaos.history import EventType, Operation

# Searches that explore more configurations than this give up with ``valid=None``.
DEFAULT_STATES_MAX = 2_000_000


def register_step(state: Any, op: Operation) -> tuple[bool, Any]:
    """The register model: may ``op`` happen in ``state``, and what state follows.

    ``write v`` sets v; ``read`` must return the current value (None = never written);
    ``cas (old, new)`` sets new when the value is old, and its ok output says whether it did
    (an indeterminate cas is tried as if it succeeded; not linearizing it covers the rest).
    """
    if op.f == "write":
        return True, op.input
    if op.f == "read":
        return op.output == state, state
    if op.f == "cas":
        old, new = op.input
        if op.status is EventType.INFO or op.output is True:
            return (True, new) if state == old else (False, state)
        return state != old, state
    raise ValueError(f"unknown register operation {op.f!r}")


@dataclass
class KeyResult:
    """The verdict on one key: ``valid`` None means the search gave up (too many states)."""

    key: Hashable
    valid: bool | None
    ops: int
    states: int
    # When invalid: the operation whose return could not be reached by any linearization of
    # the longest prefix found, and that prefix's length.
    culprit: Operation | None = None
    longest_prefix: int = 0


@dataclass
class LinearizabilityResult:
    """The verdict on a whole history (one ``KeyResult`` per key)."""

    keys: list[KeyResult] = field(default_factory=list)

    @property
    def valid(self) -> bool | None:
        """False if any key is invalid; None if none is but some search gave up."""
        if any(k.valid is False for k in self.keys):
            return False
        if any(k.valid is None for k in self.keys):
            return None
        return True

    @property
    def anomalies(self) -> list[KeyResult]:
        """The keys that are not linearizable."""
        return [k for k in self.keys if k.valid is False]


def relevant(ops: Iterable[Operation]) -> list[Operation]:
    """The operations that matter for the search: no failures, no indeterminate reads, and,
    on a key without compare-and-set, no indeterminate write whose value nothing read.
    Dropping such a write changes no verdict: a linearization that includes it has no read of
    its value before the next write, so leaving it out keeps every other operation legal, and
    leaving it out is always allowed for an indeterminate operation. A failed compare-and-set
    observes that *some* write happened without naming its value, hence the exception. It
    matters for speed: every kept indeterminate write doubles the configurations to visit."""
    ops = [op for op in ops if op.status is not EventType.FAIL]
    if any(op.f == "cas" for op in ops):
        return [op for op in ops if not (op.status is EventType.INFO and op.f == "read")]
    observed = {op.output for op in ops if op.f == "read" and op.status is EventType.OK}
    return [
        op
        for op in ops
        if op.status is not EventType.INFO or (op.f == "write" and op.input in observed)
    ]


def check_key(
    key: Hashable,
    ops: Sequence[Operation],
    *,
    initial: Any = None,
    states_max: int = DEFAULT_STATES_MAX,
) -> KeyResult:
    """Is the history of one register linearizable? ``ops`` may include failed ones."""
    ops = relevant(ops)
    n = len(ops)
    # Entries: (time, 0 for call / 1 for return, op index). Calls sort before returns at
    # equal times, which treats touching operations as concurrent (never a false alarm).
    entries = [(op.invoke_ns, 0, i) for i, op in enumerate(ops)]
    entries += [(op.complete_ns, 1, i) for i, op in enumerate(ops) if op.complete_ns is not None]
    entries.sort()
    size = len(entries)
    # A doubly linked list over entry positions; position ``size`` is the head sentinel and
    # doubles as the end marker.
    end = size
    nxt = [pos + 1 for pos in range(size)] + [0]
    prv = [pos - 1 for pos in range(size)] + [size - 1]
    prv[0] = end
    is_call = [kind == 0 for _, kind, _ in entries]
    op_of = [i for _, _, i in entries]
    return_pos = [-1] * n
    for pos, (_, kind, i) in enumerate(entries):
        if kind == 1:
            return_pos[i] = pos
    remaining = sum(1 for p in return_pos if p >= 0)

    def unlink(pos: int) -> None:
        nxt[prv[pos]] = nxt[pos]
        prv[nxt[pos]] = prv[pos]

    def relink(pos: int) -> None:
        nxt[prv[pos]] = pos
        prv[nxt[pos]] = pos

    state = initial
    linearized = 0
    cache: set[tuple[int, Any]] = set()
    stack: list[tuple[int, Any]] = []
    longest = 0
    culprit: Operation | None = None
    entry = nxt[end]
    while remaining > 0:
        if entry == end or not is_call[entry]:
            # A return (or the end) reached with its op not linearized: undo the last choice.
            if entry != end and len(stack) >= longest:
                longest, culprit = len(stack), ops[op_of[entry]]
            if not stack:
                return KeyResult(key, False, n, len(cache), culprit, longest)
            entry, state = stack.pop()
            i = op_of[entry]
            linearized &= ~(1 << i)
            if return_pos[i] >= 0:
                relink(return_pos[i])
                remaining += 1
            relink(entry)
            entry = nxt[entry]
            continue
        i = op_of[entry]
        accepted, new_state = register_step(state, ops[i])
        if accepted:
            new_linearized = linearized | (1 << i)
            marker = (new_linearized, new_state)
            if marker not in cache:
                if len(cache) >= states_max:
                    return KeyResult(key, None, n, len(cache))
                cache.add(marker)
                stack.append((entry, state))
                state, linearized = new_state, new_linearized
                unlink(entry)
                if return_pos[i] >= 0:
                    unlink(return_pos[i])
                    remaining -= 1
                entry = nxt[end]
                continue
        entry = nxt[entry]
    return KeyResult(key, True, n, len(cache))


def check_registers(
    ops: Iterable[Operation], *, initial: Any = None, states_max: int = DEFAULT_STATES_MAX
) -> LinearizabilityResult:
    """Checks every key's register history independently (linearizability is local)."""
    by_key: dict[Hashable, list[Operation]] = defaultdict(list)
    for op in ops:
        by_key[op.key].append(op)
    result = LinearizabilityResult()
    for key in sorted(by_key, key=repr):
        result.keys.append(check_key(key, by_key[key], initial=initial, states_max=states_max))
    return result
