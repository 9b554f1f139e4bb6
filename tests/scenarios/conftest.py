"""``--rewrite`` regenerates the golden output of the scenario files."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--rewrite",
        action="store_true",
        default=False,
        help="rewrite tests/scenarios/*.txt with the actual output",
    )
