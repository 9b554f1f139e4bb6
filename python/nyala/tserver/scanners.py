"""Open scanners of one tablet server: a native cursor per scan, by scanner id, until the scan
is read to the end, closed, or left idle longer than the scanner TTL (DESIGN.md §5; Kudu's
``tserver/scanners.h``).

A scanner holds a storage cursor (``nyala.storage.ScanCursor``) over the consistent view the
scan was opened on, never its result: each page is produced when asked for, in Rust with the
GIL released, off the event loop. A client that stops after ``batches_max`` batches continues
with the scanner id and gets the rest of the same view. Idle scanners are dropped whenever the
registry is used and by the server's periodic ``expire`` (so a client that walks away frees
what its cursor pins); a continue after expiry is ``SCANNER_EXPIRED``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from nyala.errors import ScannerExpiredError, ThrottledError
from nyala.tablet.replica import PageCursor

#: Open scanners per server; more are refused (THROTTLED) rather than growing memory.
SCANNERS_MAX = 1024


@dataclass
class Scanner:
    """One open scan: its cursor and the size of its pages."""

    scanner_id: str
    tablet_id: str
    snapshot_index: int
    cursor: PageCursor
    #: Bytes of one page's batch at most (the request's size, capped by the server's
    #: ``scan_batch_bytes_max``; fixed for the scanner's life).
    batch_bytes_max: int
    last_access_s: float = field(default_factory=time.monotonic)
    #: The hybrid timestamp a snapshot scan reads at (0 for a latest read).
    snapshot_timestamp: int = 0


class ScannerRegistry:
    """The open scanners of a server, with TTL-based expiry."""

    def __init__(self, ttl_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_ms / 1000
        self._clock = clock
        self._scanners: dict[str, Scanner] = {}

    def open(
        self,
        tablet_id: str,
        snapshot_index: int,
        cursor: PageCursor,
        batch_bytes_max: int,
        snapshot_timestamp: int = 0,
    ) -> Scanner:
        """Registers a new scanner over ``cursor``; ``ThrottledError`` (and the cursor closed)
        if ``SCANNERS_MAX`` are open."""
        self.expire()
        if len(self._scanners) >= SCANNERS_MAX:
            cursor.close()
            raise ThrottledError(f"{len(self._scanners)} scanners are open; try again later")
        scanner = Scanner(
            uuid.uuid4().hex,
            tablet_id,
            snapshot_index,
            cursor,
            batch_bytes_max,
            snapshot_timestamp=snapshot_timestamp,
        )
        scanner.last_access_s = self._clock()
        self._scanners[scanner.scanner_id] = scanner
        return scanner

    def get(self, scanner_id: str) -> Scanner:
        """The open scanner ``scanner_id``; ``ScannerExpiredError`` if unknown or expired."""
        self.expire()
        scanner = self._scanners.get(scanner_id)
        if scanner is None:
            raise ScannerExpiredError(f"scanner {scanner_id} is not open (expired or unknown)")
        scanner.last_access_s = self._clock()
        return scanner

    def touch(self, scanner: Scanner) -> None:
        """Marks ``scanner`` as used now (while a page is produced, it is not idle)."""
        scanner.last_access_s = self._clock()

    def close(self, scanner_id: str) -> None:
        """Forgets a scanner (no-op if it is gone). Its cursor lets go of what it pins when
        the last reference goes (a page being produced keeps it until that page is done)."""
        self._scanners.pop(scanner_id, None)

    def __len__(self) -> int:
        return len(self._scanners)

    def expire(self) -> int:
        """Drops every scanner idle longer than the TTL; returns how many."""
        now = self._clock()
        idle = [
            s.scanner_id for s in self._scanners.values() if now - s.last_access_s > self._ttl_s
        ]
        for scanner_id in idle:
            del self._scanners[scanner_id]
        return len(idle)
