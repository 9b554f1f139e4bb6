"""The tablet server's memory limit: which MemRowSets to flush under memory pressure, and
when writes are refused."""

from __future__ import annotations

import pytest

from nyala.common.process import (
    MEMORY_LIMIT_FRACTION_DEFAULT,
    machine_memory_bytes,
    trim_heap,
)
from nyala.errors import ServiceUnavailableError
from nyala.tserver.memory import (
    MemoryTracker,
    MemoryUsage,
    ReplicaBytes,
    ReplicaMemory,
)
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


def test_the_default_limit_is_a_fraction_of_the_machine() -> None:
    machine = machine_memory_bytes()
    assert machine > 0
    assert MemoryTracker(0).limit_bytes == int(machine * MEMORY_LIMIT_FRACTION_DEFAULT)
    tracker = MemoryTracker(1000, pressure_percentage=60, soft_percentage=80)
    assert (tracker.limit_bytes, tracker.pressure_bytes, tracker.soft_limit_bytes) == (
        1000,
        600,
        800,
    )


def test_writes_are_refused_above_the_soft_limit_until_a_measurement_says_otherwise() -> None:
    tracker = MemoryTracker(1000, pressure_percentage=60, soft_percentage=80)
    tracker.update(MemoryUsage(memrowsets_bytes=500, log_caches_bytes=100, scanners_bytes=0))
    tracker.admit_write(150)  # 750: admitted, and counted until the next measurement
    tracker.admit_write(100)  # 750 < 800 before it: admitted
    with pytest.raises(ServiceUnavailableError, match="soft limit"):
        tracker.admit_write(1)  # 850
    assert tracker.writes_refused == 1
    assert tracker.estimated_bytes == 850
    tracker.update(MemoryUsage(memrowsets_bytes=100))  # a flush freed memory
    tracker.admit_write(1)
    # The MemRowSets may use the pressure threshold less the other consumers.
    tracker.update(MemoryUsage(memrowsets_bytes=0, log_caches_bytes=200, scanners_bytes=100))
    assert tracker.memrowsets_budget_bytes() == 300
    tracker.update(MemoryUsage(log_caches_bytes=900))
    assert tracker.memrowsets_budget_bytes() == 0


def test_the_untracked_rest_of_the_process_counts_against_the_limit() -> None:
    tracker = MemoryTracker(1000, pressure_percentage=60, soft_percentage=80)
    usage = MemoryUsage(memrowsets_bytes=200, log_caches_bytes=50).with_resident(650)
    assert (usage.tracked_bytes, usage.untracked_bytes, usage.total_bytes) == (250, 400, 650)
    tracker.update(usage)
    assert tracker.over_pressure
    # The MemRowSets get what the log caches and the untracked rest leave of 600.
    assert tracker.memrowsets_budget_bytes() == 150
    tracker.admit_write(150)  # 800: the soft limit reached
    with pytest.raises(ServiceUnavailableError, match="soft limit"):
        tracker.admit_write(1)
    # Over the soft limit with nothing to flush, a write is admitted (a refusal could not
    # make room); the one after it waits for a measurement.
    tracker.update(MemoryUsage().with_resident(900))
    tracker.admit_write(10)
    with pytest.raises(ServiceUnavailableError, match="soft limit"):
        tracker.admit_write(10)
    # Tracked bytes that are not resident do not make the untracked part negative.
    assert MemoryUsage(memrowsets_bytes=700).with_resident(500).untracked_bytes == 0


def test_trimming_the_heap_works_on_this_platform() -> None:
    assert trim_heap()


class _Replicas:
    """What the replicas hold (set by the test) and which of them were measured."""

    def __init__(self, held: dict[str, ReplicaBytes]) -> None:
        self.held = held
        self.measured: list[str] = []

    def ids(self) -> list[str]:
        return sorted(self.held)

    def measure(self, tablet_id: str) -> ReplicaBytes | None:
        self.measured.append(tablet_id)
        return self.held.get(tablet_id)

    def refresh(self, memory: ReplicaMemory, *, full: bool = False) -> list[str]:
        self.measured = []
        memory.refresh(self.ids, self.measure, full=full)
        return sorted(self.measured)


def test_only_replicas_that_can_have_changed_are_measured_and_the_totals_stay_exact() -> None:
    replicas = _Replicas({t: (100, 0, 10) for t in "abcd"})
    memory = ReplicaMemory()
    assert replicas.refresh(memory, full=True) == ["a", "b", "c", "d"]
    assert (memory.active_bytes, memory.flushing_bytes, memory.cache_bytes) == (400, 0, 40)
    assert replicas.refresh(memory) == []  # all quiesced: nothing to measure
    memory.liveness_changed("b", awake=True)  # a write wakes it
    replicas.held["b"] = (500, 0, 60)
    assert replicas.refresh(memory) == ["b"]
    replicas.held["b"] = (700, 0, 80)
    assert replicas.refresh(memory) == ["b"]  # measured while awake
    assert (memory.active_bytes, memory.cache_bytes) == (1000, 110)
    memory.liveness_changed("b", awake=False)  # quiesced: measured once more, then not
    assert replicas.refresh(memory) == ["b"]
    assert replicas.refresh(memory) == []
    replicas.held["c"] = (0, 100, 10)  # a flush of c runs (its MemRowSet frozen)
    memory.flushed("c")
    assert replicas.refresh(memory) == ["c"]
    replicas.held["c"] = (0, 0, 10)
    assert replicas.refresh(memory) == ["c"]  # measured until the flush ended
    assert replicas.refresh(memory) == []
    assert (memory.active_bytes, memory.flushing_bytes) == (900, 0)
    del replicas.held["d"]  # deleted
    memory.liveness_changed("d", awake=False)
    replicas.refresh(memory)
    assert memory.active_bytes == 800
    assert memory.active_by_tablet() == {"a": 100, "b": 700, "c": 0}
    replicas.held["a"] = (300, 0, 10)  # changed unnoticed: the next full refresh sees it
    assert replicas.refresh(memory) == []
    replicas.refresh(memory, full=True)
    assert (memory.active_bytes, memory.cache_bytes) == (1000, 100)


def test_the_key_block_cache_gets_at_most_a_quarter_of_the_pressure_threshold() -> None:
    mib = 1 << 20
    # 1 GiB limit: pressure at 60 % (614 MiB), so the cache may hold 153 MiB, not 256.
    small = MemoryTracker(1024 * mib, pressure_percentage=60)
    assert small.key_block_cache_bytes(256 * mib) == small.pressure_bytes // 4
    assert small.key_block_cache_bytes(256 * mib) < 154 * mib
    assert small.key_block_cache_bytes(64 * mib) == 64 * mib  # a smaller setting stands
    # 8 GiB: the setting fits.
    assert MemoryTracker(8192 * mib).key_block_cache_bytes(256 * mib) == 256 * mib
