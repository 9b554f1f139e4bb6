"""``nyala cluster ksck`` against real processes: healthy (exit 0), then each broken case.

One master and three tservers; a tserver counts as not live after 2 s without a heartbeat,
and re-replication keeps its default (300 s) so that ksck sees each broken state as made.
Broken in turn: the master down, a tserver down, two tservers down (tablets without a
leader), and one replica whose committed config was rewritten offline (config disagreement).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from nyala.client import ksck as ksck_module
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster
from nyala.testing import master_ops as ops
from nyala.testing.mini_cluster import FAST_TSERVER_FLAGS, fast_master_flags, run_nyala

MASTER_FLAGS = fast_master_flags(
    "--tserver-unresponsive-timeout-ms",
    "2000",
)
TSERVER_FLAGS = FAST_TSERVER_FLAGS
SCHEMA = Schema([Column("id", "int64"), Column("v", "string", nullable=True)], key=["id"])


@pytest.fixture
def cluster(make_cluster: Callable[..., MiniCluster]) -> MiniCluster:
    return make_cluster(3, num_masters=1, master_flags=MASTER_FLAGS, tserver_flags=TSERVER_FLAGS)


def nyala(*args: str) -> subprocess.CompletedProcess[str]:
    """Runs the ``nyala`` program."""
    return run_nyala(*args, timeout_s=60)


def ksck(cluster: MiniCluster) -> tuple[int, dict[str, Any]]:
    """(exit code ksck would give, its JSON report), in this process (the polling loops run it
    often; the program itself is run by the tests where its exit code and output matter)."""
    snapshot, findings = ksck_module.run(cluster.master_addrs)
    return (0 if not findings else 1), ksck_module.to_json(snapshot, findings)


def wait_ksck(cluster: MiniCluster, predicate: Any, what: str) -> dict[str, Any]:
    """Runs ksck until ``predicate(code, report)`` holds; returns that report."""
    found: dict[str, Any] = {}

    def ok() -> bool:
        code, report = ksck(cluster)
        found.update(report)
        return bool(predicate(code, report))

    ops.wait_until(ok, timeout_s=30, what=what)
    return found


def problems(report: dict[str, Any]) -> list[str]:
    """Every finding as one string."""
    return [f"{f['kind']} {f['subject']}: {f['problem']}" for f in report["findings"]]


def _create_and_wait_healthy(cluster: MiniCluster) -> None:
    ops.call(cluster, "CreateTable", ops.create_table_request("k", SCHEMA, buckets=2))
    ops.wait_create_done(cluster, "k")
    healthy = wait_ksck(cluster, lambda code, r: code == 0, "a healthy ksck")
    assert healthy["healthy"]
    assert len(healthy["tablets"]) == 2


def test_ksck_reports_dead_tserver_and_tablets_without_leader(cluster: MiniCluster) -> None:
    _create_and_wait_healthy(cluster)
    table_out = nyala("cluster", "ksck", "-m", ",".join(cluster.master_addrs))
    assert table_out.returncode == 0
    assert "HEALTHY" in table_out.stdout

    dead = cluster.tserver(0)
    dead.kill()
    report = wait_ksck(
        cluster,
        lambda code, r: code == 1 and any("not live" in p for p in problems(r)),
        "ksck reporting the dead tserver",
    )
    assert any(str(dead.uuid) in p and "not live" in p for p in problems(report))
    table_out = nyala("cluster", "ksck", "-m", ",".join(cluster.master_addrs))
    assert table_out.returncode == 1
    assert "UNHEALTHY" in table_out.stdout

    cluster.tserver(1).kill()
    wait_ksck(
        cluster,
        lambda code, r: code == 1 and sum("no leader" in p for p in problems(r)) == 2,
        "ksck reporting tablets without a leader",
    )


@pytest.mark.slow
def test_ksck_reports_dead_master_and_config_disagreement(cluster: MiniCluster) -> None:
    _create_and_wait_healthy(cluster)
    master = cluster.masters[0]
    master.kill()
    report = wait_ksck(cluster, lambda code, r: code == 1, "ksck failing on a dead master")
    assert any(p.startswith(f"master {master.rpc_addr}: unreachable") for p in problems(report))
    master.restart()
    wait_ksck(cluster, lambda code, r: code == 0, "healthy again")

    # Config disagreement: one replica's committed config rewritten offline.
    tablet = ops.locations(cluster, "k")[0]
    victim = cluster.tserver(2)
    others = [str(ts.uuid) for ts in cluster.tservers if ts is not victim]
    victim.stop()
    rewrite = nyala(
        "local-replica",
        "cmeta",
        "unsafe-rewrite-config",
        tablet.tablet_id,
        str(victim.uuid),
        others[0],
        "--fs-root",
        str(victim.fs_root),
    )
    assert rewrite.returncode == 0, rewrite.stderr
    victim.restart()
    report = wait_ksck(
        cluster,
        lambda code, r: code == 1 and any("config disagreement" in p for p in problems(r)),
        "ksck reporting the config disagreement",
    )
    assert any(tablet.tablet_id in p and str(victim.uuid) in p for p in problems(report))
    program = nyala("cluster", "ksck", "-m", ",".join(cluster.master_addrs), "--format", "json")
    assert program.returncode == 1
    assert not json.loads(program.stdout)["healthy"]
