"""Settings of a master (DESIGN.md §8): one frozen dataclass, units in the names."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from nyala.rpc.settings import MIB, RpcSettings


@dataclass(frozen=True)
class MasterSettings:
    """Everything a master can be told at start; flags map 1:1 onto these fields."""

    fs_root: Path
    rpc_bind: str = "127.0.0.1:7051"
    http_bind: str = "127.0.0.1:8051"
    # Every master's RPC address, this one's included; empty: a single master (this one).
    masters: tuple[str, ...] = field(default_factory=tuple)
    # Expected server UUID; refuse a root formatted for another one. Empty: take the root's.
    uuid: str = ""

    # Raft of the sys catalog (Kudu's defaults).
    heartbeat_interval_ms: int = 500
    leader_failure_max_missed_heartbeat_periods: int = 3
    election_timeout_jitter_pct: int = 25
    election_backoff_max_ms: int = 20_000
    consensus_batch_bytes_max: int = 1 * MIB
    wal_segment_bytes: int = 8 * MIB
    wal_sync: bool = True

    # A tablet server not heard from for this long is not live (placement skips it).
    tserver_unresponsive_timeout_ms: int = 60_000
    # A master this young may not have heard from every tserver yet: CreateTable waits up to
    # this long after the process started for enough of them (a restarted master that wins an
    # election at once must not refuse a replication factor the cluster can serve: KUDU-1358).
    tserver_registration_wait_ms: int = 5_000
    # A tablet whose replicas reported no leader this long after creation is replaced.
    tablet_creation_timeout_ms: int = 30_000
    # How often the leader's background tasks look for work (creates, alters, deletes).
    background_task_interval_ms: int = 500
    # A replica whose tserver has not heartbeated this long is replaced (re-replication).
    follower_unavailable_considered_failed_sec: int = 300
    # 3-4-3: add the replacement before evicting a bad voter; False: the old 3-2-3 order.
    prepare_replacement_before_eviction: bool = True
    # How long after sending an RPC for one tablet the background tasks send it again.
    background_rpc_retry_ms: int = 2_000
    # A sys-catalog write not committed within this long fails; the master then steps down.
    catalog_write_timeout_ms: int = 30_000
    # How long a client may cache table locations.
    table_locations_ttl_ms: int = 60_000
    # How long a new master waits for its peers to answer before forming the sys catalog.
    master_discovery_timeout_ms: int = 120_000

    # RPC.
    rpc_message_bytes_max: int = 50 * MIB
    rpc_client_timeout_ms: int = 10_000
    rpc_admin_timeout_ms: int = 30_000
    shutdown_grace_ms: int = 5_000

    def __post_init__(self) -> None:
        for name in (
            "heartbeat_interval_ms",
            "leader_failure_max_missed_heartbeat_periods",
            "consensus_batch_bytes_max",
            "wal_segment_bytes",
            "tserver_unresponsive_timeout_ms",
            "tserver_registration_wait_ms",
            "tablet_creation_timeout_ms",
            "follower_unavailable_considered_failed_sec",
            "background_task_interval_ms",
            "background_rpc_retry_ms",
            "catalog_write_timeout_ms",
            "table_locations_ttl_ms",
            "master_discovery_timeout_ms",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.election_timeout_jitter_pct < 100:
            raise ValueError("election_timeout_jitter_pct must be in [0, 100)")
        if self.shutdown_grace_ms < 0:
            raise ValueError("shutdown_grace_ms must not be negative")
        self.rpc_settings()

    @property
    def master_addrs(self) -> tuple[str, ...]:
        """Every master's address; a master started without ``--masters`` is alone."""
        return self.masters or (self.rpc_bind,)

    def rpc_settings(self) -> RpcSettings:
        """The RPC layer's view of these settings."""
        return RpcSettings(
            message_bytes_max=self.rpc_message_bytes_max,
            client_timeout_ms=self.rpc_client_timeout_ms,
            admin_timeout_ms=self.rpc_admin_timeout_ms,
        )
