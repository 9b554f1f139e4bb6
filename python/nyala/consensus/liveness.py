"""Liveness of quiesced replicas, carried by one heartbeat per pair of servers (sans-I/O).

A quiesced Raft group sends nothing of its own (``RaftCore``, "Quiescence"). Each server
instead tells each peer server, once per heartbeat interval, which of its replicas are
quiesced and as what: ``Leading`` (this server's replica leads the tablet at a term and
commit index) or ``Following`` (it follows a leader at a term and commit index). The receiver
holds that against its own quiesced replicas of the same tablets (``receive``): a follower of
the sender hears its leader vouched for, a leader hears its follower; any mismatch, or the
sender's silence (``ServerSilence``), wakes the replica, which then heartbeats (leader) or runs
its election timer from the last sign of life (follower).

This module decides nothing about Raft's rules; it only routes what each server says to the
cores' ``vouched_by_leader``, ``vouched_by_peer`` and ``wake``. The tablet server's runtime and
the in-process ``SimCluster`` both use it, so the simulation checks the same logic.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from nyala.consensus.core import RaftCore
from nyala.consensus.types import Role


@dataclass(frozen=True, slots=True)
class Leading:
    """The sender's replica leads the tablet, quiesced, at ``term`` with ``commit_index``."""

    term: int
    commit_index: int


@dataclass(frozen=True, slots=True)
class Following:
    """The sender's replica follows ``leader``, quiesced, at ``term`` with ``commit_index``."""

    leader: str
    term: int
    commit_index: int


QuiescedAs = Leading | Following


def quiesced_as(core: RaftCore) -> QuiescedAs | None:
    """What a server heartbeat says about this replica (None: not quiesced, says nothing)."""
    if not core.quiesced:
        return None
    if core.role is Role.LEADER:
        return Leading(core.term, core.commit_index)
    leader = core.leader_uuid
    if leader is None:
        return None
    return Following(leader, core.term, core.commit_index)


def concerns(core: RaftCore, server: str) -> bool:
    """Whether ``server``'s heartbeats keep this replica quiesced: it is the leader of a
    quiesced follower, or a member of a quiesced leader's config."""
    if not core.quiesced:
        return False
    if core.role is Role.LEADER:
        return server != core.uuid and core.active_config.peer(server) is not None
    return core.leader_uuid == server


def receive(core: RaftCore, sender: str, named: QuiescedAs | None) -> bool:
    """Applies what ``sender``'s server heartbeat says about this tablet (``named``; None if
    it named nothing) to the local replica ``core``. True if ``sender`` concerns it and
    vouched for it (it stays quiesced); False otherwise."""
    if not concerns(core, sender):
        return False
    if core.role is Role.LEADER:
        if isinstance(named, Following) and named.leader == core.uuid:
            return core.vouched_by_peer(sender, named.term, named.commit_index)
        core.not_vouched()
    elif isinstance(named, Leading):
        return core.vouched_by_leader(sender, named.term, named.commit_index)
    else:
        core.not_vouched()
    return False


def sender_silent(core: RaftCore, server: str) -> None:
    """``server`` has sent no heartbeat for too long: a replica it kept quiesced wakes."""
    if concerns(core, server):
        core.wake()


class ServerSilence:
    """When each peer server was last heard, and which went silent (each silence is reported
    once, until the server is heard again)."""

    def __init__(self, silent_after_ms: int) -> None:
        assert silent_after_ms > 0
        self.silent_after_ms = silent_after_ms
        self._heard_ms: dict[str, int] = {}
        self._reported: set[str] = set()

    def heard(self, server: str, now_ms: int) -> None:
        """A heartbeat from ``server`` arrived."""
        self._heard_ms[server] = now_ms
        self._reported.discard(server)

    def watch(self, servers: Iterable[str], now_ms: int) -> None:
        """Starts the clock for servers never heard from (a server that never speaks goes
        silent ``silent_after_ms`` after it was first expected)."""
        for server in servers:
            self._heard_ms.setdefault(server, now_ms)

    def excuse(self, stalled_ms: int) -> None:
        """This server's own event loop was stalled for ``stalled_ms``: heartbeats that
        arrived meanwhile wait, unhandled, behind the stall. The stall is not counted as
        the peers' silence (every clock moves later by it); otherwise one long loop turn on
        a busy server would wake every quiesced replica it holds, and that load stalls the
        loop again (the election storm of issue "Thousands of tablet replicas per server").
        Only the detector moves: a replica's own last contact with its leader, which
        decides vote withholding, is untouched."""
        if stalled_ms <= 0:
            return
        for server, heard in self._heard_ms.items():
            self._heard_ms[server] = heard + stalled_ms

    def newly_silent(self, now_ms: int) -> list[str]:
        """Servers not heard for more than ``silent_after_ms`` and not yet reported."""
        out = [
            server
            for server, heard in sorted(self._heard_ms.items())
            if now_ms - heard > self.silent_after_ms and server not in self._reported
        ]
        self._reported.update(out)
        return out
