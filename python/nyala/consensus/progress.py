"""``PeerProgress``: what a leader knows about one follower's log, its replication window, and
the follower's health as the leader reports it to the master (``PeerHealth``)."""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from nyala.consensus.types import OpId


class PeerHealth(enum.Enum):
    """A follower's health as its leader sees it (Kudu's per-peer health report).

    ``FAILED_UNRECOVERABLE``: the follower answered that its replica is FAILED, or it needs
    entries this leader's WAL no longer holds and a tablet copy onto it was refused; waiting
    does not help. ``FAILED``: not heard from for the failure timeout. ``UNKNOWN``: not heard
    from yet, within the failure timeout.
    """

    UNKNOWN = "UNKNOWN"
    HEALTHY = "HEALTHY"
    FAILED = "FAILED"
    FAILED_UNRECOVERABLE = "FAILED_UNRECOVERABLE"


@dataclass(slots=True)
class PeerProgress:
    """Replication state of one follower, owned by the leader for one term.

    In *probe* mode at most one AppendEntries with entries is in flight (after a mismatch, a
    restart, or a lost message); in *replicate* mode batches are pipelined up to a byte window.
    """

    uuid: str
    next_index: int  # next entry to send; invariant: match_index < next_index
    match_index: int = 0  # highest index the follower received matching ours (may be lost)
    durable_index: int = 0  # highest index known durable on the follower; invariant: <= match
    probing: bool = True
    # Unacknowledged batches: (first index, last index, bytes, sent_ms), oldest first.
    inflight: deque[tuple[int, int, int, int]] = field(default_factory=deque)
    inflight_bytes: int = 0  # invariant: == sum of inflight bytes
    acked_seq: int = 0  # highest heartbeat round the follower answered in this term
    last_ack_ms: int | None = None  # None: not heard from in this term
    # The follower can only be caught up by a tablet copy; no entries are sent meanwhile.
    copy_needed: bool = False
    # When the leader began tracking this follower (health is UNKNOWN for the failure timeout).
    tracked_since_ms: int = 0
    # Any answer, refusals (TABLET_NOT_FOUND, TABLET_FAILED) included: the follower is reachable.
    last_contact_ms: int | None = None
    # Why waiting will not help (its replica FAILED, a copy refused); cleared by a log answer.
    unrecoverable: str | None = None
    # The follower's last entry as its latest LOG_MISMATCH answer gave it; None after any other
    # answer (unknown) or a TABLET_NOT_FOUND (no log). A StartTabletCopy carries it.
    reported_last: OpId | None = None
    # The highest commit index sent to it (what it may apply once it has the entries).
    commit_sent: int = 0

    def sent(self, last_index: int, size_bytes: int, now_ms: int) -> None:
        """A batch ending at ``last_index`` went out."""
        assert last_index >= self.next_index - 1  # == for an empty probe
        self.inflight.append((self.next_index, last_index, size_bytes, now_ms))
        self.next_index = last_index + 1
        self.inflight_bytes += size_bytes

    def acked(self, last_index: int, durable_index: int) -> None:
        """The follower matched our log up to ``last_index`` (durable up to ``durable_index``)."""
        self.match_index = max(self.match_index, last_index)
        self.durable_index = max(self.durable_index, min(durable_index, self.match_index))
        if self.probing and self.match_index >= self.next_index - 1:
            self.probing = False
        self.next_index = max(self.next_index, self.match_index + 1)
        while self.inflight and self.inflight[0][1] <= self.match_index:
            self.inflight_bytes -= self.inflight.popleft()[2]
        assert self.durable_index <= self.match_index < self.next_index

    def mismatched(self, hint_index: int) -> None:
        """The follower lacks our preceding entry; retry from ``hint_index`` at the latest."""
        # Not bounded by match_index: a follower that crashed loses entries it received but had
        # not made durable, so only the durable index is a floor.
        self.next_index = max(self.durable_index + 1, min(hint_index, self.next_index))
        self.match_index = min(self.match_index, self.next_index - 1)
        self._clear_inflight()

    def lost(self) -> None:
        """What is in flight went unanswered too long: probe again from the oldest unanswered
        batch (not from the match index: a new leader's first probe keeps its position)."""
        if self.inflight:
            self.next_index = max(self.match_index + 1, self.inflight[0][0])
        self._clear_inflight()

    def start_copy(self, next_index: int) -> None:
        """Copy mode: the follower's log is about to be replaced, so nothing known of it holds."""
        self.copy_needed = True
        self.commit_sent = 0
        self.next_index = next_index
        self.match_index = 0
        self.durable_index = 0
        self._clear_inflight()

    def _clear_inflight(self) -> None:
        self.probing = True
        self.inflight.clear()
        self.inflight_bytes = 0

    def health(self, now_ms: int, failed_after_ms: int) -> PeerHealth:
        """The follower's health at ``now_ms`` with failure timeout ``failed_after_ms``."""
        if self.unrecoverable is not None:
            return PeerHealth.FAILED_UNRECOVERABLE
        heard = self.last_contact_ms
        if now_ms - (self.tracked_since_ms if heard is None else heard) > failed_after_ms:
            return PeerHealth.FAILED
        return PeerHealth.UNKNOWN if heard is None else PeerHealth.HEALTHY

    def oldest_inflight_ms(self) -> int | None:
        """When the oldest unacknowledged batch was sent."""
        return self.inflight[0][3] if self.inflight else None
