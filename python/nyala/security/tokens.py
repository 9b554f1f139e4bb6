"""Authorization tokens (Kudu's authz tokens): what a user may do with one table, signed on the
leader master with a token-signing key (Kudu's TSK) and checked by tablet servers with that
key's public half, which they get in heartbeats.

A token is ``<payload>.<signature>``, both URL-safe base64: the payload is compact JSON
(``user``, ``table_id``, ``privileges`` as a bit mask, ``expires_unix_ms``, and ``kid``, the
signing key's sequence number), the signature ECDSA-SHA256 over the payload's bytes. A tablet
server refuses a token that does not verify under the key it names (forged, or another
cluster's), that names a key it no longer keeps, that expired, that names another user than
the caller's certificate, or another table than the tablet's. A token naming a key newer than
any it has heard of gets a retriable ``ServiceUnavailableError``: the server was just started,
or missed a heartbeat (keys are published half a rotation period before they sign).

Token-signing keys are ECDSA P-256 keys made by the leader master (``new_signing_key``), kept
in the sys catalog and rotated (``nyala.master.token_keys``); the CA's key signs certificates
only.
"""

from __future__ import annotations

import base64
import enum
import json
import threading
import time
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from nyala.errors import NotAuthorizedError, ServiceUnavailableError

#: Verified tokens remembered by a tablet server (a client reuses its token for many calls).
VERIFIED_TOKENS_MAX = 4096
#: A token longer than this is refused unparsed.
TOKEN_BYTES_MAX = 4096


class Privilege(enum.IntFlag):
    """Table privileges (Kudu's); ``ALL`` is every one of them."""

    SELECT = 1
    INSERT = 2
    UPDATE = 4
    DELETE = 8
    ALTER = 16
    DROP = 32
    ALL = 63

    def describe(self) -> str:
        """``"SELECT,INSERT"``; ``"NONE"`` for no privilege."""
        names = [p.name for p in Privilege if p in self and p is not Privilege.ALL]
        return ",".join(n for n in names if n) or "NONE"

    @classmethod
    def parse(cls, text: str) -> Privilege:
        """``"select,insert"`` (any case) as a mask; a ``ValueError`` names the choices."""
        mask = cls(0)
        for word in text.replace(" ", "").split(","):
            if word.upper() not in cls.__members__:
                choices = ", ".join(cls.__members__)
                raise ValueError(f"unknown privilege {word!r}: one of {choices}")
            mask |= cls[word.upper()]
        return mask


@dataclass(frozen=True)
class AuthzToken:
    """What a token grants."""

    user: str
    table_id: str
    privileges: Privilege
    expires_unix_ms: int


@dataclass(frozen=True)
class SigningKey:
    """A token-signing key, private half (masters only)."""

    seq: int
    private_key: ec.EllipticCurvePrivateKey
    activate_unix_ms: int
    expires_unix_ms: int

    def verifying_key(self) -> VerifyingKey:
        """The public half, as tablet servers get it."""
        return VerifyingKey(self.seq, self.private_key.public_key(), self.expires_unix_ms)

    def private_der(self) -> bytes:
        """PKCS#8 DER of the private key (for the sys catalog)."""
        return self.private_key.private_bytes(
            serialization.Encoding.DER,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    @classmethod
    def from_der(
        cls, seq: int, der: bytes, activate_unix_ms: int, expires_unix_ms: int
    ) -> SigningKey:
        """The key a sys catalog record holds; ``ValueError`` if it is not an EC key."""
        key = serialization.load_der_private_key(der, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"token-signing key {seq} is not an EC key")
        return cls(seq, key, activate_unix_ms, expires_unix_ms)

    def __repr__(self) -> str:  # never the key
        return (
            f"SigningKey(seq={self.seq}, activate_unix_ms={self.activate_unix_ms}, "
            f"expires_unix_ms={self.expires_unix_ms})"
        )


@dataclass(frozen=True)
class VerifyingKey:
    """A token-signing key, public half."""

    seq: int
    public_key: ec.EllipticCurvePublicKey
    expires_unix_ms: int

    def public_der(self) -> bytes:
        """SubjectPublicKeyInfo DER (for heartbeats)."""
        return self.public_key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    @classmethod
    def from_der(cls, seq: int, der: bytes, expires_unix_ms: int) -> VerifyingKey:
        """The key a heartbeat carries; ``ValueError`` if it is not an EC public key."""
        key = serialization.load_der_public_key(der)
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise ValueError(f"token-signing key {seq} is not an EC key")
        return cls(seq, key, expires_unix_ms)


def new_signing_key(seq: int, activate_unix_ms: int, expires_unix_ms: int) -> SigningKey:
    """A fresh ECDSA P-256 token-signing key."""
    return SigningKey(
        seq, ec.generate_private_key(ec.SECP256R1()), activate_unix_ms, expires_unix_ms
    )


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def _unb64(data: bytes) -> bytes:
    return base64.urlsafe_b64decode(data + b"=" * (-len(data) % 4))


def sign_token(key: SigningKey, token: AuthzToken) -> bytes:
    """The signed token (the leader master signs with its current token-signing key)."""
    payload = json.dumps(
        {
            "user": token.user,
            "table_id": token.table_id,
            "privileges": int(token.privileges),
            "expires_unix_ms": token.expires_unix_ms,
            "kid": key.seq,
        },
        separators=(",", ":"),
    ).encode()
    signature = key.private_key.sign(payload, ec.ECDSA(hashes.SHA256()))
    return _b64(payload) + b"." + _b64(signature)


class TokenVerifier:
    """Checks tokens against the token-signing keys the masters published (``set_keys``); a
    verified token is remembered (by its bytes), its expiry checked on every use."""

    def __init__(self) -> None:
        self._keys: dict[int, VerifyingKey] = {}
        self._verified: dict[bytes, AuthzToken] = {}
        self._lock = threading.Lock()

    def set_keys(self, keys: list[VerifyingKey]) -> None:
        """The keys the leader master publishes now (replacing those known before). A key is
        dropped only once expired, and it expires after every token it signed."""
        with self._lock:
            self._keys = {key.seq: key for key in keys}

    def verify(self, data: bytes, now_unix_ms: int | None = None) -> AuthzToken:
        """The token ``data`` carries; ``NotAuthorizedError`` if it is missing, malformed,
        forged (or another cluster's), signed by a key no longer kept or expired;
        ``ServiceUnavailableError`` (retriable) if it names a key newer than any known."""
        if not data:
            raise NotAuthorizedError("the request carries no authorization token")
        with self._lock:
            token = self._verified.get(data)
        if token is None:
            token = self._check_signature(data)
            with self._lock:
                if len(self._verified) >= VERIFIED_TOKENS_MAX:
                    self._verified.clear()
                self._verified[data] = token
        now = int(time.time() * 1000) if now_unix_ms is None else now_unix_ms
        if token.expires_unix_ms <= now:
            raise NotAuthorizedError("the authorization token expired")
        return token

    def _check_signature(self, data: bytes) -> AuthzToken:
        if len(data) > TOKEN_BYTES_MAX:
            raise NotAuthorizedError("the authorization token is malformed")
        try:
            payload_b64, signature_b64 = data.split(b".")
            payload, signature = _unb64(payload_b64), _unb64(signature_b64)
            fields = json.loads(payload)
            seq = int(fields["kid"])
            key = self._key(seq)
            key.public_key.verify(signature, payload, ec.ECDSA(hashes.SHA256()))
            return AuthzToken(
                user=str(fields["user"]),
                table_id=str(fields["table_id"]),
                privileges=Privilege(int(fields["privileges"]) & Privilege.ALL),
                expires_unix_ms=int(fields["expires_unix_ms"]),
            )
        except InvalidSignature:
            raise NotAuthorizedError(
                "the authorization token is not signed by this cluster's token-signing key"
            ) from None
        except (ValueError, KeyError, TypeError):
            raise NotAuthorizedError("the authorization token is malformed") from None

    def _key(self, seq: int) -> VerifyingKey:
        with self._lock:
            key = self._keys.get(seq)
            newest = max(self._keys, default=None)
        if key is not None:
            return key
        if newest is None or seq > newest:
            raise ServiceUnavailableError(
                f"this tablet server has not yet heard of token-signing key {seq} from the "
                "leader master; retry"
            )
        raise NotAuthorizedError(
            f"the authorization token is signed by token-signing key {seq}, which this "
            "cluster no longer keeps"
        )
