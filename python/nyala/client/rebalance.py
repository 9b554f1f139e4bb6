"""Rebalancing (``nyala cluster rebalance``): even out each table's replicas over tservers.

Goal: for every table, the live tablet servers hold numbers of its replicas that differ by at
most one. One move at a time (``client.admin.move_replica``: add on the target, promote, evict
the source), and only of a tablet that ksck finds healthy, so a move never takes a tablet below
a healthy majority: the new replica is a non-voter until caught up, and the policy evicts the
old one only once the new one votes. After each move the cluster is looked at again.

``plan_move`` is pure: given the tablets' voters and the live servers it returns the next move.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nyala.client import ksck


@dataclass(frozen=True)
class Move:
    """One replica move."""

    table: str
    tablet_id: str
    from_ts: str
    to_ts: str


def plan_move(
    tablets: Sequence[ksck.TabletView], live: Sequence[str], healthy: set[str]
) -> Move | None:
    """The next move (``None``: balanced). ``healthy``: tablet ids that may be moved."""
    by_table: dict[str, list[ksck.TabletView]] = {}
    for tablet in tablets:
        by_table.setdefault(tablet.table, []).append(tablet)
    for table in sorted(by_table):
        move = _plan_table(table, by_table[table], live, healthy)
        if move is not None:
            return move
    return None


def _plan_table(
    table: str, tablets: list[ksck.TabletView], live: Sequence[str], healthy: set[str]
) -> Move | None:
    counts = {ts: 0 for ts in live}
    for tablet in tablets:
        for uuid in tablet.voters:
            if uuid in counts:
                counts[uuid] += 1
    if len(counts) < 2:
        return None
    # Most loaded first, least loaded last; ties broken by uuid so the plan is deterministic.
    order = sorted(counts, key=lambda ts: (-counts[ts], ts))
    for source in order:
        for target in reversed(order):
            if counts[source] - counts[target] <= 1:
                break
            for tablet in sorted(tablets, key=lambda t: t.tablet_id):
                if (
                    tablet.tablet_id in healthy
                    and source in tablet.voters
                    and target not in tablet.voters
                    and target not in tablet.non_voters
                ):
                    return Move(table, tablet.tablet_id, source, target)
    return None


def rebalance(
    client: Any, masters: Sequence[str], *, max_moves: int, dry_run: bool = False
) -> list[Move]:
    """Moves replicas one at a time until balanced or ``max_moves``; returns the moves."""
    done: list[Move] = []
    while len(done) < max_moves:
        snapshot, findings = ksck.run(masters)
        unhealthy = {f.subject.split(" ")[0] for f in findings if f.kind == "tablet"}
        healthy = {t.tablet_id for t in snapshot.tablets if t.tablet_id not in unhealthy}
        live = [ts["uuid"] for ts in snapshot.tservers if ts["live"]]
        move = plan_move(snapshot.tablets, live, healthy)
        if move is None:
            break
        done.append(move)
        if dry_run:
            break
        client.admin.move_replica(move.tablet_id, move.from_ts, move.to_ts)
    return done
