"""Replays every ``tests/scenarios/*.txt`` and compares it with its golden output."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
from harness import run_scenario

SCENARIO_DIR = Path(__file__).parent
SCENARIOS = sorted(SCENARIO_DIR.glob("*.txt"))


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    text = path.read_text()
    actual = run_scenario(text, tmp_path)
    if request.config.getoption("--rewrite", default=False):
        path.write_text(actual)
        return
    if actual != text:
        diff = difflib.unified_diff(
            text.splitlines(), actual.splitlines(), "expected", "actual", lineterm=""
        )
        pytest.fail(f"{path.name} differs (pytest tests/scenarios --rewrite):\n" + "\n".join(diff))


def test_there_are_enough_scenarios() -> None:
    assert len(SCENARIOS) >= 25
