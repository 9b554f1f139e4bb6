"""Checks of a set (unique-insert) workload: lost, duplicated, phantom and stale rows.

The history holds ``add`` operations (input: the element) and ``read`` operations (output:
the list of elements the scan returned, duplicates included). A final read after the cluster
healed must hold every acknowledged add (else *lost*), no element twice (*duplicated*), and
nothing that was never attempted or that was definitely refused (*phantom*). Every read, not
only the final one, must hold each add acknowledged before the read began (else *stale*: a
read that is not linearizable) and nothing invoked only after the read finished.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from nyala.chaos.history import EventType, Operation


@dataclass
class SetResult:
    """What the set checks found; ``valid`` iff no anomaly."""

    acknowledged: int = 0
    indeterminate: int = 0
    recovered: int = 0  # indeterminate adds that the final read shows took effect
    lost: list[Hashable] = field(default_factory=list)
    duplicated: list[Hashable] = field(default_factory=list)
    phantom: list[Hashable] = field(default_factory=list)
    stale_reads: int = 0
    future_reads: int = 0
    reads: int = 0

    @property
    def anomalies(self) -> int:
        """Number of anomalous elements and reads."""
        return (
            len(self.lost)
            + len(self.duplicated)
            + len(self.phantom)
            + self.stale_reads
            + self.future_reads
        )

    @property
    def valid(self) -> bool:
        return self.anomalies == 0


def check_set(ops: Iterable[Operation], final_read: Iterable[Hashable]) -> SetResult:
    """Judges ``ops`` (adds and reads) and ``final_read`` (every element, as scanned)."""
    ops = list(ops)
    adds = [op for op in ops if op.f == "add"]
    result = SetResult()
    ok_adds = {op.input for op in adds if op.status is EventType.OK}
    maybe_adds = {op.input for op in adds if op.status is EventType.INFO}
    result.acknowledged = len(ok_adds)
    result.indeterminate = len(maybe_adds)
    final = Counter(final_read)
    result.duplicated = sorted((e for e, n in final.items() if n > 1), key=repr)
    result.lost = sorted(ok_adds - final.keys(), key=repr)
    result.phantom = sorted(final.keys() - ok_adds - maybe_adds, key=repr)
    result.recovered = len(maybe_adds & final.keys())
    _check_reads(ops, adds, result)
    return result


def _check_reads(ops: list[Operation], adds: list[Operation], result: SetResult) -> None:
    """Each ok read holds every add acknowledged before it began and none invoked after it
    ended, and no element twice. Linear in the size of each read (runs hold thousands of
    reads of thousands of elements)."""
    acked = sorted(
        (op.complete_ns, op.input)
        for op in adds
        if op.status is EventType.OK and op.complete_ns is not None
    )
    acked_times = [done for done, _ in acked]
    invoked = {op.input: op.invoke_ns for op in adds}
    for read in ops:
        if read.f != "read" or read.status is not EventType.OK:
            continue
        result.reads += 1
        assert read.complete_ns is not None
        seen = set(read.output)
        if len(seen) != len(read.output):
            counted = Counter(read.output)
            result.duplicated.extend(sorted((e for e, n in counted.items() if n > 1), key=repr))
        required = bisect.bisect_left(acked_times, read.invoke_ns)
        if any(e not in seen for _, e in acked[:required]):
            result.stale_reads += 1
        never = read.complete_ns + 1
        if any(invoked.get(e, never) > read.complete_ns for e in seen):
            result.future_reads += 1
