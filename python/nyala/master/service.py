"""The master's RPC service: thin handlers over the catalog and its operations (master.proto)."""

from __future__ import annotations

import logging

from nyala._proto import master_pb2, master_pb2_grpc
from nyala.consensus.types import Role
from nyala.errors import (
    IllegalStateError,
    InvalidArgumentError,
    NotAuthorizedError,
    NotFoundError,
    NotSupportedError,
)
from nyala.master import membership, privileges, users
from nyala.master.catalog_manager import CatalogManager, role_pb
from nyala.master.ddl import TableDdl
from nyala.master.locations import Locations
from nyala.master.replica_admin import ReplicaAdmin
from nyala.master.tablet_reports import TabletReports
from nyala.rpc import Context, RpcMetrics, ServiceBase, join_host_port, unary
from nyala.rpc.auth import current_caller
from nyala.security.identity import Identity, Kind
from nyala.security.pki import ClusterCa
from nyala.security.tokens import Privilege

log = logging.getLogger(__name__)


class MasterService(ServiceBase, master_pb2_grpc.MasterServiceServicer):
    """Heartbeats, leader discovery, DDL, catalog reads and membership."""

    def __init__(
        self,
        server_uuid: str,
        metrics: RpcMetrics,
        manager: CatalogManager,
    ) -> None:
        super().__init__(server_uuid, metrics)
        self._m = manager
        self._ddl = TableDdl(manager)
        self._locations = Locations(manager)
        self._reports = TabletReports(manager)
        self._admin = ReplicaAdmin(manager)

    @unary(master_pb2.TSHeartbeatResponsePB, allow_empty_dest=True)
    async def TSHeartbeat(
        self,
        request: master_pb2.TSHeartbeatRequestPB,
        context: Context[master_pb2.TSHeartbeatRequestPB, master_pb2.TSHeartbeatResponsePB],
    ) -> master_pb2.TSHeartbeatResponsePB:
        if not request.ts_uuid:
            raise InvalidArgumentError("a heartbeat needs ts_uuid")
        return await self._reports.heartbeat(request)

    @unary(master_pb2.SignServerCertificateResponsePB, allow_empty_dest=True)
    async def SignServerCertificate(
        self,
        request: master_pb2.SignServerCertificateRequestPB,
        context: Context[
            master_pb2.SignServerCertificateRequestPB, master_pb2.SignServerCertificateResponsePB
        ],
    ) -> master_pb2.SignServerCertificateResponsePB:
        """Signs a server's CSR (Kudu's IPKI; a tablet server's, or a master's added later): the
        caller holds a join credential, or is that same server renewing its certificate."""
        ca = self._require_ca()
        caller = current_caller()
        renewing = caller == Identity(Kind.SERVER, request.server_uuid)
        if caller is None or (caller.kind is not Kind.JOIN and not renewing):
            raise NotAuthorizedError(
                f"{caller} may not enroll a server: it needs a join credential of this cluster"
            )
        Identity(Kind.SERVER, request.server_uuid)  # a well-formed UUID, else InvalidArgument
        cert = ca.sign_server_csr(request.csr_pem, request.server_uuid, request.hosts)
        # Which credential enrolled which server: what to look for when one leaked.
        log.info("signed the certificate of server %s for %s", request.server_uuid, caller)
        return master_pb2.SignServerCertificateResponsePB(cert_pem=cert, ca_cert_pem=ca.cert_pem)

    @unary(master_pb2.ConnectToMasterResponsePB, allow_empty_dest=True)
    async def ConnectToMaster(
        self,
        request: master_pb2.ConnectToMasterRequestPB,
        context: Context[master_pb2.ConnectToMasterRequestPB, master_pb2.ConnectToMasterResponsePB],
    ) -> master_pb2.ConnectToMasterResponsePB:
        response = master_pb2.ConnectToMasterResponsePB(master_uuid=self.server_uuid)
        response.masters.extend(self._m.master_entries())
        status = self._m.status()
        if status is not None:
            response.role = role_pb(status.role)
            response.term = status.term
            response.leader_uuid = status.leader_uuid or ""
            response.catalog_ready = status.role is Role.LEADER and self._m.is_ready_leader()
        return response

    @unary(master_pb2.CreateTableResponsePB)
    async def CreateTable(
        self,
        request: master_pb2.CreateTableRequestPB,
        context: Context[master_pb2.CreateTableRequestPB, master_pb2.CreateTableResponsePB],
    ) -> master_pb2.CreateTableResponsePB:
        table_id = await self._ddl.create_table(request)
        return master_pb2.CreateTableResponsePB(table_id=table_id)

    @unary(master_pb2.IsCreateTableDoneResponsePB)
    async def IsCreateTableDone(
        self,
        request: master_pb2.IsCreateTableDoneRequestPB,
        context: Context[
            master_pb2.IsCreateTableDoneRequestPB, master_pb2.IsCreateTableDoneResponsePB
        ],
    ) -> master_pb2.IsCreateTableDoneResponsePB:
        return master_pb2.IsCreateTableDoneResponsePB(done=self._ddl.is_create_done(request))

    @unary(master_pb2.AlterTableResponsePB)
    async def AlterTable(
        self,
        request: master_pb2.AlterTableRequestPB,
        context: Context[master_pb2.AlterTableRequestPB, master_pb2.AlterTableResponsePB],
    ) -> master_pb2.AlterTableResponsePB:
        self._require(request.table, Privilege.ALTER)
        table_id, version = await self._ddl.alter_table(request)
        return master_pb2.AlterTableResponsePB(table_id=table_id, schema_version=version)

    @unary(master_pb2.IsAlterTableDoneResponsePB)
    async def IsAlterTableDone(
        self,
        request: master_pb2.IsAlterTableDoneRequestPB,
        context: Context[
            master_pb2.IsAlterTableDoneRequestPB, master_pb2.IsAlterTableDoneResponsePB
        ],
    ) -> master_pb2.IsAlterTableDoneResponsePB:
        done, version = self._ddl.is_alter_done(request)
        return master_pb2.IsAlterTableDoneResponsePB(done=done, schema_version=version)

    @unary(master_pb2.DeleteTableResponsePB)
    async def DeleteTable(
        self,
        request: master_pb2.DeleteTableRequestPB,
        context: Context[master_pb2.DeleteTableRequestPB, master_pb2.DeleteTableResponsePB],
    ) -> master_pb2.DeleteTableResponsePB:
        self._require(request.table, Privilege.DROP)
        await self._ddl.delete_table(request)
        return master_pb2.DeleteTableResponsePB()

    @unary(master_pb2.GetTableSchemaResponsePB)
    async def GetTableSchema(
        self,
        request: master_pb2.GetTableSchemaRequestPB,
        context: Context[master_pb2.GetTableSchemaRequestPB, master_pb2.GetTableSchemaResponsePB],
    ) -> master_pb2.GetTableSchemaResponsePB:
        return self._locations.table_schema(request)

    @unary(master_pb2.GetTableLocationsResponsePB)
    async def GetTableLocations(
        self,
        request: master_pb2.GetTableLocationsRequestPB,
        context: Context[
            master_pb2.GetTableLocationsRequestPB, master_pb2.GetTableLocationsResponsePB
        ],
    ) -> master_pb2.GetTableLocationsResponsePB:
        response = self._locations.table_locations(request)
        if self._m.secure:
            table = self._m.require_leader().table(request.table).pb
            response.authz_token = privileges.authz_token(
                self._m.token_keys, table, current_caller()
            )
            response.ttl_ms = min(response.ttl_ms, self._m.token_keys.token_validity_ms // 2)
        return response

    @unary(master_pb2.SetTablePrivilegesResponsePB)
    async def SetTablePrivileges(
        self,
        request: master_pb2.SetTablePrivilegesRequestPB,
        context: Context[
            master_pb2.SetTablePrivilegesRequestPB, master_pb2.SetTablePrivilegesResponsePB
        ],
    ) -> master_pb2.SetTablePrivilegesResponsePB:
        """GRANT and REVOKE (``nyala table grant/revoke``)."""
        now = await privileges.set_privileges(self._m, request, current_caller())
        return master_pb2.SetTablePrivilegesResponsePB(privileges=int(now))

    @unary(master_pb2.AddUserResponsePB)
    async def AddUser(
        self,
        request: master_pb2.AddUserRequestPB,
        context: Context[master_pb2.AddUserRequestPB, master_pb2.AddUserResponsePB],
    ) -> master_pb2.AddUserResponsePB:
        """``nyala user add``: records the user and signs its certificate request."""
        ca = self._require_ca()
        cert = await users.add_user(self._m, ca, request)
        return master_pb2.AddUserResponsePB(cert_pem=cert, ca_cert_pem=ca.cert_pem)

    @unary(master_pb2.RemoveUserResponsePB)
    async def RemoveUser(
        self,
        request: master_pb2.RemoveUserRequestPB,
        context: Context[master_pb2.RemoveUserRequestPB, master_pb2.RemoveUserResponsePB],
    ) -> master_pb2.RemoveUserResponsePB:
        """``nyala user remove``: revokes the user's certificates (``nyala cert revoke-join``:
        a join credential's, with ``join``)."""
        self._require_ca()
        await users.remove_user(self._m, request.name, join=request.join)
        return master_pb2.RemoveUserResponsePB()

    @unary(master_pb2.ListUsersResponsePB)
    async def ListUsers(
        self,
        request: master_pb2.ListUsersRequestPB,
        context: Context[master_pb2.ListUsersRequestPB, master_pb2.ListUsersResponsePB],
    ) -> master_pb2.ListUsersResponsePB:
        """``nyala user list``."""
        self._require_ca()
        return master_pb2.ListUsersResponsePB(users=users.list_users(self._m))

    @unary(master_pb2.IssueSessionCredentialsResponsePB)
    async def IssueSessionCredentials(
        self,
        request: master_pb2.IssueSessionCredentialsRequestPB,
        context: Context[
            master_pb2.IssueSessionCredentialsRequestPB,
            master_pb2.IssueSessionCredentialsResponsePB,
        ],
    ) -> master_pb2.IssueSessionCredentialsResponsePB:
        """``nyala user session``: short-lived credentials for the caller itself."""
        ca = self._require_ca()
        cert, expires_ms = users.issue_session_credentials(
            self._m, ca, current_caller(), context.auth_context(), request
        )
        return master_pb2.IssueSessionCredentialsResponsePB(
            cert_pem=cert, ca_cert_pem=ca.cert_pem, expires_unix_ms=expires_ms
        )

    def _require_ca(self) -> ClusterCa:
        if not self._m.secure:
            raise NotSupportedError("this master is not secure: it has no cluster CA")
        if self._m.ca is None:
            raise IllegalStateError(
                f"master {self.server_uuid} has no ca.key: it takes the key from the sys "
                "catalog when it leads (with --ca-key-passphrase-file), or copy ca.key from "
                "another master"
            )
        return self._m.ca

    def _require(self, ident: master_pb2.TableIdentifierPB, needed: Privilege) -> None:
        """``NotAuthorizedError`` unless the caller holds ``needed`` on the table. A name that
        no live table has is left to the DDL layer: the retry of a request that renamed or
        deleted the table gets its first answer there (and takes no new effect), anything
        else ``NotFoundError``."""
        try:
            table = self._m.require_leader().table(ident).pb
        except NotFoundError:
            return
        privileges.require(table, current_caller(), needed)

    @unary(master_pb2.GetTableStatisticsResponsePB)
    async def GetTableStatistics(
        self,
        request: master_pb2.GetTableStatisticsRequestPB,
        context: Context[
            master_pb2.GetTableStatisticsRequestPB, master_pb2.GetTableStatisticsResponsePB
        ],
    ) -> master_pb2.GetTableStatisticsResponsePB:
        return self._locations.table_statistics(request)

    @unary(master_pb2.ListTablesResponsePB)
    async def ListTables(
        self,
        request: master_pb2.ListTablesRequestPB,
        context: Context[master_pb2.ListTablesRequestPB, master_pb2.ListTablesResponsePB],
    ) -> master_pb2.ListTablesResponsePB:
        response = master_pb2.ListTablesResponsePB()
        for table in self._locations.list_tables(request.name_filter):
            response.tables.add(
                id=table.table_id,
                name=table.name,
                num_tablets=len(table.live_tablets()),
                num_replicas=table.pb.num_replicas,
                state=table.pb.state,
                schema_version=table.pb.schema.version,
            )
        return response

    @unary(master_pb2.ListTabletServersResponsePB)
    async def ListTabletServers(
        self,
        request: master_pb2.ListTabletServersRequestPB,
        context: Context[
            master_pb2.ListTabletServersRequestPB, master_pb2.ListTabletServersResponsePB
        ],
    ) -> master_pb2.ListTabletServersResponsePB:
        counts = self._m.require_leader().replica_counts()
        response = master_pb2.ListTabletServersResponsePB()
        ts_manager = self._m.ts_manager
        for ts in ts_manager.all():
            response.servers.add(
                ts_info=ts.to_pb(),
                millis_since_heartbeat=ts.millis_since_heartbeat(),
                live=ts_manager.is_live(ts),
                num_replicas=counts.get(ts.uuid, 0),
                state=ts_manager.state(ts),
            )
        return response

    @unary(master_pb2.ListMastersResponsePB)
    async def ListMasters(
        self,
        request: master_pb2.ListMastersRequestPB,
        context: Context[master_pb2.ListMastersRequestPB, master_pb2.ListMastersResponsePB],
    ) -> master_pb2.ListMastersResponsePB:
        response = master_pb2.ListMastersResponsePB()
        response.masters.extend(self._m.master_entries())
        return response

    @unary(master_pb2.AddMasterResponsePB)
    async def AddMaster(
        self,
        request: master_pb2.AddMasterRequestPB,
        context: Context[master_pb2.AddMasterRequestPB, master_pb2.AddMasterResponsePB],
    ) -> master_pb2.AddMasterResponsePB:
        if not request.rpc_addr.host or not request.rpc_addr.port:
            raise InvalidArgumentError("AddMaster needs the new master's rpc_addr")
        addr = join_host_port(request.rpc_addr.host, request.rpc_addr.port)
        uuid = await membership.add_master(self._m, addr)
        return master_pb2.AddMasterResponsePB(master_uuid=uuid)

    @unary(master_pb2.RemoveMasterResponsePB)
    async def RemoveMaster(
        self,
        request: master_pb2.RemoveMasterRequestPB,
        context: Context[master_pb2.RemoveMasterRequestPB, master_pb2.RemoveMasterResponsePB],
    ) -> master_pb2.RemoveMasterResponsePB:
        addr = ""
        if request.rpc_addr.host:
            addr = join_host_port(request.rpc_addr.host, request.rpc_addr.port)
        if not request.master_uuid and not addr:
            raise InvalidArgumentError("RemoveMaster needs the master's uuid or rpc_addr")
        await membership.remove_master(self._m, request.master_uuid, addr)
        return master_pb2.RemoveMasterResponsePB()

    # --- replica management (nyala.master.replica_admin) --------------------------------------

    @unary(master_pb2.ReplicaAdminResponsePB)
    async def AddReplica(
        self,
        request: master_pb2.AddReplicaRequestPB,
        context: Context[master_pb2.AddReplicaRequestPB, master_pb2.ReplicaAdminResponsePB],
    ) -> master_pb2.ReplicaAdminResponsePB:
        outcome = await self._admin.add_replica(
            request.tablet_id, request.ts_uuid, request.member_type
        )
        return outcome.to_pb()

    @unary(master_pb2.ReplicaAdminResponsePB)
    async def RemoveReplica(
        self,
        request: master_pb2.RemoveReplicaRequestPB,
        context: Context[master_pb2.RemoveReplicaRequestPB, master_pb2.ReplicaAdminResponsePB],
    ) -> master_pb2.ReplicaAdminResponsePB:
        return (await self._admin.remove_replica(request.tablet_id, request.ts_uuid)).to_pb()

    @unary(master_pb2.ReplicaAdminResponsePB)
    async def ChangeReplicaType(
        self,
        request: master_pb2.ChangeReplicaTypeRequestPB,
        context: Context[master_pb2.ChangeReplicaTypeRequestPB, master_pb2.ReplicaAdminResponsePB],
    ) -> master_pb2.ReplicaAdminResponsePB:
        outcome = await self._admin.change_replica_type(
            request.tablet_id, request.ts_uuid, request.member_type, force=request.force
        )
        return outcome.to_pb()

    @unary(master_pb2.ReplicaAdminResponsePB)
    async def MoveReplica(
        self,
        request: master_pb2.MoveReplicaRequestPB,
        context: Context[master_pb2.MoveReplicaRequestPB, master_pb2.ReplicaAdminResponsePB],
    ) -> master_pb2.ReplicaAdminResponsePB:
        outcome = await self._admin.move_replica(
            request.tablet_id, request.from_ts_uuid, request.to_ts_uuid
        )
        return outcome.to_pb()

    @unary(master_pb2.ReplicaAdminResponsePB)
    async def TabletLeaderStepDown(
        self,
        request: master_pb2.TabletLeaderStepDownRequestPB,
        context: Context[
            master_pb2.TabletLeaderStepDownRequestPB, master_pb2.ReplicaAdminResponsePB
        ],
    ) -> master_pb2.ReplicaAdminResponsePB:
        outcome = await self._admin.leader_step_down(
            request.tablet_id, request.abrupt, request.new_leader_uuid
        )
        return outcome.to_pb()

    @unary(master_pb2.ReplicaAdminResponsePB)
    async def RetireTabletServer(
        self,
        request: master_pb2.RetireTabletServerRequestPB,
        context: Context[master_pb2.RetireTabletServerRequestPB, master_pb2.ReplicaAdminResponsePB],
    ) -> master_pb2.ReplicaAdminResponsePB:
        return (await self._admin.retire_tserver(request.ts_uuid)).to_pb()

    @unary(master_pb2.ReplicaAdminResponsePB)
    async def ChangeReplicationFactor(
        self,
        request: master_pb2.ChangeReplicationFactorRequestPB,
        context: Context[
            master_pb2.ChangeReplicationFactorRequestPB, master_pb2.ReplicaAdminResponsePB
        ],
    ) -> master_pb2.ReplicaAdminResponsePB:
        outcome = await self._admin.change_replication_factor(request.table, request.num_replicas)
        return outcome.to_pb()
