"""Authorization tokens (Kudu's authz tokens): what a user may do with one table, signed by the
cluster CA's key on a master and checked by tablet servers with the CA's certificate alone.

A token is ``<payload>.<signature>``, both URL-safe base64: the payload is compact JSON
(``user``, ``table_id``, ``privileges`` as a bit mask, ``expires_unix_ms``), the signature
ECDSA-SHA256 over the payload's bytes. A tablet server refuses a token that does not verify
under its cluster's CA (forged, or another cluster's), that expired, that names another user
than the caller's certificate, or another table than the tablet's.
"""

from __future__ import annotations

import base64
import enum
import json
import threading
import time
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from nyala.errors import NotAuthorizedError

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


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def _unb64(data: bytes) -> bytes:
    return base64.urlsafe_b64decode(data + b"=" * (-len(data) % 4))


def sign_token(key: ec.EllipticCurvePrivateKey, token: AuthzToken) -> bytes:
    """The signed token (a master signs with the CA's key)."""
    payload = json.dumps(
        {
            "user": token.user,
            "table_id": token.table_id,
            "privileges": int(token.privileges),
            "expires_unix_ms": token.expires_unix_ms,
        },
        separators=(",", ":"),
    ).encode()
    signature = key.sign(payload, ec.ECDSA(hashes.SHA256()))
    return _b64(payload) + b"." + _b64(signature)


class TokenVerifier:
    """Checks tokens against the cluster CA's certificate; a verified token is remembered (by
    its bytes), its expiry checked on every use."""

    def __init__(self, ca_pem: bytes) -> None:
        public_key = x509.load_pem_x509_certificate(ca_pem).public_key()
        assert isinstance(public_key, ec.EllipticCurvePublicKey)
        self._key = public_key
        self._verified: dict[bytes, AuthzToken] = {}
        self._lock = threading.Lock()

    def verify(self, data: bytes, now_unix_ms: int | None = None) -> AuthzToken:
        """The token ``data`` carries; ``NotAuthorizedError`` if it is missing, malformed,
        forged (or another cluster's) or expired."""
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
            self._key.verify(signature, payload, ec.ECDSA(hashes.SHA256()))
            fields = json.loads(payload)
            return AuthzToken(
                user=str(fields["user"]),
                table_id=str(fields["table_id"]),
                privileges=Privilege(int(fields["privileges"]) & Privilege.ALL),
                expires_unix_ms=int(fields["expires_unix_ms"]),
            )
        except InvalidSignature:
            raise NotAuthorizedError(
                "the authorization token is not signed by this cluster's CA"
            ) from None
        except (ValueError, KeyError, TypeError):
            raise NotAuthorizedError("the authorization token is malformed") from None
