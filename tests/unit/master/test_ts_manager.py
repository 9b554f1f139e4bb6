"""``TSManager``'s liveness states: LIVE, UNRESPONSIVE once a heartbeat is overdue (by the
server's own interval), DEAD after the unresponsive timeout; placement goes by DEAD only."""

from __future__ import annotations

import time

from nyala._proto import master_pb2
from nyala.master.ts_manager import DEAD, LIVE, UNRESPONSIVE, TSManager


def _registration() -> master_pb2.TSRegistrationPB:
    reg = master_pb2.TSRegistrationPB()
    reg.rpc_addr.host, reg.rpc_addr.port = "127.0.0.1", 7050
    reg.http_addr.host, reg.http_addr.port = "127.0.0.1", 8050
    return reg


def test_states_follow_the_servers_own_heartbeat_interval() -> None:
    manager = TSManager(unresponsive_timeout_ms=60_000)
    ts = manager.heartbeat("a", 1, _registration(), interval_ms=200)
    assert manager.state(ts) == LIVE
    ts.last_heartbeat_s = time.monotonic() - 0.25  # 1.25 intervals: not overdue yet
    assert manager.state(ts) == LIVE
    ts.last_heartbeat_s = time.monotonic() - 0.35  # 1.75 intervals
    assert manager.state(ts) == UNRESPONSIVE
    assert manager.is_live(ts)  # still placeable
    ts.last_heartbeat_s = time.monotonic() - 61
    assert manager.state(ts) == DEAD
    assert not manager.is_live(ts)
    assert manager.live() == []


def test_a_server_that_does_not_say_its_interval_gets_the_default() -> None:
    manager = TSManager(unresponsive_timeout_ms=60_000)
    ts = manager.heartbeat("a", 1, _registration())
    assert ts.heartbeat_interval_ms == 1_000
    ts.last_heartbeat_s = time.monotonic() - 1.2
    assert manager.state(ts) == LIVE
    ts.last_heartbeat_s = time.monotonic() - 1.6
    assert manager.state(ts) == UNRESPONSIVE
