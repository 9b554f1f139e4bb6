"""Chaos runs on real processes: workloads under faults, checked for anomalies.

``test_smoke`` is in the default suite (a short run with the cheap nemeses); the others are
opt-in: ``pytest -m chaos``, with ``NYALA_CHAOS_DURATION`` (seconds per run, default 120)
and ``NYALA_CHAOS_SEED`` (default: one per test) in the environment.
"""

from __future__ import annotations

import os

import pytest

from nyala.chaos.client_run import run_client
from nyala.chaos.nemesis import ALL_KINDS
from nyala.chaos.runner import RunConfig, run

SMOKE_KINDS = ("kill-one", "pause", "partition", "step-down", "disk", "torn-tail")


def _run_and_check(config: RunConfig) -> None:
    summary = run(config)
    print(summary.line())
    assert summary.anomalies == []
    assert summary.ops["ok"] > 0, "no operation succeeded: the run proves nothing"
    assert sum(summary.faults.values()) > 0, "no fault was injected"


def test_smoke() -> None:
    _run_and_check(RunConfig(duration_s=25.0, seed=1, kinds=SMOKE_KINDS, hold_s=(1.0, 3.0)))


def _seed(default: int) -> int:
    return int(os.environ.get("NYALA_CHAOS_SEED", default))


@pytest.mark.chaos
@pytest.mark.parametrize(
    ("kind_set", "default_seed"),
    [
        (("kill-one", "kill-minority", "kill-all"), 11),
        (("pause", "partition", "delay"), 12),
        (("step-down", "membership"), 13),
        (("disk", "torn-tail", "corrupt-meta"), 14),
        (ALL_KINDS, 15),
    ],
    ids=["crash", "network", "consensus", "disk", "all"],
)
def test_chaos(kind_set: tuple[str, ...], default_seed: int) -> None:
    duration = float(os.environ.get("NYALA_CHAOS_DURATION", "120"))
    _run_and_check(RunConfig(duration_s=duration, seed=_seed(default_seed), kinds=kind_set))


@pytest.mark.chaos
def test_chaos_client_and_ddl_under_master_faults() -> None:
    duration = float(os.environ.get("NYALA_CHAOS_DURATION", "120"))
    summary = run_client(duration, _seed(16))
    print(summary.line())
    assert summary.anomalies == []
    assert summary.ops["ok"] > 0
