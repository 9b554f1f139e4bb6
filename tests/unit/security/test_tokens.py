"""Authorization tokens (issue 36): signed by the CA's key, checked with its certificate."""

from __future__ import annotations

import pytest

from nyala.errors import NotAuthorizedError
from nyala.security import pki
from nyala.security.tokens import AuthzToken, Privilege, TokenVerifier, sign_token

NOW_MS = 1_800_000_000_000


def _token(privileges: Privilege = Privilege.SELECT, expires: int = NOW_MS + 60_000) -> AuthzToken:
    return AuthzToken("alice", "t" * 32, privileges, expires)


def test_a_token_verifies_under_its_ca_until_it_expires() -> None:
    ca = pki.ClusterCa.create()
    data = sign_token(ca.private_key, _token(Privilege.SELECT | Privilege.INSERT))
    verifier = TokenVerifier(ca.cert_pem)
    token = verifier.verify(data, NOW_MS)
    assert token.privileges == Privilege.SELECT | Privilege.INSERT
    assert token.user == "alice"
    with pytest.raises(NotAuthorizedError, match="expired"):
        verifier.verify(data, NOW_MS + 60_000)


def test_forged_foreign_and_malformed_tokens_are_refused() -> None:
    ca, other = pki.ClusterCa.create(), pki.ClusterCa.create()
    verifier = TokenVerifier(ca.cert_pem)
    with pytest.raises(NotAuthorizedError, match="not signed"):
        verifier.verify(sign_token(other.private_key, _token()), NOW_MS)
    genuine = sign_token(ca.private_key, _token(Privilege.SELECT))
    payload, signature = genuine.split(b".")
    upgraded = sign_token(other.private_key, _token(Privilege.ALL)).split(b".")[0]
    with pytest.raises(NotAuthorizedError, match="not signed"):
        verifier.verify(upgraded + b"." + signature, NOW_MS)  # a payload edited to ALL
    for bad in (b"", b"x", b"a.b.c", payload, b"." * 5000):
        with pytest.raises(NotAuthorizedError):
            verifier.verify(bad, NOW_MS)


def test_privileges_parse() -> None:
    assert Privilege.parse("select, INSERT") == Privilege.SELECT | Privilege.INSERT
    assert Privilege.parse("all") == Privilege.ALL
    with pytest.raises(ValueError, match="unknown privilege"):
        Privilege.parse("read")
