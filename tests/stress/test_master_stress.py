"""Stress: DDL without pause while master leader elections are forced every few seconds; at the
end the catalog must match the acknowledged history (the test seed 004 says was missing).

Opt-in (``pytest -m stress``); runs ``NYALA_STRESS_S`` seconds (default 60) of DDL, well under
two minutes in all. Each operation's outcome is acknowledged (it took effect, exactly once) or
unknown (a leader change or a timeout answered it: it may or may not have taken effect). The
history is then checked against the catalog: every acknowledged create not followed by a
delete exists with every acknowledged alter applied, every acknowledged delete is gone, no
table appears that no create could explain, and every listed table is whole (all tablets, all
replicas, finished alters reported by every replica).
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

import pytest

from nyala import errors
from nyala._proto import consensus_pb2, master_pb2
from nyala.master.sys_catalog import SYS_CATALOG_TABLET_ID
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster, dump_logs
from nyala.testing import master_ops as ops

pytestmark = pytest.mark.stress

STRESS_S = float(os.environ.get("NYALA_STRESS_S", "60"))
ELECTION_EVERY_S = 3.0
# Tables (each 2 tablets x 3 replicas) that may exist at once, so the tservers keep up.
LIVE_TABLES_MAX = 8
RAFT_FLAGS = [
    "--heartbeat-interval-ms",
    "250",
    "--leader-failure-max-missed-heartbeat-periods",
    "3",
]
SCHEMA = Schema([Column("id", "int64"), Column("v", "string", nullable=True)], key=["id"])
_UNKNOWN = (errors.RetriableError, errors.TimedOutError, errors.AbortedError)


@dataclass
class TableHistory:
    """What the workload knows about one table name."""

    created: bool = False  # acknowledged
    deleted: bool = False  # acknowledged
    unknown: bool = False  # some operation on it has an unknown outcome
    alters: int = 0  # acknowledged AlterTable count
    columns: list[str] = field(default_factory=list)


def _force_elections(cluster: MiniCluster, stop: threading.Event, count: list[int]) -> None:
    """Every few seconds: the leader master steps down (or, every third time, is SIGKILLed; the
    main thread restarts it, because a child dies with the thread that started it:
    PR_SET_PDEATHSIG), so a new leader must take over in the middle of the DDL."""
    while not stop.wait(ELECTION_EVERY_S):
        try:
            leader = cluster.leader_master(timeout_s=10)
        except errors.NyalaError:
            continue
        if count[0] % 3 == 2:
            leader.signal(signal.SIGKILL)  # reaped and restarted by the main thread
        else:
            request = consensus_pb2.LeaderStepDownRequestPB(
                dest_uuid=leader.uuid, tablet_id=SYS_CATALOG_TABLET_ID
            )
            try:
                with leader.proxy() as proxy:
                    proxy.call(proxy.consensus.LeaderStepDown, request, timeout_ms=2_000)
            except errors.NyalaError:
                continue
        count[0] += 1


def _restart_killed(cluster: MiniCluster) -> None:
    for master in cluster.masters:
        if master.returncode is not None:
            master.start()  # ready or not: the DDL goes on meanwhile


def _one_op(
    cluster: MiniCluster, rng: random.Random, history: dict[str, TableHistory], n: int
) -> None:
    live = [name for name, h in history.items() if h.created and not h.deleted and not h.unknown]
    existing = [name for name, h in history.items() if not h.deleted and (h.created or h.unknown)]
    choice = rng.random()
    if len(existing) >= LIVE_TABLES_MAX:
        choice = max(choice, 0.6)  # alter or delete: 2 Python tservers' worth of Raft groups
    if not live or choice < 0.4:
        name = f"t{n}"
        h = history[name] = TableHistory()
        try:
            ops.call_once(cluster, "CreateTable", ops.create_table_request(name, SCHEMA, buckets=2))
            h.created = True
        except _UNKNOWN:
            h.unknown = True
        return
    name = rng.choice(live)
    h = history[name]
    if choice < 0.75:
        column = f"c{h.alters}"
        try:
            ops.call_once(cluster, "AlterTable", ops.add_column_request(name, column, "int64"))
            h.alters += 1
            h.columns.append(column)
        except _UNKNOWN:
            h.unknown = True
    else:
        try:
            ops.call_once(
                cluster, "DeleteTable", master_pb2.DeleteTableRequestPB(table=ops.table_ident(name))
            )
            h.deleted = True
        except _UNKNOWN:
            h.unknown = True


def _check(cluster: MiniCluster, history: dict[str, TableHistory]) -> None:
    cluster.leader_master(timeout_s=120)  # the loaded machine may take a while to settle
    listed = ops.list_tables(cluster)
    for name, h in history.items():
        if h.unknown:
            continue
        if h.created and not h.deleted:
            assert name in listed, f"acknowledged table {name} is missing"
            assert listed[name].schema_version == h.alters, f"{name}: alters lost or doubled"
        if h.deleted:
            assert name not in listed, f"table {name} deleted with an acknowledgement is listed"
    for name in listed:
        assert name in history, f"table {name} appeared from nowhere"
        assert history[name].created or history[name].unknown
    for name in listed:
        ops.wait_alter_done(cluster, name, timeout_s=60)
        tablets = ops.locations(cluster, name)
        assert len(tablets) == 2, f"{name} is half-created"
        assert all(len(t.replicas) == 3 for t in tablets)


def test_ddl_under_forced_master_elections() -> None:
    cluster = MiniCluster(
        3,
        num_masters=3,
        master_flags=[
            *RAFT_FLAGS,
            "--background-task-interval-ms",
            "100",
            "--catalog-write-timeout-ms",
            "5000",
        ],
        tserver_flags=[*RAFT_FLAGS, "--master-heartbeat-interval-ms", "200"],
    )
    with cluster:
        try:
            rng = random.Random(int(os.environ.get("NYALA_STRESS_SEED", "9")))
            history: dict[str, TableHistory] = {}
            stop = threading.Event()
            elections = [0]
            forcer = threading.Thread(target=_force_elections, args=(cluster, stop, elections))
            forcer.start()
            deadline = time.monotonic() + STRESS_S
            n = 0
            try:
                while time.monotonic() < deadline:
                    _one_op(cluster, rng, history, n)
                    _restart_killed(cluster)
                    n += 1
            finally:
                stop.set()
                forcer.join()
            for master in cluster.masters:
                if not master.is_running():
                    master.restart()
            acked = sum(1 for h in history.values() if h.created)
            print(f"{n} DDL ops, {acked} acknowledged creates, {elections[0]} forced elections")
            assert elections[0] >= 2
            _check(cluster, history)
        except BaseException:
            dump_logs(cluster, sys.stderr)
            raise
