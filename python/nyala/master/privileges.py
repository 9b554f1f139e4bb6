"""Table privileges on a secure cluster (Kudu's fine-grained authorization, docs/security.md):
who may do what with a table, GRANT and REVOKE, and the authz tokens that carry a caller's
privileges on one table to the tablet servers.

The owner of a table (its creator) and admins have every privilege; other users have what was
granted to them, kept in the table's sys catalog record. On an insecure cluster (no caller
identity) every call may do everything.
"""

from __future__ import annotations

import time

from nyala._proto import master_pb2
from nyala.errors import NotAuthorizedError
from nyala.master.catalog import copy_record
from nyala.master.catalog_manager import CatalogManager
from nyala.master.sys_catalog import CatalogRecord
from nyala.master.token_keys import TokenKeys
from nyala.security.identity import Identity, Kind, Role
from nyala.security.tokens import AuthzToken, Privilege, sign_token


def effective(table: master_pb2.SysTableEntryPB, caller: Identity | None) -> Privilege:
    """What ``caller`` may do with ``table``."""
    if caller is None or caller.role >= Role.ADMIN:
        return Privilege.ALL
    if caller.kind is Kind.USER and caller.name == table.owner:
        return Privilege.ALL
    return Privilege(table.privileges.get(caller.name, 0) & Privilege.ALL)


def require(table: master_pb2.SysTableEntryPB, caller: Identity | None, needed: Privilege) -> None:
    """``NotAuthorizedError`` unless ``caller`` holds ``needed`` on ``table``."""
    missing = needed & ~effective(table, caller)
    if missing:
        raise NotAuthorizedError(f"{caller} lacks {missing!r} on table {table.name!r}")


def owner_of_new_table(caller: Identity | None) -> str:
    """The owner recorded for a table ``caller`` creates (none for admins and insecure)."""
    return caller.name if caller is not None and caller.kind is Kind.USER else ""


def authz_token(
    keys: TokenKeys,
    table: master_pb2.SysTableEntryPB,
    caller: Identity | None,
) -> bytes:
    """The token of ``caller``'s privileges on ``table``, signed with the current
    token-signing key (empty without a caller)."""
    if caller is None:
        return b""
    now_ms = int(time.time() * 1000)
    token = AuthzToken(
        user=caller.name,
        table_id=table.table_id,
        privileges=effective(table, caller),
        expires_unix_ms=now_ms + keys.token_validity_ms,
    )
    return sign_token(keys.signing_key(now_ms), token)


async def set_privileges(
    manager: CatalogManager,
    request: master_pb2.SetTablePrivilegesRequestPB,
    caller: Identity | None,
) -> Privilege:
    """GRANT (or REVOKE with ``request.revoke``) on one table, by its owner or an admin;
    returns the user's privileges afterwards, once the sys catalog committed them."""
    if not request.user:
        raise NotAuthorizedError("GRANT and REVOKE need a user")
    Identity(Kind.USER, request.user)  # a well-formed name, else InvalidArgumentError
    change = Privilege(request.privileges & Privilege.ALL)
    async with manager.lock:
        catalog = manager.require_leader()
        table = catalog.table(request.table)
        is_owner = caller is not None and caller.name == table.pb.owner
        if caller is not None and caller.role < Role.ADMIN and not is_owner:
            raise NotAuthorizedError(
                f"only the owner of table {table.name!r} or an admin may grant or revoke"
            )
        record = copy_record(table.pb)
        now = Privilege(record.privileges.get(request.user, 0))
        now = now & ~change if request.revoke else now | change
        if now:
            record.privileges[request.user] = int(now)
        else:
            record.privileges.pop(request.user, None)
        await manager.replicate([CatalogRecord.table(record)])
        catalog.commit_table(record)
    return now
