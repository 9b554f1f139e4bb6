"""The catalog manager: leadership of the catalog and the state its operations share.

Leadership. The in-memory catalog is valid only for the Raft term it was loaded in: each time
this master's sys-catalog replica becomes leader of a new term, ``run`` reloads every record
(at a ReadIndex point, so everything committed before is applied) before the master serves.
Until then clients get ``CATALOG_MANAGER_NOT_INITIALIZED`` (a ``ServiceUnavailableError``);
followers refuse with ``NotLeaderError`` carrying the leader hint.

Every mutation follows seed 002's contract: take the catalog lock; build new records as copies
(copy-on-write); replicate the whole logical operation as ONE sys-catalog batch; only when it
committed, commit the records in memory (tablets before their table); only then send RPCs to
tservers (the background tasks do, woken by ``wake``). A replication failure fails the
operation and discards the copies; since its outcome is unknown (the batch may still commit
under a later leader), the catalog of this term is no longer trusted: it is dropped, and the
master steps down if it still leads, so it reloads in a new term (KUDU-495: never a crash).

The operations on the catalog live beside this module and share its state through one
``CatalogManager``: ``ddl`` (CreateTable, AlterTable, DeleteTable, tablet replacement),
``tablet_reports`` (heartbeats and tablet reports), ``locations`` (schemas, locations, table
list), ``replica_admin`` and ``membership``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Iterable
from pathlib import Path

from nyala._proto import master_pb2, metadata_pb2
from nyala.consensus.core import ReplicaStatus
from nyala.consensus.types import Role
from nyala.errors import (
    IllegalStateError,
    InvalidArgumentError,
    NotLeaderError,
    NyalaError,
    ServiceUnavailableError,
)
from nyala.master.catalog import Catalog
from nyala.master.settings import MasterSettings
from nyala.master.sys_catalog import CatalogRecord, SysCatalog, user_key
from nyala.master.token_keys import TokenKeys
from nyala.master.ts_manager import TSManager
from nyala.rpc import split_host_port
from nyala.rpc.auth import Revocations
from nyala.security import pki
from nyala.security.pki import ClusterCa

log = logging.getLogger(__name__)

NOT_INITIALIZED = "CATALOG_MANAGER_NOT_INITIALIZED"
#: How often waiting operations look at leadership and registrations again, in seconds.
LEADER_POLL_S = 0.05
#: How often a follower master reads the revoked users again (when it applied something new).
FOLLOWER_REVOCATIONS_S = 1.0
_ROLES = {
    Role.LEADER: master_pb2.ROLE_LEADER,
    Role.FOLLOWER: master_pb2.ROLE_FOLLOWER,
    Role.CANDIDATE: master_pb2.ROLE_CANDIDATE,
    Role.LEARNER: master_pb2.ROLE_LEARNER,
    Role.NON_PARTICIPANT: master_pb2.ROLE_NON_PARTICIPANT,
}


def role_pb(role: Role) -> master_pb2.RaftRole.ValueType:
    """The ``RaftRole`` of a consensus role."""
    return _ROLES.get(role, master_pb2.ROLE_UNKNOWN)


class CatalogManager:
    """The leader master's catalog and the soft state of its term (module docstring)."""

    def __init__(
        self,
        uuid: str,
        sys_catalog: SysCatalog,
        ts_manager: TSManager,
        settings: MasterSettings,
        rng: random.Random | None = None,
        *,
        secure: bool = False,
        ca: ClusterCa | None = None,
        security_dir: Path | None = None,
        ca_passphrase: bytes | None = None,
    ) -> None:
        self.uuid = uuid
        self.sys_catalog = sys_catalog
        self.ts_manager = ts_manager
        self.settings = settings
        self.secure = secure  # a cluster CA: tokens, users and revocations (docs/security.md)
        # The cluster CA this master can sign with (None: insecure, or its ca.key is missing
        # and it has not yet taken the key from the sys catalog's record), where its files
        # live, and the operator's key file's content that encrypts the key at rest.
        self.ca = ca
        self.security_dir = security_dir
        self.ca_passphrase = ca_passphrase
        self.ca_record: master_pb2.SysCaEntryPB | None = None
        self.rng = rng or random.Random()  # placement's draws (seeded in tests)
        # Held by every operation that reads records to replace them (copy-on-write), from the
        # read to the in-memory commit, so two operations never replace the same record.
        self.lock = asyncio.Lock()
        self.catalog = Catalog()
        # The term the catalog was loaded in; None: not loaded (or no longer trusted).
        self._loaded_term: int | None = None
        self.wake = asyncio.Event()  # set when there is work for the background tasks
        # Soft state of the leader, rebuilt from (full) tablet reports after a failover:
        # tablet id -> tserver uuid -> its last ReportedTabletPB.
        self.reports: dict[str, dict[str, master_pb2.ReportedTabletPB]] = {}
        # (tserver uuid, tablet id) -> CAS op index (None: no CAS) of a tombstone to send.
        self.pending_deletes: dict[tuple[str, str], int | None] = {}
        # Tablet servers retired (RetireTabletServer): placement keeps new replicas off them.
        # Each is a sys-catalog record (loaded with the catalog), so a new leader honours it.
        self.retired_tservers: set[str] = set()
        # Secure clusters (docs/security.md): the token-signing keys and the users, both
        # sys-catalog records loaded with the catalog. ``users`` is keyed by ``user_key`` (a
        # join credential's record by ``join/<name>``). ``revocations`` is the RPC server's
        # list of revoked names: kept equal to the users' records on the leader, and read from
        # the applied records every ``FOLLOWER_REVOCATIONS_S`` on a follower.
        self.token_keys = TokenKeys(settings.tsk_rotation_ms, settings.authz_token_validity_ms)
        self.users: dict[str, master_pb2.SysUserEntryPB] = {}
        self.revocations = Revocations()
        self._follower_read_index: int | None = None
        self._follower_read_at = 0.0

    # --- leadership -------------------------------------------------------------------------

    def status(self) -> ReplicaStatus | None:
        """The sys-catalog replica's consensus status, while it runs."""
        runtime = self.sys_catalog.runtime
        return None if runtime is None else runtime.status()

    def is_ready_leader(self) -> bool:
        """Leader of the sys catalog with the catalog loaded in the current term."""
        status = self.status()
        return (
            status is not None and status.role is Role.LEADER and status.term == self._loaded_term
        )

    def require_leader(self) -> Catalog:
        """The catalog, if this master serves clients now; the refusal otherwise."""
        status = self.status()
        if status is None:
            raise ServiceUnavailableError(f"{NOT_INITIALIZED}: the sys catalog is not running")
        if status.role is not Role.LEADER:
            leader = status.leader_uuid
            peer = None if leader is None else status.committed_config.peer(leader)
            raise NotLeaderError(
                f"master {self.uuid} is not the leader ({status.role.value})",
                leader_uuid=leader,
                leader_addr=None if peer is None else peer.address,
            )
        if status.term != self._loaded_term:
            raise ServiceUnavailableError(
                f"{NOT_INITIALIZED}: the leader is loading the catalog of term {status.term}"
            )
        return self.catalog

    async def run(self) -> None:
        """Watches leadership, reloading the catalog on every new term; runs forever."""
        while True:
            status = self.status()
            if (
                status is not None
                and status.role is Role.LEADER
                and status.term != self._loaded_term
            ):
                await self._load(status.term)
            elif status is not None and status.role is not Role.LEADER and self.secure:
                self._follow_revocations()
            await asyncio.sleep(LEADER_POLL_S)

    def _follow_revocations(self) -> None:
        """On a follower: the revoked names from the user records this replica applied, read
        again when it applied something new and ``FOLLOWER_REVOCATIONS_S`` passed. A follower
        answers only ``ConnectToMaster``, ``ListMasters`` and the like, but a removed user is
        refused there too, within a second of the removal committing."""
        now = time.monotonic()
        if now - self._follower_read_at < FOLLOWER_REVOCATIONS_S:
            return
        self._follower_read_at = now
        replica = self.sys_catalog.replica
        applier = None if replica is None else replica.applier
        if applier is None or applier.applied_index == self._follower_read_index:
            return
        index = applier.applied_index
        try:
            users = self.sys_catalog.local_users()
        except NyalaError as exc:
            log.warning("reading the revoked users on a follower: %s", exc)
            return
        self.revocations.set(_revoked(users))
        self._follower_read_index = index

    async def _load(self, term: int) -> None:
        async with self.lock:
            try:
                contents = await self.sys_catalog.load()
            except NyalaError as exc:
                log.warning("catalog load in term %d failed: %s", term, exc)
                return
            status = self.status()
            if status is None or status.role is not Role.LEADER or status.term != term:
                return
            self.catalog = Catalog.from_records(contents.tables, contents.tablets)
            self.retired_tservers = {pb.ts_uuid for pb in contents.tservers if pb.retired}
            try:
                self.token_keys.load(contents.tsks)
            except NyalaError as exc:
                log.error("catalog load in term %d: %s", term, exc)
                return
            self.users = {user_key(pb): pb for pb in contents.users}
            self.revocations.set(self.revoked_users())
            self.ca_record = contents.cas[0] if contents.cas else None
            self._adopt_ca()
            self.reports.clear()
            self.pending_deletes.clear()
            self._loaded_term = term
        log.info(
            "master %s leads term %d: catalog loaded (%d tables, %d tablets)",
            self.uuid,
            term,
            len(contents.tables),
            len(contents.tablets),
        )
        self.wake.set()

    def _adopt_ca(self) -> None:
        """Checks this master's CA against the sys catalog's, or takes the CA's key from the
        record when this master has none (it lost its ca.key)."""
        record = self.ca_record
        if record is None or not self.secure:
            return
        if self.ca is not None:
            if pki.fingerprint(record.cert_pem) != pki.fingerprint(self.ca.cert_pem):
                log.error(
                    "this master's cluster CA (%s) is not the one in the sys catalog (%s): "
                    "certificates it signs are not trusted by the rest of the cluster",
                    pki.fingerprint(self.ca.cert_pem),
                    pki.fingerprint(record.cert_pem),
                )
            return
        if not record.encrypted_key_pem:
            log.error(
                "this master has no ca.key and the sys catalog holds no copy (the masters have "
                "no --ca-key-passphrase-file): copy ca.key from another master"
            )
            return
        try:
            ca = ClusterCa.from_pem(
                record.cert_pem,
                record.encrypted_key_pem,
                self.ca_passphrase,
                where="the sys catalog",
            )
        except InvalidArgumentError as exc:
            log.error("cannot take the CA's key from the sys catalog: %s", exc)
            return
        if self.security_dir is not None:
            ca.save(self.security_dir, self.ca_passphrase)
        self.ca = ca
        log.info("took the cluster CA's key from the sys catalog into %s", self.security_dir)

    def set_ca_record(self, record: master_pb2.SysCaEntryPB) -> None:
        """The CA record, once the sys catalog committed it."""
        self.ca_record = record

    def ca_record_due(self) -> master_pb2.SysCaEntryPB | None:
        """The CA record to store (None: stored already, or nothing to store)."""
        if not self.secure or self.ca is None or self.ca_record is not None:
            return None
        encrypted = self.ca.key_pem(self.ca_passphrase) if self.ca_passphrase else b""
        return master_pb2.SysCaEntryPB(cert_pem=self.ca.cert_pem, encrypted_key_pem=encrypted)

    def revoked_users(self) -> dict[str, int]:
        """Revoked name (``user_key``) -> Unix ms before which its certificates are refused."""
        return _revoked(self.users.values())

    async def replicate(self, records: list[CatalogRecord]) -> None:
        """Writes ``records`` as one batch; on failure drops the catalog (module docstring)."""
        try:
            await self.sys_catalog.write(records)
        except NyalaError:
            self._loaded_term = None
            runtime = self.sys_catalog.runtime
            if runtime is not None and runtime.role is Role.LEADER:
                with contextlib.suppress(NyalaError):
                    runtime.step_down()
            raise

    # --- masters ----------------------------------------------------------------------------

    def master_entries(self) -> list[master_pb2.MasterEntryPB]:
        """Every master of the sys catalog's config (active config while a change pends)."""
        status = self.status()
        config = None
        if status is not None:
            config = status.pending_config or status.committed_config
        else:
            with contextlib.suppress(NyalaError):
                config = self.sys_catalog.committed_config()
        if config is None:
            return []
        out = []
        for peer in config.peers:
            host, port = split_host_port(peer.address)
            entry = master_pb2.MasterEntryPB(
                permanent_uuid=peer.uuid,
                member_type=metadata_pb2.VOTER if peer.is_voter else metadata_pb2.NON_VOTER,
            )
            entry.rpc_addr.host, entry.rpc_addr.port = host, port
            if status is not None and peer.uuid == self.uuid:
                entry.role = role_pb(status.role)
            elif status is not None and peer.uuid == status.leader_uuid:
                entry.role = master_pb2.ROLE_LEADER
            else:
                entry.role = master_pb2.ROLE_FOLLOWER if peer.is_voter else master_pb2.ROLE_LEARNER
            out.append(entry)
        return out

    def require_sys_catalog_leader(self) -> ReplicaStatus:
        """The status, if this master leads the sys catalog (membership changes)."""
        self.require_leader()
        status = self.status()
        if status is None:
            raise IllegalStateError("the sys catalog stopped")
        return status


def _revoked(users: Iterable[master_pb2.SysUserEntryPB]) -> dict[str, int]:
    return {user_key(pb): pb.revoked_before_unix_ms for pb in users if pb.revoked_before_unix_ms}
