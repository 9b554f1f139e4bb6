"""The randomized Raft simulation: a short run per seed by default, long runs under ``-m sim``."""

from __future__ import annotations

import pytest
from raft_sim import Simulation

DEFAULT_SEEDS = range(6)
DEFAULT_STEPS = 10_000


@pytest.mark.parametrize("seed", DEFAULT_SEEDS)
def test_three_voters(seed: int) -> None:
    Simulation(seed, voters=3).run(DEFAULT_STEPS)


@pytest.mark.parametrize("seed", DEFAULT_SEEDS)
def test_five_voters(seed: int) -> None:
    Simulation(1000 + seed, voters=5).run(DEFAULT_STEPS)


@pytest.mark.parametrize("seed", DEFAULT_SEEDS)
def test_membership_changes(seed: int) -> None:
    Simulation(2000 + seed, voters=3, config_changes=True).run(DEFAULT_STEPS)


@pytest.mark.parametrize("seed", DEFAULT_SEEDS)
def test_quiescing_voters(seed: int) -> None:
    sim = Simulation(3000 + seed, voters=3 + 2 * (seed % 2), quiesce=True)
    sim.run(DEFAULT_STEPS)
    assert sim.quiesced_seen > 0, "no replica ever quiesced: the runs test nothing new"


@pytest.mark.parametrize("seed", DEFAULT_SEEDS)
def test_quiescing_membership_changes(seed: int) -> None:
    Simulation(4000 + seed, voters=3, config_changes=True, quiesce=True).run(DEFAULT_STEPS)


@pytest.mark.parametrize("seed", DEFAULT_SEEDS)
def test_delayed_commit_notices(seed: int) -> None:
    # The tablet server's setting: followers learn a commit index from the next batch, or
    # from a notice once the delay has passed.
    Simulation(
        5000 + seed,
        voters=3 + 2 * (seed % 2),
        config_changes=seed % 2 == 0,
        quiesce=seed % 3 == 0,
        commit_notice_delay_ms=30,
    ).run(DEFAULT_STEPS)


@pytest.mark.sim
@pytest.mark.parametrize("seed", range(100, 140))
def test_long_runs(seed: int) -> None:
    Simulation(seed, voters=3 + 2 * (seed % 2), config_changes=seed % 3 == 0).run(30_000)


@pytest.mark.sim
@pytest.mark.parametrize("seed", range(500, 530))
def test_long_membership_runs(seed: int) -> None:
    Simulation(seed, voters=3 + 2 * (seed % 2), config_changes=True).run(20_000)


@pytest.mark.sim
@pytest.mark.parametrize("seed", range(600, 630))
def test_long_quiescing_runs(seed: int) -> None:
    Simulation(seed, voters=3 + 2 * (seed % 2), config_changes=seed % 2 == 0, quiesce=True).run(
        20_000
    )


@pytest.mark.sim
@pytest.mark.parametrize("seed", range(700, 730))
def test_long_delayed_commit_notice_runs(seed: int) -> None:
    Simulation(
        seed,
        voters=3 + 2 * (seed % 2),
        config_changes=seed % 2 == 0,
        quiesce=seed % 3 == 0,
        commit_notice_delay_ms=5 + seed % 60,
    ).run(20_000)
