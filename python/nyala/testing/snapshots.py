"""A model of versioned rows for checking snapshot reads (issue 34, docs/consistency.md).

Writers record every acknowledged write of one key with its timestamp (``Table.upsert`` /
``delete`` of one row returns it as ``WriteResult.timestamp``); a key whose write came back
unknown is marked uncertain and left out of every comparison. ``state_at(T)`` is then what a
snapshot scan at T must return exactly, and ``diff(T1, T2)`` what a diff scan must.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Mapping
from typing import Any

#: The value a deletion leaves.
DELETED = None


class VersionModel:
    """Per key, its acknowledged versions in timestamp order. Thread-safe."""

    def __init__(self) -> None:
        self._versions: dict[Any, list[tuple[int, Any]]] = {}
        self._uncertain: set[Any] = set()
        self._lock = threading.Lock()

    def record(self, key: Any, timestamp: int, value: Any) -> None:
        """An acknowledged write of ``key`` at ``timestamp``: its row ``value`` (a mapping of
        the non-key columns), or ``DELETED``."""
        with self._lock:
            versions = self._versions.setdefault(key, [])
            if versions and timestamp <= versions[-1][0]:
                raise AssertionError(
                    f"key {key!r}: write at {timestamp} is not after its previous write at "
                    f"{versions[-1][0]} (timestamps must rise with the writes of one key)"
                )
            versions.append((timestamp, value))

    def uncertain(self, key: Any) -> None:
        """A write of ``key`` whose outcome is unknown: ``key`` is never compared."""
        with self._lock:
            self._uncertain.add(key)

    @property
    def timestamps(self) -> list[int]:
        """Every recorded timestamp, ascending."""
        with self._lock:
            return sorted(ts for vs in self._versions.values() for ts, _ in vs)

    def is_certain(self, key: Any) -> bool:
        return key not in self._uncertain

    def latest(self, key: Any) -> Any:
        """The last acknowledged value of ``key`` (``DELETED`` if none)."""
        with self._lock:
            versions = self._versions.get(key)
            return versions[-1][1] if versions else DELETED

    def state_at(self, timestamp: int) -> dict[Any, Any]:
        """Every certain key that exists at ``timestamp``, with its value then."""
        out = {}
        with self._lock:
            for key, versions in self._versions.items():
                if key in self._uncertain:
                    continue
                at = bisect.bisect_right(versions, timestamp, key=lambda v: v[0])
                if at and versions[at - 1][1] is not DELETED:
                    out[key] = versions[at - 1][1]
        return out

    def diff(self, start: int, end: int) -> dict[Any, Any]:
        """What a diff scan over (start, end] returns: per certain key whose state differs
        between the two snapshots, its value at ``end``, or ``DELETED``."""
        before, after = self.state_at(start), self.state_at(end)
        out: dict[Any, Any] = {}
        for key in before.keys() | after.keys():
            if before.get(key, DELETED) != after.get(key, DELETED):
                out[key] = after.get(key, DELETED)
        return out

    def comparable(self, rows: Iterable[Mapping[str, Any]], key: str) -> dict[Any, Any]:
        """Scanned rows as ``{key: {column: value}}``, certain keys only."""
        return {
            r[key]: {c: v for c, v in r.items() if c != key}
            for r in rows
            if r[key] not in self._uncertain
        }


__all__ = ["DELETED", "VersionModel"]
