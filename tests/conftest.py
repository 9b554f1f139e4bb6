"""Settings for every test process.

Test clusters take their ports from a range below the OS's ephemeral range (nyala.rpc.ports):
a server a test kills and restarts on its old port cannot then find it taken by an outgoing
connection's local port. Under pytest-xdist (``make test`` runs two workers) each worker gets its
own part of the range, so no worker picks a port another worker's stopped server will take back.
"""

from __future__ import annotations

import os

import pytest

from nyala.rpc.ports import PORT_RANGE_ENV

#: Below Linux's default ephemeral range (32768-60999) and above the usual fixed service ports.
TEST_PORTS = (20000, 32768)


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(PORT_RANGE_ENV):
        return  # chosen by whoever runs the tests (then shared by every worker)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None and getattr(config.option, "numprocesses", None):
        return  # the xdist controller: runs no test, and its workers must not inherit a range
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(worker.removeprefix("gw")) if worker is not None else 0
    lo, hi = TEST_PORTS
    share = (hi - lo) // workers
    os.environ[PORT_RANGE_ENV] = f"{lo + index * share}-{lo + (index + 1) * share}"
