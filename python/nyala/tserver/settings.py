"""Settings of a tablet server (DESIGN.md §8): one frozen dataclass, units in the names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nyala.server.settings import ServerSettings


@dataclass(frozen=True)
class TabletServerSettings(ServerSettings):
    """Everything a tablet server can be told at start; flags map 1:1 onto these fields."""

    # Raft: idle tablets quiesce (see ServerSettings).
    raft_quiesce_after_idle_heartbeats: int = 2

    # Storage. Memory pressure: when all replicas' MemRowSets together hold more than this, the
    # largest are flushed until they fit (Kudu flushes the biggest MemRowSet first under
    # memory pressure too). Checked every memory_pressure_check_interval_ms.
    memrowsets_memory_limit_mb: int = 1024
    memory_pressure_check_interval_ms: int = 500
    # The server's memory limit (MemRowSets, log caches, scanners and the rest of the
    # process's resident memory; nyala.tserver.memory):
    # 0 means 80 % of the machine's memory, as in Kudu. Above memory_pressure_percentage of
    # it MemRowSets are flushed, largest first; above memory_limit_soft_percentage writes
    # are refused with the retriable SERVICE_UNAVAILABLE until flushes make room.
    memory_limit_bytes: int = 0
    memory_pressure_percentage: int = 60
    memory_limit_soft_percentage: int = 80

    # Master heartbeats.
    master_heartbeat_interval_ms: int = 1_000

    # Scanners: an idle scanner (and what its cursor pins) is dropped after scanner_ttl_ms; a
    # scan page's batch holds at most scan_batch_bytes_max bytes whatever the client asks for.
    scanner_ttl_ms: int = 60_000
    scan_batch_bytes_max: int = 8 * 1024 * 1024

    # Key blocks: an INSERT, UPDATE or DELETE that a rowset's bloom filter cannot answer reads
    # the one block of 4,096 rows that may hold the key; decoded blocks are cached up to this
    # much, least recently used going first (Kudu's block cache plays this part), and at most
    # a quarter of the memory pressure threshold (``MemoryTracker.key_block_cache_bytes``).
    key_block_cache_mb: int = 256

    POSITIVE_FIELDS: ClassVar[tuple[str, ...]] = (
        "key_block_cache_mb",
        "master_heartbeat_interval_ms",
        "scanner_ttl_ms",
        "scan_batch_bytes_max",
        "memrowsets_memory_limit_mb",
        "memory_pressure_check_interval_ms",
        "memory_pressure_percentage",
        "memory_limit_soft_percentage",
    )
