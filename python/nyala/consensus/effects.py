"""What the Raft core asks its runtime to do. The runtime executes effects in order.

Order matters in one place: a ``Send`` is only emitted after the cmeta it depends on has been
saved (the core saves through its ``CmetaStore`` before queuing the message), so a runtime that
executes effects in order never answers a vote before the vote is durable.
"""

from __future__ import annotations

from dataclasses import dataclass

from nyala.consensus.messages import Message
from nyala.consensus.types import OpId, RaftConfig, Role


@dataclass(frozen=True, slots=True)
class Send:
    """Deliver ``message`` to ``message.dest`` (best effort; loss is tolerated)."""

    message: Message


@dataclass(frozen=True, slots=True)
class Apply:
    """Apply the committed entries ``first_index..last_index`` (inclusive) to the state machine,
    in order. Each index is named exactly once per incarnation of the replica."""

    first_index: int
    last_index: int


@dataclass(frozen=True, slots=True)
class LogTruncated:
    """Entries from ``from_index`` on were discarded: their proposals did not commit."""

    from_index: int


@dataclass(frozen=True, slots=True)
class RoleChanged:
    """The replica's role, term or known leader changed."""

    role: Role
    term: int
    leader_uuid: str | None


@dataclass(frozen=True, slots=True)
class ConfigCommitted:
    """A config entry committed (and was written to cmeta)."""

    config: RaftConfig


@dataclass(frozen=True, slots=True)
class ReadReady:
    """A linearizable read may be served: leadership was confirmed and ``index`` is applied."""

    read_id: int
    index: int


@dataclass(frozen=True, slots=True)
class ReadFailed:
    """A read could not be confirmed (the leader lost leadership): retry at the new leader."""

    read_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class StartTabletCopy:
    """Leader only: follower ``peer_uuid`` cannot be caught up from the log (it needs entries
    already GC'd, or it reports TABLET_NOT_FOUND); ask it to copy the tablet from this leader.
    Repeated every heartbeat interval until the follower answers with a log again.
    ``target_last_op_id``: the follower's last entry as it last reported it (None when it
    reported no log), which the request carries so that the follower refuses it once its log
    has moved on (seed 000's idempotency)."""

    peer_uuid: str
    term: int
    target_last_op_id: OpId | None = None


Effect = (
    Send
    | Apply
    | LogTruncated
    | RoleChanged
    | ConfigCommitted
    | ReadReady
    | ReadFailed
    | StartTabletCopy
)
