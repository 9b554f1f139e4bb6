"""The chaos set workload's snapshot-read check (issue 34): each snapshot read must hold
exactly the acknowledged adds stamped at or before its timestamp."""

from __future__ import annotations

from nyala.chaos.workloads import WorkloadStats, check_snapshot_reads


def test_exact_snapshots_pass_and_early_or_missing_adds_are_anomalies() -> None:
    stats = WorkloadStats()
    stats.add_stamps = {1: 10, 2: 20, 3: 30}
    stats.snapshot_reads = [
        (20, frozenset({1, 2})),  # exact
        (25, frozenset({1, 2, 99})),  # 99: an add with an unknown outcome may be in
        (30, frozenset({1, 2, 3})),
    ]
    assert check_snapshot_reads(stats) == []
    stats.snapshot_reads = [(20, frozenset({1})), (10, frozenset({1, 3}))]
    assert check_snapshot_reads(stats) == [
        "snapshot 20: lacks 1 adds at or before it",
        "snapshot 10: holds 1 adds stamped after it",
    ]
