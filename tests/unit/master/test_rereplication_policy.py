"""The re-replication decision (``nyala.master.rereplication.decide``), case by case."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

from nyala._proto import master_pb2, metadata_pb2
from nyala.master.catalog import TabletInfo
from nyala.master.rereplication import Action, PeerView, Rereplicator, decide
from nyala.master.ts_manager import TSManager


def _voter(uuid: str, *, failed: bool = False, replace: bool = False) -> PeerView:
    return PeerView(uuid, voter=True, promote=False, replace=replace, failed=failed)


def _learner(uuid: str, *, failed: bool = False) -> PeerView:
    return PeerView(uuid, voter=False, promote=True, replace=False, failed=failed)


def test_healthy_tablet_is_left_alone() -> None:
    peers = [_voter("a"), _voter("b"), _voter("c")]
    assert decide(peers, "a", 3, evict_first=False).action is Action.NONE


def test_failed_voter_gets_a_replacement_before_eviction() -> None:
    peers = [_voter("a"), _voter("b"), _voter("c", failed=True)]
    assert decide(peers, "a", 3, evict_first=False).action is Action.ADD


def test_nothing_more_while_the_replacement_catches_up() -> None:
    peers = [_voter("a"), _voter("b"), _voter("c", failed=True), _learner("d")]
    assert decide(peers, "a", 3, evict_first=False).action is Action.NONE


def test_failed_voter_evicted_once_replaced() -> None:
    peers = [_voter("a"), _voter("b"), _voter("c", failed=True), _voter("d")]
    decision = decide(peers, "a", 3, evict_first=False)
    assert decision.action is Action.EVICT
    assert decision.uuid == "c"


def test_3_2_3_mode_evicts_first() -> None:
    peers = [_voter("a"), _voter("b"), _voter("c", failed=True)]
    decision = decide(peers, "a", 3, evict_first=True)
    assert (decision.action, decision.uuid) == (Action.EVICT, "c")
    after = [_voter("a"), _voter("b")]
    assert decide(after, "a", 3, evict_first=True).action is Action.ADD


def test_no_eviction_without_a_healthy_majority() -> None:
    # Two of four voters down: removing one leaves 1 healthy of 3, not a majority.
    peers = [_voter("a"), _voter("b", failed=True), _voter("c", failed=True), _voter("d")]
    decision = decide(peers, "a", 3, evict_first=True)
    assert decision.action is not Action.EVICT
    # 3-2-3 with two of three down: never evict.
    peers = [_voter("a"), _voter("b", failed=True), _voter("c", failed=True)]
    assert decide(peers, "a", 3, evict_first=True).action is not Action.EVICT


def test_replace_attribute_replaces_a_healthy_voter() -> None:
    peers = [_voter("a"), _voter("b"), _voter("c", replace=True)]
    assert decide(peers, "a", 3, evict_first=False).action is Action.ADD
    peers = [*peers, _voter("d")]
    decision = decide(peers, "a", 3, evict_first=False)
    assert (decision.action, decision.uuid) == (Action.EVICT, "c")


def test_leader_to_be_replaced_steps_down_first() -> None:
    peers = [_voter("a", replace=True), _voter("b"), _voter("c"), _voter("d")]
    decision = decide(peers, "a", 3, evict_first=False)
    assert (decision.action, decision.uuid) == (Action.STEP_DOWN, "a")


def test_failed_replacement_is_dropped() -> None:
    peers = [_voter("a"), _voter("b"), _voter("c", failed=True), _learner("d", failed=True)]
    decision = decide(peers, "a", 3, evict_first=False)
    assert (decision.action, decision.uuid) == (Action.EVICT, "d")


def test_lowered_replication_factor_removes_a_follower() -> None:
    peers = [_voter("a"), _voter("b"), _voter("c"), _voter("d"), _voter("e")]
    decision = decide(peers, "a", 3, evict_first=False)
    assert decision.action is Action.EVICT
    assert decision.uuid != "a"


def test_raised_replication_factor_adds() -> None:
    peers = [_voter("a"), _voter("b"), _voter("c")]
    assert decide(peers, "a", 5, evict_first=False).action is Action.ADD


def test_a_voter_down_but_not_yet_failed_blocks_eviction_without_majority() -> None:
    # "d" (the replacement of "c") votes; "b" stopped heartbeating a moment ago (not live, not
    # yet failed): evicting "c" would leave a, b, d with only two live of three, still a
    # majority; but with "a" down too nothing may be evicted.
    down = PeerView("b", voter=True, promote=False, replace=False, failed=False, live=False)
    peers = [_voter("a"), down, _voter("c", replace=True), _voter("d")]
    decision = decide(peers, "a", 3, evict_first=False)
    assert (decision.action, decision.uuid) == (Action.EVICT, "c")
    down_a = PeerView("d", voter=True, promote=False, replace=False, failed=False, live=False)
    peers = [_voter("a"), down, _voter("c", replace=True), down_a]
    assert decide(peers, "a", 3, evict_first=False).action is Action.NONE


def _manager(live: list[str], reports: dict[str, dict[str, Any]]) -> Any:
    ts_manager = TSManager(unresponsive_timeout_ms=60_000)
    for uuid in live:
        ts_manager.heartbeat(uuid, 1, master_pb2.TSRegistrationPB())
    settings = SimpleNamespace(follower_unavailable_considered_failed_sec=300)
    return SimpleNamespace(
        ts_manager=ts_manager, reports=reports, retired_tservers={"r"}, settings=settings
    )


def test_replacement_avoids_retired_servers_and_servers_holding_a_failed_copy() -> None:
    record = master_pb2.SysTabletEntryPB(tablet_id="t1", state=master_pb2.SYS_TABLET_RUNNING)
    for uuid in ("a", "b", "c"):
        record.consensus_state.committed_config.peers.add(
            permanent_uuid=uuid, member_type=metadata_pb2.VOTER
        )
    failed = master_pb2.ReportedTabletPB(tablet_id="t1", state=metadata_pb2.FAILED)
    manager = _manager(["a", "b", "c", "d", "e", "r"], {"t1": {"d": failed}})
    rereplicator = Rereplicator(manager, random.Random(3))
    chosen = {rereplicator.choose_server(TabletInfo(record), {}) for _ in range(20)}
    assert chosen == {"e"}
    manager.reports = {}
    chosen = {rereplicator.choose_server(TabletInfo(record), {}) for _ in range(40)}
    assert chosen == {"d", "e"}


def test_leader_reported_health_marks_a_follower_failed() -> None:
    record = master_pb2.SysTabletEntryPB(tablet_id="t1", state=master_pb2.SYS_TABLET_RUNNING)
    record.consensus_state.current_term = 4
    record.consensus_state.leader_uuid = "a"
    for uuid in ("a", "b", "c"):
        record.consensus_state.committed_config.peers.add(
            permanent_uuid=uuid, member_type=metadata_pb2.VOTER
        )
    report = master_pb2.ReportedTabletPB(tablet_id="t1", state=metadata_pb2.RUNNING)
    report.consensus_state.current_term = 4
    report.consensus_state.leader_uuid = "a"
    report.peer_health.add(permanent_uuid="b", health=master_pb2.HEALTH_HEALTHY)
    report.peer_health.add(permanent_uuid="c", health=master_pb2.HEALTH_FAILED_UNRECOVERABLE)
    manager = _manager(["a", "b", "c", "d"], {"t1": {"a": report}})
    views = {v.uuid: v for v in Rereplicator(manager).peer_views(TabletInfo(record))}
    assert (views["a"].failed, views["b"].failed, views["c"].failed) == (False, False, True)
    decision = decide(list(views.values()), "a", 3, evict_first=False)
    assert decision.action is Action.ADD
    # A report from an older term (a former leader) is not believed.
    report.consensus_state.current_term = 3
    views = {v.uuid: v for v in Rereplicator(manager).peer_views(TabletInfo(record))}
    assert not views["c"].failed
