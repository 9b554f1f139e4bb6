"""Settings of a tablet server (DESIGN.md §8): one frozen dataclass, units in the names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nyala.rpc.settings import MIB
from nyala.server.settings import ServerSettings


@dataclass(frozen=True)
class TabletServerSettings(ServerSettings):
    """Everything a tablet server can be told at start; flags map 1:1 onto these fields."""

    # Raft: idle tablets quiesce (see ServerSettings).
    raft_quiesce_after_idle_heartbeats: int = 2

    # WAL and storage.
    # How often WAL GC runs.
    wal_gc_interval_ms: int = 10_000
    # Each replica's MemRowSet is flushed at least this often, bounding WAL replay at restart
    # (size-triggered flushes happen in the storage engine on their own).
    flush_interval_ms: int = 60_000
    # Memory pressure: when all replicas' MemRowSets together hold more than this, the
    # largest are flushed until they fit (Kudu flushes the biggest MemRowSet first under
    # memory pressure too). Checked every memory_pressure_check_interval_ms.
    memrowsets_memory_limit_mb: int = 1024
    memory_pressure_check_interval_ms: int = 500

    # Tablet copy.
    tablet_copy_chunk_bytes: int = 4 * MIB
    tablet_copy_session_idle_timeout_ms: int = 600_000
    # Copies onto this server at once; StartTabletCopy beyond it is THROTTLED.
    tablet_copy_concurrency_max: int = 4
    # Files fetched at once within one copy.
    tablet_copy_parallel_files_max: int = 4
    # Download rate of one copy; 0 is unlimited.
    tablet_copy_rate_bytes_per_s: int = 0
    # Tests only: as a source, send this many chunks with a flipped byte (after the CRC).
    tablet_copy_inject_corrupt_chunks: int = 0

    # Master heartbeats.
    master_heartbeat_interval_ms: int = 1_000

    # Scanners.
    scanner_ttl_ms: int = 60_000

    POSITIVE_FIELDS: ClassVar[tuple[str, ...]] = (
        "tablet_copy_chunk_bytes",
        "master_heartbeat_interval_ms",
        "scanner_ttl_ms",
        "flush_interval_ms",
        "memrowsets_memory_limit_mb",
        "memory_pressure_check_interval_ms",
        "tablet_copy_session_idle_timeout_ms",
        "tablet_copy_concurrency_max",
        "tablet_copy_parallel_files_max",
        "wal_gc_interval_ms",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tablet_copy_rate_bytes_per_s < 0:
            raise ValueError("tablet_copy_rate_bytes_per_s must not be negative")
        if self.tablet_copy_chunk_bytes > self.rpc_message_bytes_max // 2:
            raise ValueError("tablet_copy_chunk_bytes must leave room in rpc_message_bytes_max")
