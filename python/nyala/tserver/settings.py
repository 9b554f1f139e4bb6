"""Settings of a tablet server (DESIGN.md §8): one frozen dataclass, units in the names."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from nyala.rpc.settings import MIB, RpcSettings


@dataclass(frozen=True)
class TabletServerSettings:
    """Everything a tablet server can be told at start; flags map 1:1 onto these fields."""

    fs_root: Path
    rpc_bind: str = "127.0.0.1:7050"
    http_bind: str = "127.0.0.1:8050"
    # Master RPC addresses; empty until the master exists (issue 9).
    masters: tuple[str, ...] = field(default_factory=tuple)
    # Expected server UUID; refuse a root formatted for another one. Empty: take the root's.
    uuid: str = ""

    # Raft (Kudu's defaults).
    heartbeat_interval_ms: int = 500
    leader_failure_max_missed_heartbeat_periods: int = 3
    election_timeout_jitter_pct: int = 25
    election_backoff_max_ms: int = 20_000
    consensus_batch_bytes_max: int = 1 * MIB
    follower_unavailable_considered_failed_s: int = 300

    # WAL and storage.
    wal_segment_bytes: int = 8 * MIB
    wal_sync: bool = True
    # Closed WAL segments kept whatever the anchors say (retention), and how often GC runs.
    wal_min_segments_to_retain: int = 1
    wal_gc_interval_ms: int = 10_000
    # Each replica's MemRowSet is flushed at least this often, bounding WAL replay at restart
    # (size-triggered flushes happen in the storage engine on their own).
    flush_interval_ms: int = 60_000

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

    # RPC.
    rpc_message_bytes_max: int = 50 * MIB
    rpc_client_timeout_ms: int = 10_000
    rpc_admin_timeout_ms: int = 30_000
    # How long running RPCs may finish after SIGTERM before they are cancelled.
    shutdown_grace_ms: int = 5_000

    def __post_init__(self) -> None:
        for name in (
            "heartbeat_interval_ms",
            "leader_failure_max_missed_heartbeat_periods",
            "consensus_batch_bytes_max",
            "wal_segment_bytes",
            "tablet_copy_chunk_bytes",
            "master_heartbeat_interval_ms",
            "scanner_ttl_ms",
            "flush_interval_ms",
            "tablet_copy_session_idle_timeout_ms",
            "tablet_copy_concurrency_max",
            "tablet_copy_parallel_files_max",
            "wal_gc_interval_ms",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.tablet_copy_rate_bytes_per_s < 0 or self.wal_min_segments_to_retain < 0:
            raise ValueError("tablet_copy_rate_bytes_per_s and wal_min_segments_to_retain >= 0")
        if not 0 <= self.election_timeout_jitter_pct < 100:
            raise ValueError("election_timeout_jitter_pct must be in [0, 100)")
        if self.tablet_copy_chunk_bytes > self.rpc_message_bytes_max // 2:
            raise ValueError("tablet_copy_chunk_bytes must leave room in rpc_message_bytes_max")
        if self.shutdown_grace_ms < 0:
            raise ValueError("shutdown_grace_ms must not be negative")
        self.rpc_settings()  # validates the RPC limits

    @property
    def election_timeout_ms(self) -> int:
        """The base election timeout, before jitter and back-off."""
        return self.heartbeat_interval_ms * self.leader_failure_max_missed_heartbeat_periods

    def rpc_settings(self) -> RpcSettings:
        """The RPC layer's view of these settings."""
        return RpcSettings(
            message_bytes_max=self.rpc_message_bytes_max,
            client_timeout_ms=self.rpc_client_timeout_ms,
            admin_timeout_ms=self.rpc_admin_timeout_ms,
        )
