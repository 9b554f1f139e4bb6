"""Fixtures for tests with real server processes."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from nyala.testing import MiniCluster, dump_logs


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> Iterator[MiniCluster]:
    """Three tablet servers, ready; their logs are printed if the test fails."""
    with MiniCluster(3) as mini:
        yield mini
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            dump_logs(mini, sys.stderr)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report = yield
    setattr(item, f"rep_{report.when}", report)  # type: ignore[attr-defined]
    return report
