"""Open scanners of one tablet server: a scan's remaining batches, by scanner id, until they are
read, closed, or left idle longer than the scanner TTL (DESIGN.md §5).

A scan reads one consistent result at its snapshot (the ReadIndex it was served at); a client
that stops after ``batches_max`` batches continues with the scanner id and gets the rest of the
same result. Idle scanners are dropped lazily whenever the registry is used, so no background
task is needed; a continue after expiry is ``SCANNER_EXPIRED``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa

from nyala.errors import ScannerExpiredError, ThrottledError

#: Open scanners per server; more are refused (THROTTLED) rather than growing memory.
SCANNERS_MAX = 1024


@dataclass
class Scanner:
    """One open scan: the batches not yet sent."""

    scanner_id: str
    tablet_id: str
    snapshot_index: int
    batches: list[pa.RecordBatch]
    next_batch: int = 0
    last_access_s: float = field(default_factory=time.monotonic)

    @property
    def done(self) -> bool:
        """True once every batch was sent."""
        return self.next_batch >= len(self.batches)


class ScannerRegistry:
    """The open scanners of a server, with TTL-based expiry."""

    def __init__(self, ttl_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_ms / 1000
        self._clock = clock
        self._scanners: dict[str, Scanner] = {}

    def open(self, tablet_id: str, snapshot_index: int, batches: list[pa.RecordBatch]) -> Scanner:
        """Registers a new scanner over ``batches``."""
        self._expire()
        if len(self._scanners) >= SCANNERS_MAX:
            raise ThrottledError(f"{len(self._scanners)} scanners are open; try again later")
        scanner = Scanner(uuid.uuid4().hex, tablet_id, snapshot_index, batches)
        scanner.last_access_s = self._clock()
        self._scanners[scanner.scanner_id] = scanner
        return scanner

    def get(self, scanner_id: str) -> Scanner:
        """The open scanner ``scanner_id``; ``ScannerExpiredError`` if unknown or expired."""
        self._expire()
        scanner = self._scanners.get(scanner_id)
        if scanner is None:
            raise ScannerExpiredError(f"scanner {scanner_id} is not open (expired or unknown)")
        scanner.last_access_s = self._clock()
        return scanner

    def close(self, scanner_id: str) -> None:
        """Forgets a scanner (no-op if it is gone)."""
        self._scanners.pop(scanner_id, None)

    def __len__(self) -> int:
        return len(self._scanners)

    def _expire(self) -> None:
        now = self._clock()
        for scanner_id in [
            s.scanner_id for s in self._scanners.values() if now - s.last_access_s > self._ttl_s
        ]:
            del self._scanners[scanner_id]
