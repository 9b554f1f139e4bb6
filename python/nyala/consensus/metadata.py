"""Consensus metadata (cmeta): the current term, the vote, and the committed config of a replica.

The Raft core writes cmeta through a ``CmetaStore`` before it sends any message that depends on
a new term or vote (Raft's "persist before answering"). This module owns the state and its
encoding, and an in-memory store for the simulation; the file store that makes it durable is
the runtime's (``nyala.consensus.runtime.cmeta_store``).

Payload layout (UTF-8 JSON object, keys sorted)::

    {
      "format": 1,
      "current_term": <int >= 0>,
      "voted_for": <peer uuid string, or null>,
      "committed_config": {
        "opid_index": <int; -1 for the bootstrap config>,
        "peers": [
          {"uuid": <str>, "address": <"host:port">,
           "member_type": "VOTER" | "NON_VOTER",
           "attrs": {"promote": <bool>, "replace": <bool>}},
          ...
        ]
      }
    }

An unknown ``format`` is ``NotSupportedError``; anything malformed is ``CorruptionError``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from nyala.consensus.types import RaftConfig, config_from_dict, config_to_dict
from nyala.errors import CorruptionError, NotFoundError, NotSupportedError

CMETA_FORMAT = 1


@dataclass(frozen=True, slots=True)
class ConsensusMetadata:
    """The persistent Raft state of one replica."""

    current_term: int
    voted_for: str | None  # the vote cast in ``current_term``, if any
    committed_config: RaftConfig

    def __post_init__(self) -> None:
        assert self.current_term >= 0


def encode_cmeta(meta: ConsensusMetadata) -> bytes:
    """The cmeta payload (layout in the module docstring)."""
    doc: dict[str, Any] = {
        "format": CMETA_FORMAT,
        "current_term": meta.current_term,
        "voted_for": meta.voted_for,
        "committed_config": config_to_dict(meta.committed_config),
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def decode_cmeta(payload: bytes, *, name: str = "<cmeta>") -> ConsensusMetadata:
    """Parses an ``encode_cmeta`` payload."""
    try:
        doc = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptionError(f"{name}: cmeta payload is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise CorruptionError(f"{name}: cmeta payload is not an object")
    if doc.get("format") != CMETA_FORMAT:
        raise NotSupportedError(f"{name}: cmeta format {doc.get('format')!r} is not supported")
    term = doc.get("current_term")
    voted_for = doc.get("voted_for")
    if not isinstance(term, int) or isinstance(term, bool) or term < 0:
        raise CorruptionError(f"{name}: bad current_term {term!r}")
    if voted_for is not None and not isinstance(voted_for, str):
        raise CorruptionError(f"{name}: bad voted_for {voted_for!r}")
    config = config_from_dict(doc.get("committed_config"))
    return ConsensusMetadata(current_term=term, voted_for=voted_for, committed_config=config)


class CmetaStore(Protocol):
    """Where a replica's cmeta lives. ``save`` returns only once the state is durable."""

    def load(self) -> ConsensusMetadata:
        """The last saved state; ``NotFoundError`` if none was ever saved."""
        ...

    def save(self, meta: ConsensusMetadata) -> None:
        """Replaces the state durably."""
        ...


class MemoryCmetaStore:
    """Cmeta held in memory, surviving simulated crashes (the simulation's "disk")."""

    def __init__(self, meta: ConsensusMetadata | None = None) -> None:
        self._payload = None if meta is None else encode_cmeta(meta)
        self.saves = 0  # how many times the state was written

    def load(self) -> ConsensusMetadata:
        """The last saved state, through the same encoding as the file store."""
        if self._payload is None:
            raise NotFoundError("no consensus metadata saved")
        return decode_cmeta(self._payload)

    def save(self, meta: ConsensusMetadata) -> None:
        """Keeps the encoded state."""
        self._payload = encode_cmeta(meta)
        self.saves += 1
