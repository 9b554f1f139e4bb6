"""Settings of a master (DESIGN.md §8): one frozen dataclass, units in the names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nyala.server.settings import ServerSettings


@dataclass(frozen=True)
class MasterSettings(ServerSettings):
    """Everything a master can be told at start; flags map 1:1 onto these fields. The Raft,
    WAL and RPC settings (``ServerSettings``) are those of the sys catalog's replica."""

    rpc_bind: str = "127.0.0.1:7051"
    http_bind: str = "127.0.0.1:8051"

    # A tablet server not heard from for this long is not live (placement skips it).
    tserver_unresponsive_timeout_ms: int = 60_000
    # A master this young may not have heard from every tserver yet: CreateTable waits up to
    # this long after the process started for enough of them (a restarted master that wins an
    # election at once must not refuse a replication factor the cluster can serve: KUDU-1358).
    tserver_registration_wait_ms: int = 5_000
    # A tablet whose replicas reported no leader this long after creation is replaced, unless
    # a majority of them run on live servers (they are electing: replacing them would only add
    # load, KUDU-2992-like storms on a busy cluster).
    tablet_creation_timeout_ms: int = 30_000
    # Timed-out tablets replaced in one background pass at most; the rest wait for the next.
    tablet_replacements_per_pass_max: int = 10
    # How often the leader's background tasks look for work (creates, alters, deletes).
    background_task_interval_ms: int = 500
    # 3-4-3: add the replacement before evicting a bad voter; False: the old 3-2-3 order.
    prepare_replacement_before_eviction: bool = True
    # Evict healthy voters beyond a table's replication factor (Kudu's flag of this name).
    # False keeps them: an operator's add-replica of a VOTER stays, and lowering the
    # replication factor removes nothing.
    catalog_manager_evict_excess_replicas: bool = True
    # How long after sending an RPC for one tablet the background tasks send it again.
    background_rpc_retry_ms: int = 2_000
    # A sys-catalog write not committed within this long fails; the master then steps down.
    catalog_write_timeout_ms: int = 30_000
    # How long a client may cache table locations.
    table_locations_ttl_ms: int = 60_000
    # Secure clusters: how long an authz token (a caller's privileges on one table, for the
    # tablet servers) is valid: a REVOKE takes effect within this long. Locations are then
    # cached for at most half of it, so a client renews its token with them.
    authz_token_validity_ms: int = 300_000
    # Secure clusters: how long one token-signing key signs authz tokens before the next one
    # takes over (Kudu's tsk_rotation_seconds: 1 day). The next key is published half of this
    # ahead; a key is kept one token lifetime after its turn, until its tokens expired.
    tsk_rotation_ms: int = 86_400_000
    # How long a new master waits for its peers to answer before forming the sys catalog.
    master_discovery_timeout_ms: int = 120_000

    POSITIVE_FIELDS: ClassVar[tuple[str, ...]] = (
        "tserver_unresponsive_timeout_ms",
        "tserver_registration_wait_ms",
        "tablet_creation_timeout_ms",
        "tablet_replacements_per_pass_max",
        "background_task_interval_ms",
        "background_rpc_retry_ms",
        "catalog_write_timeout_ms",
        "table_locations_ttl_ms",
        "authz_token_validity_ms",
        "tsk_rotation_ms",
        "master_discovery_timeout_ms",
    )

    @property
    def master_addrs(self) -> tuple[str, ...]:
        """Every master's address; a master started without ``--masters`` is alone."""
        return self.masters or (self.rpc_bind,)
