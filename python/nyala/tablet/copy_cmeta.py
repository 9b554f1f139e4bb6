"""Tablet copy, target side: merging the source's consensus metadata into the local one.

A replica that is copied must never become amnesiac (seed 000, "Consensus metadata merge"):
its term only grows, and a vote it cast in its current term is kept unless the merge moves it
to a newer term (in which it has not voted). The committed config always comes from the source,
which knows the group's current membership. This module owns only the rule; the copy job
writes the result before it downloads any data.
"""

from __future__ import annotations

from nyala.consensus.metadata import ConsensusMetadata


def merge_cmeta(local: ConsensusMetadata | None, remote: ConsensusMetadata) -> ConsensusMetadata:
    """The cmeta a copied replica starts with.

    1. The highest term wins.
    2. If the remote term is not higher, the local vote (cast in the local term) is kept.
    3. The remote committed config is adopted.

    The remote's own vote is never adopted: it is the source's vote, not ours.
    """
    if local is None:
        return ConsensusMetadata(remote.current_term, None, remote.committed_config)
    if remote.current_term > local.current_term:
        return ConsensusMetadata(remote.current_term, None, remote.committed_config)
    merged = ConsensusMetadata(local.current_term, local.voted_for, remote.committed_config)
    assert merged.current_term >= remote.current_term
    return merged
