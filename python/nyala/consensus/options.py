"""Tunables of the Raft core, each with its unit in the name (DESIGN.md §8 defaults)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RaftOptions:
    """Timing and flow-control limits of one Raft replica."""

    heartbeat_interval_ms: int = 500
    missed_heartbeats_before_election: int = 3  # the base election timeout, in heartbeats
    election_jitter_fraction: float = 0.25  # each timeout is base * [1 - j, 1 + j)
    election_backoff_max_ms: int = 12_000  # cap of the exponential back-off (before jitter)
    batch_bytes_max: int = 1024 * 1024  # payload bytes in one AppendEntries
    peer_inflight_bytes_max: int = 4 * 1024 * 1024  # unacknowledged bytes per follower
    # Unacknowledged batches per follower. The tablet server sets 1 (Kudu's one outstanding
    # request per peer): proposals arriving while a batch is out then gather into the next
    # one, so batch size follows load (docs/performance.md).
    peer_inflight_batches_max: int = 64
    transfer_timeout_ms: int = 3_000  # a leadership transfer gives up after this long
    failed_follower_timeout_ms: int = 300_000  # a silent follower counts as down for removal
    step_down_snooze_ms: int = 6_000  # failure-detector pause after an abrupt step-down
    # Quiescence: a leader whose followers have everything stops heartbeating after this many
    # idle heartbeat rounds (0: never; liveness then travels in server heartbeats).
    quiesce_after_idle_heartbeats: int = 0
    # A batch still unanswered after this long counts as lost and is sent again (0: one
    # heartbeat interval). A runtime whose transport reports lost requests (a broken stream, a
    # refusal: ``RaftCore.append_lost``) sets more, so that a batch that is merely slow, on a
    # busy follower or behind a stalled event loop, is not read and sent a second time.
    unanswered_resend_after_ms: int = 0
    # How long a leader may wait to tell idle followers a new commit index (0: at once, as
    # Kudu and etcd do). An AppendEntries that goes meanwhile carries it, so under a steady
    # write load no message is sent for it at all; the tablet server sets a few
    # milliseconds (a lone writer's every write cost each follower one more exchange).
    commit_notice_delay_ms: int = 0

    def __post_init__(self) -> None:
        assert self.heartbeat_interval_ms > 0
        assert self.missed_heartbeats_before_election >= 1
        assert 0.0 <= self.election_jitter_fraction < 1.0
        assert self.batch_bytes_max > 0
        assert self.peer_inflight_bytes_max >= self.batch_bytes_max
        assert self.peer_inflight_batches_max >= 1
        assert self.quiesce_after_idle_heartbeats >= 0
        assert self.unanswered_resend_after_ms >= 0
        assert self.commit_notice_delay_ms >= 0

    @property
    def election_timeout_base_ms(self) -> int:
        """Heartbeat interval times the missed periods: the timeout before jitter and back-off."""
        return self.heartbeat_interval_ms * self.missed_heartbeats_before_election

    @property
    def election_timeout_min_ms(self) -> int:
        """The shortest timeout any replica can draw; a leader heard within it is alive."""
        return int(self.election_timeout_base_ms * (1.0 - self.election_jitter_fraction))

    @property
    def election_jitter_range_ms(self) -> int:
        """The width of the range a timeout is drawn from (750 ms by default): the slot
        between two ranks' first campaigns after a wake (``RaftCore._wake``)."""
        return int(2 * self.election_jitter_fraction * self.election_timeout_base_ms)
