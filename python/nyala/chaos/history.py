"""The history of a chaos run: what each client process invoked and what it was told.

An operation is two events: ``invoke`` when the client sends it and one completion: ``ok``
(it happened, with its output), ``fail`` (it certainly did not happen) or ``info`` (unknown:
a timeout or a broken connection; it may take effect at any later time, so it stays
concurrent with everything after its invocation). Times come from one monotonic clock in the
recording process, which is all real-time order needs.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any


class EventType(enum.Enum):
    """The kind of a history event."""

    INVOKE = "invoke"
    OK = "ok"
    FAIL = "fail"
    INFO = "info"


@dataclass(frozen=True)
class Event:
    """One line of a history. ``value`` is the input on ``invoke`` and the output on ``ok``."""

    type: EventType
    process: int
    time_ns: int
    f: str
    key: Hashable
    value: Any


@dataclass(frozen=True)
class Operation:
    """An invoke paired with its completion (``complete_ns`` None: indeterminate, open-ended)."""

    process: int
    f: str
    key: Hashable
    input: Any
    output: Any
    status: EventType  # OK, FAIL or INFO; never INVOKE
    invoke_ns: int
    complete_ns: int | None


class History:
    """A thread-safe, append-only list of events."""

    def __init__(self, clock_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self._clock_ns = clock_ns
        self._lock = threading.Lock()
        self._events: list[Event] = []
        # process -> index of its open invoke; a process has at most one op in flight.
        self._open: dict[int, int] = {}

    def invoke(self, process: int, f: str, key: Hashable, value: Any = None) -> None:
        """Records that ``process`` sends ``f`` on ``key`` with input ``value``."""
        with self._lock:
            if process in self._open:
                raise ValueError(f"process {process} already has an operation in flight")
            self._open[process] = len(self._events)
            self._events.append(Event(EventType.INVOKE, process, self._clock_ns(), f, key, value))

    def complete(self, process: int, status: EventType, value: Any = None) -> None:
        """Records the completion of ``process``'s open operation."""
        if status is EventType.INVOKE:
            raise ValueError("a completion cannot be an invoke")
        with self._lock:
            index = self._open.pop(process, None)
            if index is None:
                raise ValueError(f"process {process} has no operation in flight")
            invoked = self._events[index]
            self._events.append(
                Event(status, process, self._clock_ns(), invoked.f, invoked.key, value)
            )

    def ok(self, process: int, value: Any = None) -> None:
        """The open operation of ``process`` happened, with output ``value``."""
        self.complete(process, EventType.OK, value)

    def fail(self, process: int) -> None:
        """The open operation of ``process`` certainly did not happen."""
        self.complete(process, EventType.FAIL)

    def info(self, process: int) -> None:
        """The outcome of the open operation of ``process`` is unknown."""
        self.complete(process, EventType.INFO)

    def events(self) -> list[Event]:
        """A copy of the events so far, in recording order."""
        with self._lock:
            return list(self._events)

    def operations(self) -> list[Operation]:
        """Every operation; still-open ones count as indeterminate."""
        return pair_events(self.events())


def pair_events(events: Iterable[Event]) -> list[Operation]:
    """Pairs invokes with completions, in invocation order. An invoke never completed is an
    indeterminate operation (the client died or the run ended with it in flight)."""
    open_ops: dict[int, Event] = {}
    ops: list[tuple[int, Operation]] = []
    order: dict[int, int] = {}
    for seq, event in enumerate(events):
        if event.type is EventType.INVOKE:
            if event.process in open_ops:
                raise ValueError(f"process {event.process} invoked twice without completing")
            open_ops[event.process] = event
            order[event.process] = seq
            continue
        invoked = open_ops.pop(event.process, None)
        if invoked is None:
            raise ValueError(f"completion without invoke for process {event.process}")
        ops.append((order[event.process], _operation(invoked, event)))
    for process, invoked in open_ops.items():
        ops.append((order[process], _operation(invoked, None)))
    ops.sort(key=lambda pair: pair[0])
    return [op for _, op in ops]


def _operation(invoked: Event, completed: Event | None) -> Operation:
    if completed is None or completed.type is EventType.INFO:
        return Operation(
            invoked.process, invoked.f, invoked.key, invoked.value, None, EventType.INFO,
            invoked.time_ns, None,
        )  # fmt: skip
    return Operation(
        invoked.process, invoked.f, invoked.key, invoked.value, completed.value, completed.type,
        invoked.time_ns, completed.time_ns,
    )  # fmt: skip


def counts(ops: Iterable[Operation]) -> dict[str, int]:
    """How many operations ended ok / fail / info."""
    result = {"ok": 0, "fail": 0, "info": 0}
    for op in ops:
        result[op.status.value] += 1
    return result
