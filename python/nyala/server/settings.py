"""The settings every server process shares (DESIGN.md §8): tablet servers and masters both host
tablet replicas (a master hosts the sys catalog), so both take the same addresses, Raft, WAL and
RPC settings. ``TabletServerSettings`` and ``MasterSettings`` extend this class with their own
fields and their own default ports.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from nyala.rpc.settings import MIB, RpcSettings
from nyala.security.files import load_server_tls


@dataclass(frozen=True)
class ServerSettings:
    """Addresses, Raft, WAL and RPC settings of one server; flags map 1:1 onto the fields."""

    fs_root: Path
    rpc_bind: str = "127.0.0.1:7050"
    http_bind: str = "127.0.0.1:8050"
    # Every master's RPC address (for a master: this one's included; empty means alone).
    masters: tuple[str, ...] = field(default_factory=tuple)
    # Expected server UUID; refuse a root formatted for another one. Empty: take the root's.
    uuid: str = ""

    # Security (docs/security.md): the directory of this server's TLS material (the cluster
    # CA's certificate, its own certificate, a master's CA key, a new tablet server's join
    # credential). Empty: plaintext and no authentication, refused on a non-loopback address
    # unless `insecure` says so.
    security_dir: str = ""
    # A file whose content is the passphrase that encrypts the CA key at rest (masters; empty:
    # the key is kept unencrypted, readable by the server's user only).
    ca_key_passphrase_file: str = ""
    # Serve without TLS and authentication on a non-loopback address (never the default).
    insecure: bool = False
    # How long a new server (a tablet server, or a master without the CA key) keeps asking
    # unreachable masters to sign its certificate with its join credential before it gives up.
    enroll_timeout_ms: int = 60_000

    # Raft (Kudu's defaults).
    heartbeat_interval_ms: int = 500
    leader_failure_max_missed_heartbeat_periods: int = 3
    election_timeout_jitter_pct: int = 25
    election_backoff_max_ms: int = 20_000
    consensus_batch_bytes_max: int = 1 * MIB
    # An AppendEntries batch not answered for this long is taken as lost and sent again. Lost
    # requests the transport sees (a broken stream, a refusal) are sent again without waiting
    # this out, so it only bounds silent losses; shorter, it would resend batches that are
    # merely slow behind a busy follower or a stalled event loop, adding the load that made
    # them slow (Kudu's consensus_rpc_timeout_ms is 30 s).
    consensus_rpc_timeout_ms: int = 5_000
    # A follower that has not answered its leader for this long is FAILED in the leader's
    # health report; on a master, a replica whose tserver has not heartbeated this long is
    # replaced (re-replication). One name on both, as in Kudu: give them the same value.
    follower_unavailable_considered_failed_sec: int = 300
    # Quiescence: a leader whose followers have everything stops heartbeating after this many
    # idle heartbeat rounds, and liveness travels in one server heartbeat per pair of servers
    # (0: never; docs/consensus.md). Tablet servers quiesce by default; a master's one tablet
    # gains nothing from it.
    raft_quiesce_after_idle_heartbeats: int = 0

    # WAL.
    wal_segment_bytes: int = 8 * MIB
    wal_sync: bool = True
    # Closed WAL segments kept whatever the anchors say (retention).
    wal_min_segments_to_retain: int = 1
    # How often WAL GC runs (it removes closed segments below every replica's anchors).
    wal_gc_interval_ms: int = 10_000

    # Storage: a replica's MemRowSet is flushed once it holds this much (Kudu's
    # --flush_threshold_mb). Tablet servers also flush under memory pressure.
    flush_threshold_mb: int = 1024
    # Each replica's MemRowSet is flushed at least this often, bounding WAL replay at restart
    # and letting WAL GC move on (size-triggered flushes happen in the storage engine).
    flush_interval_ms: int = 60_000
    # After the periodic flush, a replica with at least this many rowsets has some of them
    # merged (every one when the newer add up to the oldest; docs/storage-format.md,
    # "Which rowsets"), which also drops row history older than tablet_history_max_age_s among
    # them. 0: never.
    compaction_rowsets_min: int = 8

    # Hybrid time and row history (docs/consistency.md): row versions are kept this long
    # for snapshot reads (Kudu's --tablet_history_max_age_sec); a timestamp from a client or
    # a snapshot read further ahead of this server's clock than max_clock_error_us is refused
    # (Kudu's --max_clock_sync_error_usec).
    tablet_history_max_age_s: int = 15 * 60
    max_clock_error_us: int = 10_000_000

    # Tombstoned and deleted replicas: their WAL, superblock and cmeta are kept under
    # <fs_root>/quarantine for this long (seed 000, "Tablet deletion"), or until the fs root's
    # disk has less than quarantine_disk_free_bytes_min free (oldest first).
    quarantine_retention_s: int = 7 * 24 * 3600
    quarantine_disk_free_bytes_min: int = 1024 * MIB

    # Tablet copy (a master copies its sys catalog to a new master with it).
    tablet_copy_chunk_bytes: int = 4 * MIB
    tablet_copy_session_idle_timeout_ms: int = 600_000
    # Copies onto this server at once; StartTabletCopy beyond it is THROTTLED.
    tablet_copy_concurrency_max: int = 4
    # Files fetched at once within one copy.
    tablet_copy_parallel_files_max: int = 4
    # Chunks requested and not yet written within one copy (over its files).
    tablet_copy_chunks_in_flight_max: int = 4
    # Threads of the copy I/O pool (chunk reads as a source, checks and writes as a target).
    tablet_copy_io_threads_max: int = 4
    # Download rate of one copy; 0 is unlimited.
    tablet_copy_rate_bytes_per_s: int = 0
    # Serve and fetch copies' files over the data channel (docs/tablet-copy.md) rather than
    # FetchData RPCs; a server with TLS never serves it (the channel is not encrypted).
    tablet_copy_data_channel: bool = True
    # Its port on the RPC host; 0 takes any free port (targets learn it per session).
    tablet_copy_data_channel_port: int = 0
    # Bytes asked for per request on the data channel: small enough that a chunk received is
    # still in the CPU's cache when it is checked and written (docs/tablet-copy.md measures
    # 64 KiB to 4 MiB); FetchData RPCs keep tablet_copy_chunk_bytes, their per-call cost wants
    # large chunks.
    tablet_copy_data_channel_chunk_bytes: int = 512 * 1024
    # Tests only: as a source, send this many chunks with a flipped byte (after the CRC).
    tablet_copy_inject_corrupt_chunks: int = 0

    # RPC.
    rpc_message_bytes_max: int = 50 * MIB
    rpc_client_timeout_ms: int = 10_000
    rpc_admin_timeout_ms: int = 30_000
    # How long running RPCs may finish after SIGTERM before they are cancelled.
    shutdown_grace_ms: int = 5_000
    # Serve peers' consensus batches on a plain TCP port (mutual TLS on a secure server) as
    # well as ConsensusPeerStream, and send to peers over theirs (docs/consensus.md, "The
    # peer channel").
    consensus_peer_channel: bool = True
    # Its port on the RPC host; 0 takes any free port (peers ask for it).
    consensus_peer_channel_port: int = 0
    # The port announced to peers, when they must reach the channel through something in
    # front of it (the chaos suite's proxies); 0 announces the port bound.
    consensus_peer_channel_advertised_port: int = 0

    #: Fields that must be positive; a subclass adds its own in ``POSITIVE_FIELDS``.
    _COMMON_POSITIVE: ClassVar[tuple[str, ...]] = (
        "heartbeat_interval_ms",
        "leader_failure_max_missed_heartbeat_periods",
        "consensus_batch_bytes_max",
        "consensus_rpc_timeout_ms",
        "wal_segment_bytes",
        "follower_unavailable_considered_failed_sec",
        "flush_threshold_mb",
        "flush_interval_ms",
        "tablet_history_max_age_s",
        "max_clock_error_us",
        "wal_gc_interval_ms",
        "enroll_timeout_ms",
        "quarantine_retention_s",
        "tablet_copy_chunk_bytes",
        "tablet_copy_data_channel_chunk_bytes",
        "tablet_copy_session_idle_timeout_ms",
        "tablet_copy_concurrency_max",
        "tablet_copy_parallel_files_max",
        "tablet_copy_chunks_in_flight_max",
        "tablet_copy_io_threads_max",
    )
    POSITIVE_FIELDS: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        for name in (*self._COMMON_POSITIVE, *self.POSITIVE_FIELDS):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.election_timeout_jitter_pct < 100:
            raise ValueError("election_timeout_jitter_pct must be in [0, 100)")
        if self.raft_quiesce_after_idle_heartbeats < 0 or self.compaction_rowsets_min < 0:
            raise ValueError(
                "raft_quiesce_after_idle_heartbeats and compaction_rowsets_min must be >= 0"
            )
        if self.shutdown_grace_ms < 0 or self.wal_min_segments_to_retain < 0:
            raise ValueError("shutdown_grace_ms and wal_min_segments_to_retain must be >= 0")
        if self.tablet_copy_rate_bytes_per_s < 0 or self.quarantine_disk_free_bytes_min < 0:
            raise ValueError(
                "tablet_copy_rate_bytes_per_s and quarantine_disk_free_bytes_min must be >= 0"
            )
        if self.tablet_copy_chunk_bytes > self.rpc_message_bytes_max // 2:
            raise ValueError("tablet_copy_chunk_bytes must leave room in rpc_message_bytes_max")
        for port in (
            "tablet_copy_data_channel_port",
            "consensus_peer_channel_port",
            "consensus_peer_channel_advertised_port",
        ):
            if not 0 <= getattr(self, port) <= 65535:
                raise ValueError(f"{port} must be 0 to 65535")
        if self.tablet_copy_data_channel_chunk_bytes > 64 * MIB:
            raise ValueError("tablet_copy_data_channel_chunk_bytes must be at most 64 MiB")
        # Validates the RPC limits (without reading the security directory: a new master fills it).
        RpcSettings(
            self.rpc_message_bytes_max, self.rpc_client_timeout_ms, self.rpc_admin_timeout_ms
        )
        self._check_secure_if_reachable()

    def _check_secure_if_reachable(self) -> None:
        """A server others can reach must be secure unless told ``insecure`` (docs/security.md)."""
        if self.security_dir or self.insecure:
            return
        for name in ("rpc_bind", "http_bind"):
            host = getattr(self, name).rpartition(":")[0].strip("[]")
            if not _is_loopback(host):
                raise ValueError(
                    f"{name} {getattr(self, name)} is not a loopback address: give "
                    "--security-dir (docs/security.md), or --insecure to serve it unprotected"
                )

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
            tls=load_server_tls(Path(self.security_dir)) if self.security_dir else None,
        )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
