"""The rebalancer's plan (``nyala.client.rebalance.plan_move``), case by case."""

from __future__ import annotations

from nyala.client.ksck import TabletView
from nyala.client.rebalance import Move, plan_move


def _tablet(tablet_id: str, voters: list[str], table: str = "t") -> TabletView:
    return TabletView(tablet_id, table, 3, voters[0], sorted(voters), [], -1)


def test_balanced_cluster_has_no_move() -> None:
    tablets = [_tablet("a", ["1", "2", "3"]), _tablet("b", ["1", "2", "3"])]
    assert plan_move(tablets, ["1", "2", "3"], {"a", "b"}) is None


def test_new_servers_get_replicas_from_the_most_loaded() -> None:
    tablets = [_tablet(x, ["1", "2", "3"]) for x in "abcd"]
    move = plan_move(tablets, ["1", "2", "3", "4", "5"], set("abcd"))
    assert move == Move("t", "a", "1", "5")


def test_unhealthy_tablets_are_not_moved() -> None:
    tablets = [_tablet("a", ["1", "2", "3"]), _tablet("b", ["1", "2", "3"])]
    assert plan_move(tablets, ["1", "2", "3", "4", "5"], set()) is None
    move = plan_move(tablets, ["1", "2", "3", "4", "5"], {"b"})
    assert move is not None
    assert move.tablet_id == "b"


def test_plan_converges_to_a_spread_of_one() -> None:
    tablets = [_tablet(x, ["1", "2", "3"]) for x in "abcdef"]
    live = ["1", "2", "3", "4", "5"]
    for _ in range(20):
        move = plan_move(tablets, live, {t.tablet_id for t in tablets})
        if move is None:
            break
        for t in tablets:
            if t.tablet_id == move.tablet_id:
                t.voters = sorted((set(t.voters) - {move.from_ts}) | {move.to_ts})
    counts = {ts: sum(ts in t.voters for t in tablets) for ts in live}
    assert max(counts.values()) - min(counts.values()) <= 1
    assert all(len(t.voters) == 3 for t in tablets)
