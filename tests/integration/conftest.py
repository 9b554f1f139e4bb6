"""Fixtures for tests with real server processes."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

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


@pytest.fixture
def make_cluster(request: pytest.FixtureRequest) -> Iterator[Callable[..., MiniCluster]]:
    """``make_cluster(*args, **kwargs)`` starts a ``MiniCluster(*args, **kwargs)`` that is shut
    down after the test, its logs printed if the test failed."""
    clusters: list[MiniCluster] = []

    def make(*args: Any, **kwargs: Any) -> MiniCluster:
        mini = MiniCluster(*args, **kwargs)
        clusters.append(mini)
        return mini.__enter__()

    yield make
    report = getattr(request.node, "rep_call", None)
    for mini in clusters:
        if report is not None and report.failed:
            dump_logs(mini, sys.stderr)
        mini.shutdown()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report = yield
    setattr(item, f"rep_{report.when}", report)  # type: ignore[attr-defined]
    return report
