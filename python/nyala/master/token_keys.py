"""Token-signing keys (Kudu's TSKs) on the leader master: which key signs authz tokens now,
which public keys the tablet servers get, and when a new key is due (docs/security.md,
"Token-signing keys").

Every key has a signing window of ``tsk_rotation_ms`` starting at its activation time. The
next key is made and replicated half a window before the current one's ends, with its
activation at that end, so the tablet servers hear of it in heartbeats well before a token
names it. A key expires one token lifetime (``authz_token_validity_ms``) after its window ends,
so it outlives every token it signed; only then is it dropped from the heartbeats. Keys live in
the sys catalog (replicated with the catalog), so a new leader master signs with the same
keys and the tablet servers' tokens stay good across a master failover.
"""

from __future__ import annotations

from nyala._proto import master_pb2
from nyala.errors import CorruptionError, ServiceUnavailableError
from nyala.security.tokens import SigningKey, new_signing_key


class TokenKeys:
    """The token-signing keys a leader master loaded or made."""

    def __init__(self, rotation_ms: int, token_validity_ms: int) -> None:
        self.rotation_ms = rotation_ms
        self.token_validity_ms = token_validity_ms
        self._keys: dict[int, SigningKey] = {}
        # Each key's public half as heartbeats carry it, made once (they carry it every beat).
        self._public: dict[int, master_pb2.TokenSigningPublicKeyPB] = {}

    def load(self, records: list[master_pb2.SysTskEntryPB]) -> None:
        """Replaces the keys with the sys catalog's; ``CorruptionError`` for a bad record."""
        keys = {}
        for pb in records:
            try:
                keys[pb.key_seq] = SigningKey.from_der(
                    pb.key_seq, pb.private_key_der, pb.activate_unix_ms, pb.expires_unix_ms
                )
            except ValueError as exc:
                raise CorruptionError(f"token-signing key {pb.key_seq}: {exc}") from None
        self._keys = keys
        self._public = {seq: _public_pb(key) for seq, key in keys.items()}

    def commit(self, pb: master_pb2.SysTskEntryPB) -> None:
        """Adds a key once the sys catalog committed its record."""
        key = SigningKey.from_der(
            pb.key_seq, pb.private_key_der, pb.activate_unix_ms, pb.expires_unix_ms
        )
        self._keys[key.seq] = key
        self._public[key.seq] = _public_pb(key)

    def due(self, now_ms: int) -> master_pb2.SysTskEntryPB | None:
        """The record of the key to make now (None: the keys are in order)."""
        newest = max(self._keys.values(), key=lambda k: k.seq, default=None)
        if newest is None:
            activate_ms, seq = now_ms, 1
        elif now_ms >= newest.activate_unix_ms + self.rotation_ms // 2:
            activate_ms = max(newest.activate_unix_ms + self.rotation_ms, now_ms)
            seq = newest.seq + 1
        else:
            return None
        expires_ms = activate_ms + self.rotation_ms + self.token_validity_ms
        key = new_signing_key(seq, activate_ms, expires_ms)
        return master_pb2.SysTskEntryPB(
            key_seq=seq,
            private_key_der=key.private_der(),
            activate_unix_ms=activate_ms,
            expires_unix_ms=expires_ms,
        )

    def signing_key(self, now_ms: int) -> SigningKey:
        """The key that signs tokens now: the newest active one that outlives a token signed
        now; ``ServiceUnavailableError`` (retriable) before the first key is made."""
        usable = [
            key
            for key in self._keys.values()
            if key.activate_unix_ms <= now_ms
            and now_ms + self.token_validity_ms <= key.expires_unix_ms
        ]
        if not usable:
            raise ServiceUnavailableError("the leader master has no token-signing key yet")
        return max(usable, key=lambda k: k.seq)

    def public_keys(self, now_ms: int) -> list[master_pb2.TokenSigningPublicKeyPB]:
        """The unexpired keys' public halves, for the tablet servers."""
        return [
            self._public[seq]
            for seq in sorted(self._public)
            if self._public[seq].expires_unix_ms > now_ms
        ]


def _public_pb(key: SigningKey) -> master_pb2.TokenSigningPublicKeyPB:
    return master_pb2.TokenSigningPublicKeyPB(
        key_seq=key.seq,
        public_key_der=key.verifying_key().public_der(),
        expires_unix_ms=key.expires_unix_ms,
    )
