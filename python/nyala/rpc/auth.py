"""Who may call what: the server-side check of every RPC of a secure cluster.

The TLS handshake already proved that the caller holds a certificate of the cluster CA
(``nyala.rpc.credentials``); ``AuthInterceptor`` reads the identity that certificate names
(``nyala.security.identity``) and refuses a call whose method needs a higher role
(``METHOD_ROLES``): ``UNAUTHENTICATED`` without an identity, ``PERMISSION_DENIED`` for too low a
role. A handler reads the caller with ``current_caller()`` (None on an insecure server).

Kudu's split: server-to-server RPCs (Raft, heartbeats, tablet copy, tablet creation) need a
server's certificate; replica administration and unsafe recovery need an admin; reads, writes
and DDL need a user; a join credential may only ask for a server certificate.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeAlias, cast

import grpc

from nyala.errors import InvalidArgumentError
from nyala.security.identity import Identity, Role

log = logging.getLogger(__name__)

_Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"

#: The role each method requires, by ``Service.Method``; a method not listed requires SERVER
#: (a new RPC is closed until someone decides who may call it).
METHOD_ROLES: dict[str, Role] = {
    # nyala.MasterService
    "MasterService.SignServerCertificate": Role.NONE,
    "MasterService.ConnectToMaster": Role.USER,
    "MasterService.CreateTable": Role.USER,
    "MasterService.IsCreateTableDone": Role.USER,
    "MasterService.AlterTable": Role.USER,
    "MasterService.IsAlterTableDone": Role.USER,
    "MasterService.DeleteTable": Role.USER,
    "MasterService.GetTableSchema": Role.USER,
    "MasterService.GetTableLocations": Role.USER,
    "MasterService.GetTableStatistics": Role.USER,
    "MasterService.ListTables": Role.USER,
    "MasterService.ListTabletServers": Role.USER,
    "MasterService.ListMasters": Role.USER,
    "MasterService.SetTablePrivileges": Role.USER,  # the table's owner or an admin
    "MasterService.AddMaster": Role.ADMIN,
    "MasterService.RemoveMaster": Role.ADMIN,
    "MasterService.AddReplica": Role.ADMIN,
    "MasterService.RemoveReplica": Role.ADMIN,
    "MasterService.ChangeReplicaType": Role.ADMIN,
    "MasterService.MoveReplica": Role.ADMIN,
    "MasterService.TabletLeaderStepDown": Role.ADMIN,
    "MasterService.RetireTabletServer": Role.ADMIN,
    "MasterService.ChangeReplicationFactor": Role.ADMIN,
    "MasterService.TSHeartbeat": Role.SERVER,
    # nyala.TabletService
    "TabletService.Write": Role.USER,
    "TabletService.WriteMulti": Role.USER,
    "TabletService.Scan": Role.USER,
    "TabletService.ScannerKeepAlive": Role.USER,
    "TabletService.Ping": Role.USER,
    # nyala.ConsensusService
    "ConsensusService.ChangeConfig": Role.ADMIN,
    "ConsensusService.UnsafeChangeConfig": Role.ADMIN,
    "ConsensusService.LeaderStepDown": Role.ADMIN,
    "ConsensusService.RunLeaderElection": Role.ADMIN,
    "ConsensusService.GetConsensusState": Role.ADMIN,
    "ConsensusService.ServerHeartbeat": Role.SERVER,
    "ConsensusService.ConsensusPeerStream": Role.SERVER,
    "ConsensusService.UpdateConsensus": Role.SERVER,
    "ConsensusService.RequestVote": Role.SERVER,
    # nyala.TabletServerAdminService
    "TabletServerAdminService.DeleteTablet": Role.ADMIN,
    "TabletServerAdminService.ListTablets": Role.ADMIN,
    "TabletServerAdminService.CreateTablet": Role.SERVER,
    "TabletServerAdminService.AlterSchema": Role.SERVER,
    # nyala.TabletCopyService
    "TabletCopyService.StartTabletCopy": Role.ADMIN,
    "TabletCopyService.ListTabletCopies": Role.ADMIN,
    "TabletCopyService.CancelTabletCopy": Role.ADMIN,
    "TabletCopyService.BeginTabletCopySession": Role.SERVER,
    "TabletCopyService.FetchData": Role.SERVER,
    "TabletCopyService.EndTabletCopySession": Role.SERVER,
}

_caller: contextvars.ContextVar[Identity | None] = contextvars.ContextVar(
    "nyala_rpc_caller", default=None
)


def current_caller() -> Identity | None:
    """The identity of the caller of the RPC being handled (None on an insecure server)."""
    return _caller.get()


def required_role(method_path: str) -> Role:
    """The role ``/nyala.Service/Method`` requires."""
    service, _, method = method_path.lstrip("/").rpartition("/")
    return METHOD_ROLES.get(f"{service.rpartition('.')[2]}.{method}", Role.SERVER)


def caller_of(auth_context: Mapping[str, Iterable[bytes]]) -> Identity | None:
    """The identity the peer's certificate names (its URI subject alternative name)."""
    for uri in auth_context.get("peer_uri", ()):
        try:
            return Identity.from_uri(uri.decode())
        except (InvalidArgumentError, UnicodeDecodeError):
            continue
    return None


async def _check(context: grpc.aio.ServicerContext[Any, Any], role: Role, method: str) -> None:
    """Aborts the call unless its caller may call ``method``; sets ``current_caller``."""
    caller = caller_of(context.auth_context())
    if caller is None:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            f"{method} needs a certificate of this cluster naming a nyala identity",
        )
    assert caller is not None
    if caller.role < role:
        log.warning("refused %s from %s: needs the %s role", method, caller, role.name)
        await context.abort(
            grpc.StatusCode.PERMISSION_DENIED,
            f"{method} needs the {role.name} role; {caller} has {caller.role.name}",
        )
    _caller.set(caller)


def _guard(handler: _Handler, role: Role, method: str) -> _Handler:
    """``handler`` with ``_check`` run before its behaviour."""
    replace = cast(Any, handler)._replace
    if handler.unary_unary is not None:
        unary = cast(Callable[..., Awaitable[Any]], handler.unary_unary)

        async def unary_unary(request: Any, context: Any) -> Any:
            await _check(context, role, method)
            return await unary(request, context)

        return cast(_Handler, replace(unary_unary=unary_unary))
    for field in ("unary_stream", "stream_stream"):  # a request (or a stream of them) in
        behaviour = getattr(handler, field)
        if behaviour is not None:
            return cast(_Handler, replace(**{field: _guard_stream(behaviour, role, method)}))
    # nyala has no client-streaming RPC: refuse rather than serve one unchecked.
    raise AssertionError(f"{method}: client-streaming methods are not guarded")


def _guard_stream(
    behaviour: Callable[..., AsyncIterator[Any]], role: Role, method: str
) -> Callable[..., AsyncIterator[Any]]:
    """A streaming behaviour (server or bidirectional) with ``_check`` run first."""

    async def guarded(request_or_requests: Any, context: Any) -> AsyncIterator[Any]:
        await _check(context, role, method)
        async for response in behaviour(request_or_requests, context):
            yield response

    return guarded


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Checks every call's caller against ``METHOD_ROLES`` (wrapped handlers are cached per
    method: the check is all a call pays)."""

    def __init__(self) -> None:
        self._guarded: dict[str, _Handler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[_Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        method = handler_call_details.method
        guarded = self._guarded.get(method)
        if guarded is not None:
            return guarded
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        guarded = self._guarded[method] = _guard(handler, required_role(method), method)
        return guarded
