"""A tablet server's check of table privileges on writes and scans (Kudu's fine-grained
authorization, docs/security.md): the request carries the master's authz token for the
table, which must verify under one of the token-signing keys the leader master published,
name the caller's user and the tablet's table, and grant what the request does.
``SecurityUpdates`` takes those keys, and the revoked user names, from heartbeat answers.

Writes need INSERT, UPDATE or DELETE according to their row operations (an upsert needs both
INSERT and UPDATE); the operations are read from the batch only when the token does not grant
all three. Scans need SELECT. Admins and servers need no token.
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa

from nyala._proto import master_pb2, tserver_pb2
from nyala.errors import NotAuthorizedError
from nyala.rowops import OP_COLUMN, OpType
from nyala.rpc.auth import Revocations, current_caller
from nyala.security.identity import Role
from nyala.security.tokens import Privilege, TokenVerifier, VerifyingKey
from nyala.tablet import TabletManager

log = logging.getLogger(__name__)

_WRITES = Privilege.INSERT | Privilege.UPDATE | Privilege.DELETE
_NEEDED_BY_OP = {
    OpType.INSERT: Privilege.INSERT,
    OpType.INSERT_IGNORE: Privilege.INSERT,
    OpType.UPSERT: Privilege.INSERT | Privilege.UPDATE,
    OpType.UPDATE: Privilege.UPDATE,
    OpType.UPDATE_IGNORE: Privilege.UPDATE,
    OpType.DELETE: Privilege.DELETE,
    OpType.DELETE_IGNORE: Privilege.DELETE,
}


class SecurityUpdates:
    """Applies what the leader master's heartbeat answers carry for a secure tablet server:
    the token-signing keys (to ``verifier``) and the revoked users (to ``revocations``)."""

    def __init__(self, verifier: TokenVerifier, revocations: Revocations) -> None:
        self.verifier = verifier
        self.revocations = revocations
        self._keys_seen: tuple[tuple[int, bytes, int], ...] | None = None

    def update(self, response: master_pb2.TSHeartbeatResponsePB) -> None:
        """Takes the leader's keys and revocations (replacing the earlier ones; keys are parsed
        only when they changed since the last answer)."""
        self.revocations.set(dict(response.revoked_users))
        seen = tuple(
            (pb.key_seq, pb.public_key_der, pb.expires_unix_ms) for pb in response.tsk_public_keys
        )
        if seen == self._keys_seen:
            return
        self._keys_seen = seen
        keys = []
        for pb in response.tsk_public_keys:
            try:
                keys.append(
                    VerifyingKey.from_der(pb.key_seq, pb.public_key_der, pb.expires_unix_ms)
                )
            except ValueError as exc:  # the tokens it signed are refused: safe, and logged
                log.error("the leader master sent a malformed token-signing key: %s", exc)
        self.verifier.set_keys(keys)


class TabletAuthorizer:
    """Checks requests against the authz tokens they carry."""

    def __init__(self, verifier: TokenVerifier, tablets: TabletManager) -> None:
        self._verifier = verifier
        self._tablets = tablets

    def check_write(self, request: tserver_pb2.WriteRequestPB) -> None:
        """``NotAuthorizedError`` unless the caller may apply every row of ``request``."""
        granted = self._granted(request.tablet_id, request.authz_token)
        if granted is None or _WRITES & granted == _WRITES:
            return
        missing = _write_privileges(request.ops) & ~granted
        if missing:
            raise NotAuthorizedError(f"the write needs {missing!r} on this table")

    def check_scan(self, scan: tserver_pb2.NewScanRequestPB) -> None:
        """``NotAuthorizedError`` unless the caller may read the tablet's table."""
        granted = self._granted(scan.tablet_id, scan.authz_token)
        if granted is not None and not granted & Privilege.SELECT:
            raise NotAuthorizedError("the scan needs Privilege.SELECT on this table")

    def _granted(self, tablet_id: str, token_data: bytes) -> Privilege | None:
        """What the token grants on the tablet's table (None: the caller needs no token)."""
        caller = current_caller()
        if caller is None or caller.role >= Role.ADMIN:
            return None
        token = self._verifier.verify(token_data)
        if token.user != caller.name:
            raise NotAuthorizedError("the authorization token is another user's")
        replica = self._tablets.replica(tablet_id)
        if token.table_id != replica.superblock.table_id:
            raise NotAuthorizedError("the authorization token is for another table")
        return token.privileges


def _write_privileges(ops: bytes) -> Privilege:
    """What the row operations of an op batch need."""
    try:
        batch = pa.ipc.open_stream(ops).read_next_batch()
        codes = np.unique(batch.column(OP_COLUMN).to_numpy(zero_copy_only=False))
        needed = Privilege(0)
        for code in codes.tolist():
            needed |= _NEEDED_BY_OP[OpType(code)]
    except (pa.ArrowException, KeyError, ValueError, StopIteration):
        return _WRITES  # unreadable: the caller needs every write privilege
    return needed
