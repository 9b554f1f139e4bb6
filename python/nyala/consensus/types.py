"""Identifiers and value types of the consensus layer: op ids, peers, configs, roles.

Everything here is an immutable value. The JSON form of a config (``config_to_json`` /
``config_from_json``) is shared by consensus metadata and by CONFIG_CHANGE log entries, so a
config reads the same wherever it is stored.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field, replace
from typing import Any

from nyala.errors import CorruptionError, InvalidArgumentError

#: ``RaftConfig.opid_index`` of a config that did not come from a log entry (the bootstrap one).
NO_OPID_INDEX = -1


@dataclass(frozen=True, order=True, slots=True)
class OpId:
    """The position of an entry in the replicated log: ``(term, index)``.

    Ordering compares the term first, which is Raft's "more up-to-date log" order.
    """

    term: int
    index: int

    def __str__(self) -> str:
        return f"{self.term}.{self.index}"


#: The OpId before the first entry of any log.
MIN_OP_ID = OpId(0, 0)


class EntryKind(enum.IntEnum):
    """What a log entry holds. Only NO_OP and CONFIG_CHANGE are interpreted by consensus.

    The values are the entry type byte of the WAL and of the entry-batch encoding
    (docs/wal-format.md, docs/entry-batch.md; Rust's ``nyala_wal::EntryType``): this is the one
    Python name for them."""

    WRITE = 1
    NO_OP = 2
    CONFIG_CHANGE = 3


class MemberType(enum.Enum):
    """A peer's membership: VOTERs vote and count for the majority, NON_VOTERs only replicate."""

    VOTER = "VOTER"
    NON_VOTER = "NON_VOTER"


class Role(enum.Enum):
    """A replica's role, as seen by itself."""

    FOLLOWER = "FOLLOWER"
    CANDIDATE = "CANDIDATE"
    LEADER = "LEADER"
    LEARNER = "LEARNER"  # a NON_VOTER of its active config
    NON_PARTICIPANT = "NON_PARTICIPANT"  # not in its active config


@dataclass(frozen=True, slots=True)
class RaftPeer:
    """One member of a config."""

    uuid: str
    address: str
    member_type: MemberType = MemberType.VOTER
    promote: bool = False  # a NON_VOTER the leader turns into a VOTER once caught up
    replace: bool = False  # a member marked for replacement (3-4-3), evicted once replaced

    @property
    def is_voter(self) -> bool:
        """Whether this peer votes and counts for the majority."""
        return self.member_type is MemberType.VOTER


@dataclass(frozen=True, slots=True)
class RaftConfig:
    """A Raft configuration: its peers, and the index of the log entry that introduced it."""

    peers: tuple[RaftPeer, ...]
    opid_index: int = NO_OPID_INDEX  # NO_OPID_INDEX for the bootstrap config
    # Worked out once: a leader counts its voters at every answer it gets.
    _voters: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        uuids = [p.uuid for p in self.peers]
        if len(uuids) != len(set(uuids)):
            raise InvalidArgumentError(f"config lists a peer twice: {uuids}")
        object.__setattr__(self, "_voters", tuple(p.uuid for p in self.peers if p.is_voter))

    def peer(self, uuid: str) -> RaftPeer | None:
        """The peer with ``uuid``, or None."""
        for p in self.peers:
            if p.uuid == uuid:
                return p
        return None

    def voters(self) -> tuple[str, ...]:
        """UUIDs of the VOTERs, in config order."""
        return self._voters

    def is_voter(self, uuid: str) -> bool:
        """Whether ``uuid`` is a VOTER of this config."""
        p = self.peer(uuid)
        return p is not None and p.is_voter

    def majority(self) -> int:
        """How many VOTERs make a majority."""
        return len(self._voters) // 2 + 1

    def with_opid_index(self, index: int) -> RaftConfig:
        """The same peers, introduced at log index ``index``."""
        return replace(self, opid_index=index)

    def describe(self) -> str:
        """``[a b c(NV,promote)]@index``: for logs and scenario traces."""
        parts = []
        for p in self.peers:
            tags = [] if p.is_voter else ["NV"]
            tags += ["promote"] if p.promote else []
            tags += ["replace"] if p.replace else []
            parts.append(p.uuid + (f"({','.join(tags)})" if tags else ""))
        return f"[{' '.join(parts)}]@{self.opid_index}"


def config_to_dict(config: RaftConfig) -> dict[str, Any]:
    """The JSON-ready form of a config (layout documented in ``nyala.consensus.metadata``)."""
    return {
        "opid_index": config.opid_index,
        "peers": [
            {
                "uuid": p.uuid,
                "address": p.address,
                "member_type": p.member_type.value,
                "attrs": {"promote": p.promote, "replace": p.replace},
            }
            for p in config.peers
        ],
    }


def config_from_dict(data: Any) -> RaftConfig:
    """Parses ``config_to_dict`` output; a malformed config is a ``CorruptionError``."""
    try:
        peers = tuple(
            RaftPeer(
                uuid=str(p["uuid"]),
                address=str(p["address"]),
                member_type=MemberType(p["member_type"]),
                promote=bool(p["attrs"]["promote"]),
                replace=bool(p["attrs"]["replace"]),
            )
            for p in data["peers"]
        )
        index = data["opid_index"]
        if not isinstance(index, int):
            raise TypeError(f"opid_index is {index!r}")
        return RaftConfig(peers=peers, opid_index=index)
    except (KeyError, TypeError, ValueError, InvalidArgumentError) as e:
        raise CorruptionError(f"malformed Raft config: {e!r}") from None


def encode_config(config: RaftConfig) -> bytes:
    """The payload of a CONFIG_CHANGE log entry."""
    return json.dumps(config_to_dict(config), sort_keys=True, separators=(",", ":")).encode()


def decode_config(payload: bytes) -> RaftConfig:
    """Parses a CONFIG_CHANGE payload; damage is a ``CorruptionError``."""
    try:
        data = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptionError(f"CONFIG_CHANGE payload is not JSON: {e}") from None
    return config_from_dict(data)
