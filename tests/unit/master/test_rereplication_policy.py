"""The re-replication decision (``nyala.master.rereplication.decide``), case by case."""

from __future__ import annotations

from nyala.master.rereplication import Action, PeerView, decide


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
