"""The nyala client (DESIGN.md §9): connect to a cluster, manage tables, write and scan.

``nyala.connect(masters)`` returns a ``Client``; ``client.table(name)`` a ``Table`` whose
writes are routed per tablet in Rust and retried exactly-once, and whose scans stream Arrow
record batches and survive leader changes. Nothing here imports the server packages' runtime
(asyncio servers, consensus); the client talks to servers only through their RPCs.
"""

from __future__ import annotations

from nyala.client.client import Admin, Client, connect
from nyala.client.scanner import Scanner
from nyala.client.session import Session, SessionError
from nyala.client.table import Table
from nyala.client.write import RowError, RowOutcome, WriteResult

__all__ = [
    "Admin",
    "Client",
    "RowError",
    "RowOutcome",
    "Scanner",
    "Session",
    "SessionError",
    "Table",
    "WriteResult",
    "connect",
]
