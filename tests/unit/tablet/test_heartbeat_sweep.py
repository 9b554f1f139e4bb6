"""The tablet report's sweep (``Heartbeater._snapshot``): with more replicas than a sweep looks
at, each replica's untriggered change is still reported within ``ceil(n / max)`` sweeps, while
new, deleted and triggered replicas are looked at in the next one.

Real replicas on a real fs layout; no master is contacted (the snapshot is what a heartbeat
would send)."""

from __future__ import annotations

import math

import pytest

from nyala.consensus.types import RaftConfig, RaftPeer
from nyala.rpc.settings import RpcSettings
from nyala.schema import Column, Schema
from nyala.tablet import DataState, Partition, TabletDirs, TabletManager
from nyala.tserver import heartbeater
from nyala.tserver.heartbeater import Heartbeater

SCHEMA = Schema([Column("id", "int64")], ["id"])
CONFIG = RaftConfig(peers=(RaftPeer(uuid="a" * 32, address="127.0.0.1:7050"),))
REPLICAS = 7
SWEEP_MAX = 3


@pytest.fixture
def manager(dirs: TabletDirs) -> TabletManager:
    """A tablet manager with ``REPLICAS`` replicas (``dirs``: conftest.py)."""
    tablets = TabletManager(dirs)
    tablets.open_all()
    for i in range(REPLICAS):
        create(tablets, i)
    return tablets


def create(tablets: TabletManager, i: int) -> str:
    tablet_id = f"{i:032x}"
    tablets.create_tablet(
        tablet_id,
        table_id="t" * 32,
        table_name="events",
        schema=SCHEMA,
        partition=Partition(hash_buckets=(i,), key_start=b"", key_end=b""),
        config=CONFIG,
    )
    return tablet_id


def sweeper(tablets: TabletManager) -> Heartbeater:
    # A 0 ms interval: every snapshot is a sweep.
    return Heartbeater("a" * 32, "127.0.0.1:1", "127.0.0.1:2", [], 0, tablets, RpcSettings())


def test_an_untriggered_change_is_reported_within_the_sweeps_cycle(
    manager: TabletManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(heartbeater, "SWEEP_REPLICAS_MAX", SWEEP_MAX)
    beats = sweeper(manager)
    first = beats._snapshot()
    assert len(first) == REPLICAS  # every replica is reported from the first sweep
    for i in range(REPLICAS):  # each replica, wherever the sweep's turn stands
        tablet_id = f"{i:032x}"
        manager.replica(tablet_id).fail(f"disk {i} failed")  # triggers nothing
        sweeps = 0
        while True:
            sweeps += 1
            report = beats._snapshot()[tablet_id][1]
            if report.state_reason == f"disk {i} failed":
                break
            assert sweeps < math.ceil(REPLICAS / SWEEP_MAX), "the change was never reported"
    # A new replica is in the next snapshot, a deleted one gone from it, a triggered one
    # looked at again, whatever the turn.
    new = create(manager, REPLICAS)
    manager.delete_tablet(f"{0:032x}", DataState.DELETED)
    snapshot = beats._snapshot()
    assert new in snapshot
    assert f"{0:032x}" not in snapshot
    manager.replica(new).fail("triggered")
    beats.trigger(new)
    assert beats._snapshot()[new][1].state_reason == "triggered"


def test_a_sweep_looks_at_no_more_than_its_share(
    manager: TabletManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(heartbeater, "SWEEP_REPLICAS_MAX", SWEEP_MAX)
    beats = sweeper(manager)
    beats._snapshot()
    for replica in manager.replicas():
        replica.fail("changed")
    changed = [
        sum(pb.state_reason == "changed" for _, pb in beats._snapshot().values())
        for _ in range(math.ceil(REPLICAS / SWEEP_MAX))
    ]
    assert changed == [3, 6, 7]
