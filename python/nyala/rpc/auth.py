"""Who may call what: the server-side check of every RPC of a secure cluster.

The TLS handshake already proved that the caller holds a certificate of the cluster CA
(``nyala.rpc.credentials``); the guard every method handler of a secure server is wrapped in
when it is registered (``guarded_registration``) reads the identity that certificate names
(``nyala.security.identity``) and refuses a call whose method needs a higher role
(``METHOD_ROLES``): ``UNAUTHENTICATED`` without an identity, ``PERMISSION_DENIED`` for too low a
role. A handler reads the caller with ``current_caller()`` (None on an insecure server).

A secure server also refuses the certificates of removed users (``Revocations``: the names
``nyala user remove`` revoked, each with the time before which a certificate of that name is no
longer good); tablet servers learn them from the leader master's heartbeat answers.

Kudu's split: server-to-server RPCs (Raft, heartbeats, tablet copy, tablet creation) need a
server's certificate; replica administration and unsafe recovery need an admin; reads, writes
and DDL need a user; a join credential may only ask for a server certificate.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeAlias, cast

import grpc
from cryptography import x509

from nyala.errors import InvalidArgumentError, NotAuthenticatedError, NotAuthorizedError
from nyala.rpc.registration import HandlerStandIn
from nyala.security.identity import Identity, Kind, Role

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
    "MasterService.AddUser": Role.ADMIN,
    "MasterService.RemoveUser": Role.ADMIN,
    "MasterService.ListUsers": Role.ADMIN,
    "MasterService.IssueSessionCredentials": Role.USER,  # for the caller itself
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
    # Its port is where a user's client sends writes too (TabletService.WriteMulti's checks
    # apply there); consensus batches on it still need a server's certificate.
    "ConsensusService.GetPeerChannel": Role.USER,
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


def channel_caller(peercert: object, method_path: str, revocations: Revocations | None) -> Identity:
    """The caller of ``method_path`` on a peer channel connection, from its verified peer
    certificate (``rpc.tls_socket.peercert_of``'s shape), checked as the guard checks a gRPC
    call: a nyala identity, not revoked (else ``NotAuthenticatedError``, as gRPC's
    UNAUTHENTICATED), with the method's role (else ``NotAuthorizedError``, as
    PERMISSION_DENIED). Set the caller for the handler with ``set_current_caller``."""
    caller = None
    alt_names = peercert.get("subjectAltName", ()) if isinstance(peercert, dict) else ()
    for kind, value in alt_names:
        if kind == "URI":
            try:
                caller = Identity.from_uri(value)
                break
            except InvalidArgumentError:
                continue
    if caller is None:
        raise NotAuthenticatedError(
            f"{method_path} needs a certificate of this cluster naming a nyala identity"
        )
    if revocations is not None:
        not_before_ms = peercert.get("not_before_ms") if isinstance(peercert, dict) else None
        revoked = revocations.refused(caller, not_before_ms)
        if revoked is not None:
            raise NotAuthenticatedError(revoked)
    role = required_role(method_path)
    if caller.role < role:
        raise NotAuthorizedError(
            f"{method_path} needs the {role.name} role; {caller} has {caller.role.name}"
        )
    return caller


def set_current_caller(caller: Identity) -> None:
    """Makes ``caller`` what ``current_caller`` returns in this task (a peer channel's
    connection, whose calls the guard does not see)."""
    _caller.set(caller)


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


#: Certificates whose start time ``Revocations`` remembers (by their PEM bytes).
_NOT_BEFORE_CACHE_MAX = 1024


def revocation_key(identity: Identity) -> str | None:
    """The name under which ``identity``'s certificates are revoked: a user's or admin's name
    (they share names: an admin is a user with more rights), ``join/<name>`` for a join
    credential (``/`` is not allowed in names, so the two never collide); None for a server,
    whose certificates are not revoked by name."""
    if identity.kind in (Kind.USER, Kind.ADMIN):
        return identity.name
    if identity.kind is Kind.JOIN:
        return f"{Kind.JOIN.value}/{identity.name}"
    return None


class Revocations:
    """The users, admins and join credentials whose certificates valid from before a time are
    refused: removed with ``nyala user remove`` or ``nyala cert revoke-join``. Set from the sys
    catalog on the masters (the leader as it changes them, followers as they apply them) and
    from the leader's heartbeat answers on tablet servers; looked up on every call of a
    person's certificate (one dict lookup unless the name was revoked)."""

    def __init__(self) -> None:
        self._before_ms: dict[str, int] = {}
        self._not_before_ms: dict[bytes, int] = {}
        self._lock = threading.Lock()

    def set(self, revoked_before_ms: Mapping[str, int]) -> None:
        """Replaces the revoked names (``revocation_key`` -> Unix ms before which a certificate
        is refused)."""
        with self._lock:
            self._before_ms = dict(revoked_before_ms)

    def reason(self, caller: Identity, auth_context: Mapping[str, Iterable[bytes]]) -> str | None:
        """Why ``caller``'s certificate (in the connection's ``auth_context``) is refused
        (None: it is not). The certificate is read only when the name was revoked."""
        if revocation_key(caller) not in self._before_ms:
            return None
        pem = b"".join(auth_context.get("x509_pem_cert", ()))
        return self.refused(caller, self._cert_not_before_ms(pem))

    def refused(self, caller: Identity, not_before_ms: int | None) -> str | None:
        """Why a certificate of ``caller`` valid from ``not_before_ms`` is refused (None: it
        is not; an unknown start counts as revoked when the name is)."""
        key = revocation_key(caller)
        before_ms = None if key is None else self._before_ms.get(key)
        if before_ms is None:
            return None
        if not_before_ms is None or not_before_ms < before_ms:
            if caller.kind is Kind.JOIN:
                return f"the join credential {caller.name!r} was revoked (nyala cert revoke-join)"
            return f"the certificates of {caller.name!r} were revoked (nyala user remove)"
        return None

    def _cert_not_before_ms(self, pem: bytes) -> int | None:
        with self._lock:
            known = self._not_before_ms.get(pem)
        if known is not None:
            return known
        try:
            cert = x509.load_pem_x509_certificate(pem)
        except ValueError:
            return None
        not_before_ms = int(cert.not_valid_before_utc.timestamp() * 1000)
        with self._lock:
            if len(self._not_before_ms) >= _NOT_BEFORE_CACHE_MAX:
                self._not_before_ms.clear()
            self._not_before_ms[pem] = not_before_ms
        return not_before_ms


async def _check(
    context: grpc.aio.ServicerContext[Any, Any],
    role: Role,
    method: str,
    revocations: Revocations | None,
) -> None:
    """Aborts the call unless its caller may call ``method``; sets ``current_caller``."""
    auth_context = context.auth_context()
    caller = caller_of(auth_context)
    if caller is None:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            f"{method} needs a certificate of this cluster naming a nyala identity",
        )
    assert caller is not None
    if revocations is not None:
        revoked = revocations.reason(caller, auth_context)
        if revoked is not None:
            log.warning("refused %s from %s: revoked", method, caller)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, revoked)
    if caller.role < role:
        log.warning("refused %s from %s: needs the %s role", method, caller, role.name)
        await context.abort(
            grpc.StatusCode.PERMISSION_DENIED,
            f"{method} needs the {role.name} role; {caller} has {caller.role.name}",
        )
    _caller.set(caller)


def _guard(handler: _Handler, role: Role, method: str, revocations: Revocations | None) -> _Handler:
    """``handler`` with ``_check`` run before its behaviour."""
    replace = cast(Any, handler)._replace
    if handler.unary_unary is not None:
        unary = cast(Callable[..., Awaitable[Any]], handler.unary_unary)

        async def unary_unary(request: Any, context: Any) -> Any:
            await _check(context, role, method, revocations)
            return await unary(request, context)

        return cast(_Handler, replace(unary_unary=unary_unary))
    for field in ("unary_stream", "stream_stream"):  # a request (or a stream of them) in
        behaviour = getattr(handler, field)
        if behaviour is not None:
            guarded = _guard_stream(behaviour, role, method, revocations)
            return cast(_Handler, replace(**{field: guarded}))
    # nyala has no client-streaming RPC: refuse rather than serve one unchecked.
    raise AssertionError(f"{method}: client-streaming methods are not guarded")


def _guard_stream(
    behaviour: Callable[..., AsyncIterator[Any]],
    role: Role,
    method: str,
    revocations: Revocations | None,
) -> Callable[..., AsyncIterator[Any]]:
    """A streaming behaviour (server or bidirectional) with ``_check`` run first."""

    async def guarded(request_or_requests: Any, context: Any) -> AsyncIterator[Any]:
        await _check(context, role, method, revocations)
        async for response in behaviour(request_or_requests, context):
            yield response

    return guarded


def guarded_registration(
    server: grpc.aio.Server, revocations: Revocations | None
) -> grpc.aio.Server:
    """What a secure server's services register with: every method handler (the registered
    ones gRPC serves, and the generic fallback) wrapped with the role and revocation check,
    once. A call then pays only the check, where a gRPC server interceptor adds a coroutine
    and a handler lookup to every call (docs/security.md, "Cost")."""

    def guard(method: str, handler: _Handler) -> _Handler:
        return _guard(handler, required_role(method), method, revocations)

    return HandlerStandIn(server, guard, generic=True).as_server()
