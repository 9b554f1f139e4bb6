"""``nyala.connect(masters)`` and the ``Client``: DDL, table handles, sessions, cluster listings.

A client owns one channel per server, the meta cache, a thread pool for parallel tablet
writes, and one client id for exactly-once writes. It is thread-safe; close it (or use ``with``)
to release the channels.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from cryptography.hazmat.primitives.asymmetric import ec

from nyala import errors
from nyala._proto import consensus_pb2, master_pb2, metadata_pb2
from nyala.client.admin import ReplicaAdminMixin
from nyala.client.masters import MasterConnection, parse_masters
from nyala.client.meta_cache import MetaCache, TableInfo, TabletLocation
from nyala.client.rpc import ChannelPool, ObservedTimestamp, StubMethod
from nyala.client.session import Session
from nyala.client.table import Table
from nyala.client.write import Writer, WriteResult
from nyala.partition import (
    PartitioningSpec,
    PartitionSchema,
    range_bounds_pb,
    range_spec_to_pb,
)
from nyala.rowops import OpType, PreparedRows, prepare_op_batch
from nyala.rpc.errors import join_host_port, split_host_port
from nyala.rpc.messages import Addressable, Answer
from nyala.rpc.schema_pb import column_to_pb, schema_to_pb
from nyala.rpc.settings import RpcSettings
from nyala.schema import Column, Schema, default_to_json
from nyala.security.files import credentials_from_env, load_client_tls
from nyala.security.identity import Identity, Kind
from nyala.security.tokens import Privilege

#: Client RPC deadline and admin (DDL) deadline, in milliseconds (DESIGN.md §8).
CLIENT_TIMEOUT_MS = 10_000
ADMIN_TIMEOUT_MS = 30_000
#: Threads sending tablet writes in parallel.
WRITE_THREADS = 16
_DDL_POLL_S = 0.1

_Req = TypeVar("_Req", bound=Addressable)
_Resp = TypeVar("_Resp", bound=Answer)


def connect(
    masters: str | Sequence[str],
    *,
    timeout_ms: int = CLIENT_TIMEOUT_MS,
    admin_timeout_ms: int = ADMIN_TIMEOUT_MS,
    unreachable_fail_ms: int | None = None,
    credentials: str | os.PathLike[str] | None = None,
    write_channel: bool = True,
) -> Client:
    """A client of the cluster whose masters are ``masters`` (``"h1:p,h2:p"`` or a list).
    Finds the leader master now, so a wrong address fails here with a clear error.
    ``unreachable_fail_ms``: give up (``NetworkError``, with each master's own error) once no
    master could be reached at all for this long, instead of retrying until ``timeout_ms``.
    ``credentials``: the directory of this client's certificate for a secure cluster
    (``ca.pem``, ``client.pem``, ``client.key``; default ``$NYALA_CREDENTIALS``, else none:
    plaintext, which a secure cluster refuses).
    ``write_channel``: send writes on the tablet servers' peer channels where they serve them
    (TLS with this client's certificate on a secure cluster), which costs a fraction of a gRPC
    call; False sends them over gRPC (``nyala.client.write_pipe``)."""
    client = Client(
        masters,
        timeout_ms=timeout_ms,
        admin_timeout_ms=admin_timeout_ms,
        unreachable_fail_ms=unreachable_fail_ms,
        credentials=credentials,
        write_channel=write_channel,
    )
    try:
        client._masters.discover(time.monotonic() + timeout_ms / 1000)
    except BaseException:
        client.close()
        raise
    return client


class Client:
    """A connection to one nyala cluster. Create with ``nyala.connect``."""

    def __init__(
        self,
        masters: str | Sequence[str],
        *,
        timeout_ms: int = CLIENT_TIMEOUT_MS,
        admin_timeout_ms: int = ADMIN_TIMEOUT_MS,
        unreachable_fail_ms: int | None = None,
        credentials: str | os.PathLike[str] | None = None,
        write_channel: bool = True,
    ) -> None:
        self.master_addrs = parse_masters(masters)
        self.timeout_ms = timeout_ms
        self.admin_timeout_ms = admin_timeout_ms
        directory = Path(credentials) if credentials is not None else credentials_from_env()
        tls = load_client_tls(directory) if directory is not None else None
        self._pool = ChannelPool(RpcSettings(tls=tls))
        self._masters = MasterConnection(
            self.master_addrs,
            self._pool,
            timeout_ms=timeout_ms,
            unreachable_fail_ms=unreachable_fail_ms,
        )
        self._cache = MetaCache(self._masters)
        self._executor = ThreadPoolExecutor(WRITE_THREADS, thread_name_prefix="nyala-write")
        self._observed = ObservedTimestamp()
        self._writer = Writer(
            self._cache,
            self._pool,
            self._executor,
            timeout_ms=timeout_ms,
            observed=self._observed,
            channel=write_channel,
        )
        self.admin = Admin(self)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Releases threads and channels."""
        self._executor.shutdown(wait=True)
        self._writer.close()
        self._pool.close()

    @property
    def client_id(self) -> str:
        """The id every write of this client carries (exactly-once)."""
        return self._writer.requests.client_id

    def latest_observed_timestamp(self) -> int:
        """The latest hybrid timestamp this client has seen in a write or scan response (0
        before any): a snapshot scan at it sees every write this client made before. Convert
        with ``nyala.timestamp_to_datetime``."""
        return self._observed.latest

    # --- DDL ----------------------------------------------------------------------------------

    def create_table(
        self,
        name: str,
        schema: Schema,
        *,
        partitioning: PartitioningSpec = None,
        replicas: int = 3,
        wait: bool = True,
    ) -> Table:
        """Creates a table and (with ``wait``) waits until every tablet has a leader."""
        partition_schema, _ = PartitionSchema.from_spec(partitioning, schema)
        bounds, splits = range_spec_to_pb(schema, partition_schema, partitioning)
        request = master_pb2.CreateTableRequestPB(
            name=name,
            schema=schema_to_pb(schema),
            partition_schema=partition_schema.to_pb(),
            range_bounds=bounds,
            split_rows=splits,
            num_replicas=replicas,
            request_id=uuid.uuid4().hex,
        )
        self._master_call(lambda s: s.master.CreateTable, request, admin=True)
        if wait:
            self._wait_done("IsCreateTableDone", name, self._create_done)
        return self.table(name)

    def table(self, name: str) -> Table:
        """A handle on table ``name`` (``NotFoundError`` if it does not exist)."""
        return Table(self, self._cache.table(name, refresh=True))

    def alter_table(
        self,
        name: str,
        *,
        add_columns: Sequence[Column] = (),
        drop_columns: Sequence[str] = (),
        rename_columns: Mapping[str, str] | None = None,
        new_name: str | None = None,
        add_range_partition: tuple[Any, Any] | None = None,
        drop_range_partition: tuple[Any, Any] | None = None,
        wait: bool = True,
    ) -> Table:
        """Changes the table's columns, name and/or range partitions in one all-or-nothing
        step. An added column must be nullable or have a default (Kudu's rule); rows already
        written read as its default (or null).

        ``add_range_partition=(lo, hi)`` adds the range ``lo <= key < hi`` of the table's
        range columns (a value, or a tuple of values when there are several; None:
        unbounded) in every hash bucket; it must overlap no existing range.
        ``drop_range_partition=(lo, hi)`` drops exactly an existing range: its tablets and
        their rows are deleted, and later writes to it fail row by row (no tablet covers
        them)."""
        request = master_pb2.AlterTableRequestPB(
            table=master_pb2.TableIdentifierPB(table_name=name),
            new_table_name=new_name or "",
            request_id=uuid.uuid4().hex,
        )
        for column in add_columns:
            request.steps.add().add_column.column.CopyFrom(column_to_pb(column))
        for dropped in drop_columns:
            request.steps.add().drop_column.name = dropped
        for old, new in (rename_columns or {}).items():
            step = request.steps.add()
            step.rename_column.old_name = old
            step.rename_column.new_name = new
        if add_range_partition is not None or drop_range_partition is not None:
            current = self.table(name)
            if add_range_partition is not None:
                bounds = range_bounds_pb(
                    current.schema, current.partition_schema, add_range_partition
                )
                request.steps.add().add_range_partition.bounds.CopyFrom(bounds)
            if drop_range_partition is not None:
                bounds = range_bounds_pb(
                    current.schema, current.partition_schema, drop_range_partition
                )
                request.steps.add().drop_range_partition.bounds.CopyFrom(bounds)
        if not request.steps and not new_name:
            raise errors.InvalidArgumentError("alter_table needs at least one change")
        self._master_call(lambda s: s.master.AlterTable, request, admin=True)
        self._cache.forget_table(name)
        final = new_name or name
        if wait:
            self._wait_done("IsAlterTableDone", final, self._alter_done)
            if add_range_partition is not None:
                # The new range's tablets take writes once each has a leader.
                self._wait_done("IsCreateTableDone", final, self._create_done)
        return self.table(final)

    def delete_table(self, name: str) -> None:
        """Deletes the table and its data."""
        request = master_pb2.DeleteTableRequestPB(
            table=master_pb2.TableIdentifierPB(table_name=name), request_id=uuid.uuid4().hex
        )
        self._master_call(lambda s: s.master.DeleteTable, request, admin=True)
        self._cache.forget_table(name)

    def grant(self, table: str, user: str, privileges: str) -> str:
        """GRANT ``privileges`` (``"select,insert"``; SELECT, INSERT, UPDATE, DELETE, ALTER,
        DROP, ALL) on ``table`` to ``user`` (a secure cluster; by the table's owner or an
        admin); returns the user's privileges now. Tablet servers see the change within one
        authz token lifetime (``authz_token_validity_ms``)."""
        return self._set_privileges(table, user, privileges, revoke=False)

    def revoke(self, table: str, user: str, privileges: str) -> str:
        """REVOKE ``privileges`` on ``table`` from ``user``; as ``grant``."""
        return self._set_privileges(table, user, privileges, revoke=True)

    def _set_privileges(self, table: str, user: str, privileges: str, *, revoke: bool) -> str:
        try:
            mask = Privilege.parse(privileges)
        except ValueError as exc:
            raise errors.InvalidArgumentError(str(exc)) from None
        request = master_pb2.SetTablePrivilegesRequestPB(
            table=master_pb2.TableIdentifierPB(table_name=table),
            user=user,
            privileges=int(mask),
            revoke=revoke,
        )
        response = self._master_call(lambda s: s.master.SetTablePrivileges, request, admin=True)
        return Privilege(response.privileges).describe()

    def add_user(
        self, name: str, out: str | os.PathLike[str], *, admin: bool = False, days: int = 0
    ) -> Path:
        """Adds a user (or an admin) to a secure cluster (as an admin) and writes its
        credentials directory ``out`` (``ca.pem``, ``client.pem``, ``client.key`` 0600) for
        ``nyala.connect(credentials=out)``: a key made here, its certificate signed by the
        masters' CA for ``days`` (0: 30). ``AlreadyPresentError`` if the user exists."""
        from nyala.security import pki

        identity = Identity(Kind.ADMIN if admin else Kind.USER, name)
        _refuse_to_overwrite(Path(out))
        key = pki.new_key()
        request = master_pb2.AddUserRequestPB(
            name=name, admin=admin, csr_pem=pki.make_identity_csr(key, identity), validity_days=days
        )
        response = self._master_call(lambda s: s.master.AddUser, request, admin=True)
        return _write_credentials(Path(out), key, response.cert_pem, response.ca_cert_pem)

    def issue_session_credentials(
        self, out: str | os.PathLike[str], *, validity_s: int = 0
    ) -> dict[str, Any]:
        """Short-lived credentials for this client's own user (Kudu's authentication token, as
        a certificate: docs/security.md "Session credentials"), written to ``out`` as a
        credentials directory: give them to a process that should not hold the long-lived key
        (Spark executors, a batch job). ``validity_s`` 0: 24 hours; at most 7 days, never past
        this client's own certificate. ``nyala user remove`` revokes them too. Returns the
        directory and the end (``expires_unix_ms``)."""
        from nyala.security import pki

        _refuse_to_overwrite(Path(out))
        key = pki.new_key()
        identity = self._own_identity()
        request = master_pb2.IssueSessionCredentialsRequestPB(
            csr_pem=pki.make_identity_csr(key, identity), validity_s=validity_s
        )
        response = self._master_call(
            lambda s: s.master.IssueSessionCredentials, request, admin=True
        )
        directory = _write_credentials(Path(out), key, response.cert_pem, response.ca_cert_pem)
        return {"credentials": str(directory), "expires_unix_ms": response.expires_unix_ms}

    def _own_identity(self) -> Identity:
        """The identity this client's certificate names (``NotAuthenticatedError`` without)."""
        from cryptography import x509

        from nyala.security import pki

        tls = self._pool.settings.tls
        if tls is None or not tls.cert_pem:
            raise errors.NotAuthenticatedError("this client has no credentials")
        return pki.identity_of(x509.load_pem_x509_certificate(tls.cert_pem))

    def remove_user(self, name: str) -> None:
        """Removes a user of a secure cluster (as an admin): every certificate of that name
        valid from before now is refused, by the masters at once and by the tablet servers
        from their next heartbeat. Also for names whose certificates came from
        ``nyala cert issue``."""
        request = master_pb2.RemoveUserRequestPB(name=name)
        self._master_call(lambda s: s.master.RemoveUser, request, admin=True)

    def revoke_join_credential(self, name: str) -> None:
        """Revokes the join credentials called ``name`` (as an admin; ``nyala cert
        join-credential`` names one after its directory): every one valid from before now is
        refused from now on, so no new server enrolls with it. Servers that enrolled with it
        keep their certificates."""
        request = master_pb2.RemoveUserRequestPB(name=name, join=True)
        self._master_call(lambda s: s.master.RemoveUser, request, admin=True)

    def list_users(self) -> list[dict[str, Any]]:
        """Users added or removed, and join credentials revoked, by name: name, kind
        (``user``, ``admin`` or ``join``), admin, removed, added and removed times."""
        response = self._master_call(
            lambda s: s.master.ListUsers, master_pb2.ListUsersRequestPB(), admin=True
        )
        return [
            {
                "name": u.name,
                "kind": "join" if u.join else "admin" if u.admin else "user",
                "admin": u.admin,
                "removed": u.removed,
                "added_unix_ms": u.added_unix_ms,
                "removed_unix_ms": u.removed_unix_ms,
            }
            for u in response.users
        ]

    def list_tables(self, name_filter: str = "") -> list[dict[str, Any]]:
        """Live tables, sorted by name: id, name, tablets, replicas, state, schema version."""
        request = master_pb2.ListTablesRequestPB(name_filter=name_filter)
        response = self._master_call(lambda s: s.master.ListTables, request)
        return [
            {
                "name": t.name,
                "id": t.id,
                "tablets": t.num_tablets,
                "replicas": t.num_replicas,
                "state": master_pb2.SysTableState.Name(t.state).removeprefix("SYS_TABLE_"),
                "schema_version": t.schema_version,
            }
            for t in response.tables
        ]

    def table_statistics(self, name: str) -> dict[str, Any]:
        """The table's size from its tablet leaders' latest reports (no scan; up to one
        tserver heartbeat old): ``rows`` (an estimate until compaction) and ``on_disk_bytes``
        in total and per tablet; a tablet whose leader has not reported yet counts as 0 with
        ``reported`` False."""
        request = master_pb2.GetTableStatisticsRequestPB(
            table=master_pb2.TableIdentifierPB(table_name=name)
        )
        response = self._master_call(lambda s: s.master.GetTableStatistics, request)
        return {
            "table": name,
            "rows": response.live_row_count,
            "on_disk_bytes": response.on_disk_bytes,
            "tablets": [
                {
                    "tablet_id": t.tablet_id,
                    "reported": t.reported,
                    "rows": t.stats.live_row_count,
                    "on_disk_bytes": t.stats.on_disk_bytes,
                }
                for t in response.tablets
            ],
        }

    def describe_table(self, name: str) -> dict[str, Any]:
        """Schema, partitioning and tablets of a table, as plain data."""
        table = self.table(name)
        return {
            "name": table.name,
            "id": table.id,
            "schema_version": table.schema.version,
            "replicas": table.num_replicas,
            "key": table.schema.key,
            "columns": [
                {
                    "name": c.name,
                    "type": c.type,
                    "nullable": c.nullable,
                    "default": default_to_json(c.type, c.default),
                    "id": c.id,
                }
                for c in table.schema.columns
            ],
            "partitioning": table.partition_schema.describe(),
            "tablets": [
                tablet_summary(t, table.partition_schema, table.schema) for t in table.tablets()
            ],
        }

    # --- cluster listings ---------------------------------------------------------------------

    def list_tablet_servers(self) -> list[dict[str, Any]]:
        """Every tablet server the leader master knows, with liveness and replica count:
        ``state`` is LIVE, UNRESPONSIVE (a heartbeat is overdue) or DEAD, and ``live`` is
        whether it is LIVE."""
        response = self._master_call(
            lambda s: s.master.ListTabletServers, master_pb2.ListTabletServersRequestPB()
        )
        return [
            {
                "uuid": s.ts_info.permanent_uuid,
                "rpc_addr": join_host_port(s.ts_info.rpc_addr.host, s.ts_info.rpc_addr.port),
                "state": s.state or ("LIVE" if s.live else "DEAD"),
                "live": s.state == "LIVE" if s.state else s.live,
                "replicas": s.num_replicas,
                "seconds_since_heartbeat": round(s.millis_since_heartbeat / 1000, 1),
            }
            for s in response.servers
        ]

    def list_masters(self) -> list[dict[str, Any]]:
        """The masters of the cluster and their roles."""
        response = self._master_call(
            lambda s: s.master.ListMasters, master_pb2.ListMastersRequestPB()
        )
        return [
            {
                "uuid": m.permanent_uuid,
                "rpc_addr": join_host_port(m.rpc_addr.host, m.rpc_addr.port),
                "role": master_pb2.RaftRole.Name(m.role).removeprefix("ROLE_"),
                "member_type": metadata_pb2.MemberType.Name(m.member_type),
            }
            for m in response.masters
        ]

    # --- sessions -----------------------------------------------------------------------------

    def session(self, *, flush: str = "manual", **options: Any) -> Session:
        """A write session (``flush="manual"`` or ``"background"``); see ``Session`` for its
        limits (``buffer_bytes_max``, ``session_error_rows_max``, ...) and
        ``ignore_extra_columns``."""
        return Session(self._session_batch, self._session_write, flush=flush, **options)

    def _session_batch(
        self, name: str, data: Any, op: OpType, ignore_extra_columns: bool
    ) -> tuple[TableInfo, PreparedRows]:
        info = self._cache.table(name)
        prepared = prepare_op_batch(
            data, op, info.schema, ignore_extra_columns=ignore_extra_columns
        )
        return info, prepared

    def _session_write(self, info: TableInfo, prepared: PreparedRows) -> WriteResult:
        return self._writer.write(info, prepared)

    # --- plumbing -----------------------------------------------------------------------------

    def _master_call(
        self, method: StubMethod[_Req, _Resp], request: _Req, *, admin: bool = False
    ) -> _Resp:
        timeout = self.admin_timeout_ms if admin else self.timeout_ms
        return self._masters.call(method, request, timeout_ms=timeout)

    def _wait_done(
        self, method: str, name: str, done: Callable[[master_pb2.TableIdentifierPB], bool]
    ) -> None:
        """Asks ``done`` (``method`` of the master) about table ``name`` until it says so."""
        deadline = time.monotonic() + self.admin_timeout_ms / 1000
        while True:
            if done(master_pb2.TableIdentifierPB(table_name=name)):
                return
            if time.monotonic() > deadline:
                raise errors.TimedOutError(f"{method} of {name!r} not done within the deadline")
            time.sleep(_DDL_POLL_S)

    def _create_done(self, table: master_pb2.TableIdentifierPB) -> bool:
        request = master_pb2.IsCreateTableDoneRequestPB(table=table)
        return self._master_call(lambda s: s.master.IsCreateTableDone, request, admin=True).done

    def _alter_done(self, table: master_pb2.TableIdentifierPB) -> bool:
        request = master_pb2.IsAlterTableDoneRequestPB(table=table)
        return self._master_call(lambda s: s.master.IsAlterTableDone, request, admin=True).done


class Admin(ReplicaAdminMixin):
    """Operator actions on tablets (``client.admin``); replica operations come from
    ``nyala.client.admin``."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def list_tablets(self, table: str | None = None) -> list[dict[str, Any]]:
        """Tablets of one table or of every table, with their replicas and leader, as the
        leader master knows them now (not from this client's location cache)."""
        names = [table] if table else [t["name"] for t in self._client.list_tables()]
        out = []
        for name in names:
            handle = self._client.table(name)
            self._client._cache.invalidate(handle.id)
            for tablet in handle.tablets():
                summary = tablet_summary(tablet, handle.partition_schema, handle.schema)
                out.append({"table": name, **summary})
        return out

    def leader_step_down(
        self, tablet_id: str, *, new_leader: str | None = None, abrupt: bool = False
    ) -> None:
        """Asks the tablet's leader to step down (gracefully to ``new_leader`` if given)."""
        if abrupt and new_leader:
            raise errors.InvalidArgumentError("--new-leader is only for a graceful step-down")
        tablet = self._find(tablet_id)
        leader = tablet.leader
        if leader is None:
            raise errors.ServiceUnavailableError(f"tablet {tablet_id} has no known leader")
        request = consensus_pb2.LeaderStepDownRequestPB(
            dest_uuid=leader.uuid,
            tablet_id=tablet_id,
            mode=consensus_pb2.ABRUPT if abrupt else consensus_pb2.GRACEFUL,
            new_leader_uuid=new_leader or "",
        )
        stubs = self._client._pool.get(leader.addr)
        stubs.call(stubs.consensus.LeaderStepDown, request, self._client.admin_timeout_ms)

    def change_config(
        self,
        tablet_id: str,
        change: str,
        ts_uuid: str,
        *,
        replica_type: str | None = None,
        cas_config_opid_index: int | None = None,
    ) -> dict[str, Any]:
        """Raft ChangeConfig sent straight to the tablet's leader (Kudu's ``tablet
        change_config``): ``change`` is ADD_PEER, REMOVE_PEER or MODIFY_PEER of the replica on
        ``ts_uuid``. With ``cas_config_opid_index`` it applies only if the committed config's
        op index still equals it (``CasFailedError`` otherwise). Returns the new (pending)
        config. The master is not asked: it may undo the change to keep the replication
        factor (see ``catalog_manager_evict_excess_replicas``)."""
        kinds = {
            "ADD_PEER": consensus_pb2.ADD_PEER,
            "REMOVE_PEER": consensus_pb2.REMOVE_PEER,
            "MODIFY_PEER": consensus_pb2.MODIFY_PEER,
        }
        kind = kinds.get(change.upper())
        if kind is None:
            raise errors.InvalidArgumentError(f"change must be one of {sorted(kinds)}: {change!r}")
        tablet = self._find(tablet_id)
        leader = tablet.leader
        if leader is None:
            raise errors.ServiceUnavailableError(f"tablet {tablet_id} has no known leader")
        server = metadata_pb2.RaftPeerPB(permanent_uuid=ts_uuid)
        if replica_type is not None:
            from nyala.client.admin import member_type

            server.member_type = member_type(replica_type)
        if kind == consensus_pb2.ADD_PEER:
            servers = {s["uuid"]: s for s in self._client.list_tablet_servers()}
            if ts_uuid not in servers:
                raise errors.NotFoundError(f"no tablet server {ts_uuid}")
            host, port = split_host_port(servers[ts_uuid]["rpc_addr"])
            server.last_known_addr.host, server.last_known_addr.port = host, port
        request = consensus_pb2.ChangeConfigRequestPB(
            dest_uuid=leader.uuid, tablet_id=tablet_id, type=kind, server=server
        )
        if cas_config_opid_index is not None:
            request.cas_config_opid_index = cas_config_opid_index
        stubs = self._client._pool.get(leader.addr)
        answer = stubs.call(stubs.consensus.ChangeConfig, request, self._client.admin_timeout_ms)
        return config_summary(answer.new_config)

    def _find(self, tablet_id: str) -> TabletLocation:
        for entry in self._client.list_tables():
            handle = self._client.table(entry["name"])
            self._client._cache.invalidate(handle.id)  # the leader as the master knows it now
            for tablet in handle.tablets():
                if tablet.tablet_id == tablet_id:
                    return tablet
        raise errors.NotFoundError(f"no tablet {tablet_id}")


def config_summary(config: metadata_pb2.RaftConfigPB) -> dict[str, Any]:
    """A Raft config as plain data: its op index and each peer's uuid and member type."""
    return {
        "opid_index": config.opid_index if config.HasField("opid_index") else None,
        "peers": [
            {"uuid": p.permanent_uuid, "member_type": metadata_pb2.MemberType.Name(p.member_type)}
            for p in config.peers
        ],
    }


def tablet_summary(
    tablet: TabletLocation, partition_schema: PartitionSchema, schema: Schema
) -> dict[str, Any]:
    """A tablet as plain data (for ``describe`` and the CLI); range bounds as values."""
    return {
        "tablet_id": tablet.tablet_id,
        "partition": tablet.partition.describe(partition_schema, schema),
        "leader": tablet.leader_uuid,
        "replicas": [
            {"uuid": r.uuid, "addr": r.addr, "role": r.role, "member_type": r.member_type}
            for r in tablet.replicas
        ],
    }


__all__ = ["ADMIN_TIMEOUT_MS", "CLIENT_TIMEOUT_MS", "Admin", "Client", "connect"]


def _refuse_to_overwrite(directory: Path) -> None:
    """``AlreadyPresentError`` if ``directory`` holds credentials (someone's key would be lost)."""
    from nyala.security import files

    if (directory / files.CLIENT_KEY).exists() or (directory / files.CLIENT_CERT).exists():
        raise errors.AlreadyPresentError(
            f"{directory} already holds credentials: choose another directory"
        )


def _write_credentials(
    directory: Path, key: ec.EllipticCurvePrivateKey, cert_pem: bytes, ca_pem: bytes
) -> Path:
    """A credentials directory: ``client.key`` (0600), ``client.pem``, ``ca.pem``."""
    from nyala.security import files, pki

    files.write_private(directory / files.CLIENT_KEY, pki.key_pem(key))
    files.write_public(directory / files.CLIENT_CERT, cert_pem)
    files.write_public(directory / files.CA_CERT, ca_pem)
    return directory
