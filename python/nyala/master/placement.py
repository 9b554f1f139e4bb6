"""Placement of new replicas: "power of two choices" over live tablet servers by load.

For each replica, two distinct candidates are drawn at random among the live servers not yet
chosen for the tablet, and the less loaded one wins (load = replicas the catalog places on the
server, plus those chosen earlier in the same operation). This spreads replicas nearly as evenly
as always taking the least loaded server, without every concurrent creation piling onto the
same one (Mitzenmacher, "The Power of Two Choices in Randomized Load Balancing").
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence

from nyala.errors import InvalidArgumentError


def choose_replicas(
    live: Sequence[str],
    load: dict[str, int],
    count: int,
    rng: random.Random,
    *,
    avoid: Collection[str] = (),
) -> list[str]:
    """``count`` distinct servers of ``live``; ``load`` is updated with the choice.

    Servers in ``avoid`` are taken only once every other live server has been chosen: a
    replacement for a tablet whose creation timed out stays off the servers that never
    reported it, as far as the live servers allow.
    """
    if count > len(live):
        raise InvalidArgumentError(
            f"{count} replicas requested, but only {len(live)} tablet servers are live"
        )
    preferred = [ts for ts in live if ts not in avoid]
    fallback = [ts for ts in live if ts in avoid]
    chosen: list[str] = []
    for _ in range(count):
        candidates = [ts for ts in preferred if ts not in chosen] or [
            ts for ts in fallback if ts not in chosen
        ]
        if len(candidates) == 1:
            pick = candidates[0]
        else:
            a, b = rng.sample(candidates, 2)
            pick = a if load.get(a, 0) <= load.get(b, 0) else b
        chosen.append(pick)
        load[pick] = load.get(pick, 0) + 1
    return chosen
