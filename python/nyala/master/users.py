"""Users of a secure cluster (`nyala user add/remove/list`, docs/security.md "Users"): kept in
the sys catalog, so every future leader master knows them; and the session credentials a user
gets for itself (`nyala user session`).

Adding a user signs the certificate request it sent (its key never leaves the caller) with the
cluster CA. Removing one revokes every certificate of that name valid from before the removal,
wherever it was issued (also by `nyala cert issue` on a master's host): the masters refuse it
at once, the tablet servers from their next heartbeat answer (``revoked_users``). A user added
again gets a certificate valid from after its removal, so only the new one works. Removal does
not touch the user's table privileges or ownership: a user added again under the same name
has them again, as in Kudu, where privileges belong to names.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterable, Mapping

from cryptography import x509

from nyala._proto import master_pb2
from nyala.errors import AlreadyPresentError, InvalidArgumentError, NotAuthorizedError
from nyala.master.catalog import copy_record
from nyala.master.catalog_manager import CatalogManager
from nyala.master.sys_catalog import CatalogRecord, user_key
from nyala.rpc.auth import revocation_key
from nyala.security import pki
from nyala.security.identity import SESSION_URI, Identity, Kind
from nyala.security.pki import USER_CERT_VALIDITY_S, ClusterCa

#: The longest certificate ``AddUser`` signs.
USER_CERT_VALIDITY_DAYS_MAX = 3650


async def add_user(
    manager: CatalogManager, ca: ClusterCa, request: master_pb2.AddUserRequestPB
) -> bytes:
    """Records the user and returns its certificate (PEM) for the request's CSR;
    ``AlreadyPresentError`` if a user of that name exists and was not removed, unless this is
    the same request again (same key and rights: its first answer was lost), which gets a
    certificate again."""
    identity = Identity(Kind.ADMIN if request.admin else Kind.USER, request.name)
    if request.validity_days > USER_CERT_VALIDITY_DAYS_MAX:
        raise InvalidArgumentError(
            f"validity_days {request.validity_days} is over {USER_CERT_VALIDITY_DAYS_MAX}"
        )
    validity_s = request.validity_days * 86_400 or USER_CERT_VALIDITY_S
    key_sha256 = pki.csr_key_sha256(request.csr_pem, identity)
    async with manager.lock:
        manager.require_leader()
        known = manager.users.get(request.name)
        if known is not None and not known.removed:
            if known.public_key_sha256 != key_sha256 or known.admin != request.admin:
                raise AlreadyPresentError(f"user {request.name!r} exists")
            # A retry: the record is there, only the answer was lost.
            not_before = _not_before(known) if known.revoked_before_unix_ms else None
            return ca.sign_identity_csr(
                request.csr_pem, identity, validity_s=validity_s, not_before=not_before
            )
        now_ms = int(time.time() * 1000)
        record = master_pb2.SysUserEntryPB(
            name=request.name, admin=request.admin, public_key_sha256=key_sha256
        )
        record.added_unix_ms = now_ms
        not_before = None
        if known is not None:
            # Certificates valid from before the removal stay revoked; this one is valid from
            # the removal's second on (a whole second, as certificates count time).
            record.revoked_before_unix_ms = known.revoked_before_unix_ms
            record.removed_unix_ms = known.removed_unix_ms
            not_before = _not_before(known)
        cert = ca.sign_identity_csr(
            request.csr_pem, identity, validity_s=validity_s, not_before=not_before
        )
        await manager.replicate([CatalogRecord.user(record)])
        manager.users[user_key(record)] = record
        manager.revocations.set(manager.revoked_users())
    return cert


def _not_before(known: master_pb2.SysUserEntryPB) -> datetime.datetime:
    """The start of a certificate for a user removed before: the removal's second."""
    return datetime.datetime.fromtimestamp(known.revoked_before_unix_ms // 1000, datetime.UTC)


async def remove_user(manager: CatalogManager, name: str, *, join: bool = False) -> None:
    """Marks the user removed and revokes every certificate of that name valid from before now.
    A name never added (its certificates came from `nyala cert issue`) is recorded as removed
    too, and removing a removed user again revokes what was issued to it since. With ``join``,
    ``name`` is a join credential's (`nyala cert revoke-join`): the same, for the credentials
    made by `nyala cert join-credential` under that name (servers enrolled with them keep their
    certificates)."""
    identity = Identity(Kind.JOIN if join else Kind.USER, name)  # else InvalidArgumentError
    key = revocation_key(identity)
    assert key is not None
    async with manager.lock:
        manager.require_leader()
        known = manager.users.get(key)
        if known is None:
            record = master_pb2.SysUserEntryPB(name=name, join=join)
        else:
            record = copy_record(known)
        now_ms = int(time.time() * 1000)
        record.removed = True
        record.removed_unix_ms = now_ms
        # Whole seconds (certificates' times are): every certificate valid from before this
        # second is refused. Certificates made by `nyala cert issue` start 5 minutes before
        # they were made, so one made just now is refused too; one from an earlier AddUser
        # starts at the earlier removal's second, so a second removal moves a second on.
        record.revoked_before_unix_ms = max(
            now_ms // 1000 * 1000, record.revoked_before_unix_ms + 1000
        )
        await manager.replicate([CatalogRecord.user(record)])
        manager.users[key] = record
        manager.revocations.set(manager.revoked_users())


def list_users(manager: CatalogManager) -> list[master_pb2.SysUserEntryPB]:
    """Every user added or removed, and every join credential revoked, by name."""
    manager.require_leader()
    return [manager.users[key] for key in sorted(manager.users)]


#: Session credentials last this long unless asked otherwise, and at most ``..._MAX``.
SESSION_VALIDITY_S_DEFAULT = 24 * 3600
SESSION_VALIDITY_S_MAX = 7 * 24 * 3600
#: Certificates start this long before they are signed (clocks differ between machines).
_CLOCK_SLACK_S = 300


def issue_session_credentials(
    manager: CatalogManager,
    ca: ClusterCa,
    caller: Identity | None,
    auth_context: Mapping[str, Iterable[bytes]],
    request: master_pb2.IssueSessionCredentialsRequestPB,
) -> tuple[bytes, int]:
    """A short-lived certificate for the caller's own identity (PEM) and its end (Unix ms):
    Kudu's authentication token as a certificate, for processes that should not hold the
    user's long-lived key (Spark executors, batch jobs). Never longer than the caller's own
    certificate, and never issued to session credentials (they cannot renew themselves)."""
    manager.require_leader()  # it knows the removed users (the caller passed that check)
    if caller is None or caller.kind not in (Kind.USER, Kind.ADMIN):
        raise NotAuthorizedError("session credentials are for users and admins")
    if SESSION_URI in (uri.decode(errors="replace") for uri in auth_context.get("peer_uri", ())):
        raise NotAuthorizedError(
            "session credentials cannot be renewed with session credentials: use the "
            "credentials they came from"
        )
    if request.validity_s > SESSION_VALIDITY_S_MAX:
        raise InvalidArgumentError(
            f"validity_s {request.validity_s} is over {SESSION_VALIDITY_S_MAX} (7 days)"
        )
    own = x509.load_pem_x509_certificate(b"".join(auth_context.get("x509_pem_cert", ())))
    now = pki.now_utc()
    start = now - datetime.timedelta(seconds=_CLOCK_SLACK_S)
    end = min(
        now + datetime.timedelta(seconds=request.validity_s or SESSION_VALIDITY_S_DEFAULT),
        own.not_valid_after_utc,
    )
    validity_s = int((end - start).total_seconds())
    cert = ca.sign_identity_csr(
        request.csr_pem, caller, validity_s=validity_s, not_before=start, session=True
    )
    return cert, int((start.timestamp() + validity_s) * 1000)
