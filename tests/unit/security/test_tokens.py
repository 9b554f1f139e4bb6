"""Authorization tokens and token-signing keys (issue 36): tokens signed with the leader
master's current key, checked with the public keys the tablet servers were sent; keys made,
handed over and dropped by ``nyala.master.token_keys``."""

from __future__ import annotations

import pytest

from nyala._proto import master_pb2
from nyala.errors import NotAuthorizedError, ServiceUnavailableError
from nyala.master.token_keys import TokenKeys
from nyala.security.tokens import (
    AuthzToken,
    Privilege,
    TokenVerifier,
    VerifyingKey,
    new_signing_key,
    sign_token,
)

NOW_MS = 1_800_000_000_000
ROTATION_MS = 10_000
VALIDITY_MS = 3_000


def _token(privileges: Privilege = Privilege.SELECT, expires: int = NOW_MS + 60_000) -> AuthzToken:
    return AuthzToken("alice", "t" * 32, privileges, expires)


def _verifier(*keys: VerifyingKey) -> TokenVerifier:
    verifier = TokenVerifier()
    verifier.set_keys(list(keys))
    return verifier


def test_a_token_verifies_under_its_key_until_it_expires() -> None:
    key = new_signing_key(1, NOW_MS, NOW_MS + 120_000)
    data = sign_token(key, _token(Privilege.SELECT | Privilege.INSERT))
    verifier = _verifier(key.verifying_key())
    token = verifier.verify(data, NOW_MS)
    assert token.privileges == Privilege.SELECT | Privilege.INSERT
    assert token.user == "alice"
    with pytest.raises(NotAuthorizedError, match="expired"):
        verifier.verify(data, NOW_MS + 60_000)


def test_forged_foreign_and_malformed_tokens_are_refused() -> None:
    key = new_signing_key(1, NOW_MS, NOW_MS + 120_000)
    other = new_signing_key(1, NOW_MS, NOW_MS + 120_000)  # same number, another key
    verifier = _verifier(key.verifying_key())
    with pytest.raises(NotAuthorizedError, match="not signed"):
        verifier.verify(sign_token(other, _token()), NOW_MS)
    genuine = sign_token(key, _token(Privilege.SELECT))
    payload, signature = genuine.split(b".")
    upgraded = sign_token(other, _token(Privilege.ALL)).split(b".")[0]
    with pytest.raises(NotAuthorizedError, match="not signed"):
        verifier.verify(upgraded + b"." + signature, NOW_MS)  # a payload edited to ALL
    for bad in (b"", b"x", b"a.b.c", payload, b"." * 5000):
        with pytest.raises(NotAuthorizedError):
            verifier.verify(bad, NOW_MS)


def test_unknown_keys_older_are_refused_newer_are_retriable() -> None:
    keys = [new_signing_key(seq, NOW_MS, NOW_MS + 120_000) for seq in (1, 2, 3)]
    verifier = _verifier(keys[1].verifying_key())  # 1 was dropped, 3 not heard of yet
    assert verifier.verify(sign_token(keys[1], _token()), NOW_MS).user == "alice"
    with pytest.raises(NotAuthorizedError, match="no longer keeps"):
        verifier.verify(sign_token(keys[0], _token()), NOW_MS)
    with pytest.raises(ServiceUnavailableError, match="not yet heard"):
        verifier.verify(sign_token(keys[2], _token()), NOW_MS)
    with pytest.raises(ServiceUnavailableError):
        TokenVerifier().verify(sign_token(keys[0], _token()), NOW_MS)  # no key at all yet


def test_keys_round_trip_through_their_records() -> None:
    key = new_signing_key(7, NOW_MS, NOW_MS + 1)
    assert "PRIVATE" not in repr(key)
    assert str(key.private_key.private_numbers().private_value) not in repr(key)
    public = VerifyingKey.from_der(7, key.verifying_key().public_der(), NOW_MS + 1)
    assert public.public_key.public_numbers() == key.private_key.public_key().public_numbers()
    with pytest.raises(ValueError, match=r"key|parse|Could not"):
        VerifyingKey.from_der(7, b"not a key", NOW_MS)


def _run_keys(keys: TokenKeys, now_ms: int) -> None:
    """What the leader's background task does: make every key that is due."""
    while (record := keys.due(now_ms)) is not None:
        keys.commit(record)


def test_keys_rotate_ahead_and_outlive_their_tokens() -> None:
    keys = TokenKeys(ROTATION_MS, VALIDITY_MS)
    with pytest.raises(ServiceUnavailableError, match="no token-signing key"):
        keys.signing_key(NOW_MS)
    verifier = TokenVerifier()
    issued: list[tuple[int, bytes]] = []
    published: set[int] = set()
    for now in range(NOW_MS, NOW_MS + 10 * ROTATION_MS, 250):
        _run_keys(keys, now)
        # The tablet server hears the keys one heartbeat later; tokens are signed now.
        signer = keys.signing_key(now)
        assert signer.activate_unix_ms <= now
        assert now + VALIDITY_MS <= signer.expires_unix_ms  # it outlives every token it signs
        issued.append((now, sign_token(signer, _token(expires=now + VALIDITY_MS))))
        for earlier, data in issued[-VALIDITY_MS // 250 + 1 :]:
            if earlier + VALIDITY_MS > now and earlier > NOW_MS:
                assert verifier.verify(data, now).user == "alice"  # every live token verifies
        public = keys.public_keys(now)
        published |= {pb.key_seq for pb in public}
        verifier.set_keys(
            [VerifyingKey.from_der(p.key_seq, p.public_key_der, p.expires_unix_ms) for p in public]
        )
        assert len(public) <= 3  # expired keys are no longer sent
    # One key per rotation period, and the next one, published half a period ahead.
    assert published == set(range(1, 12))


def test_a_key_is_published_half_a_period_before_it_signs() -> None:
    keys = TokenKeys(ROTATION_MS, VALIDITY_MS)
    _run_keys(keys, NOW_MS)
    assert keys.due(NOW_MS + ROTATION_MS // 2 - 1) is None
    record = keys.due(NOW_MS + ROTATION_MS // 2)
    assert record is not None
    assert record.activate_unix_ms == NOW_MS + ROTATION_MS
    keys.commit(record)
    assert keys.signing_key(NOW_MS + ROTATION_MS - 1).seq == 1
    assert keys.signing_key(NOW_MS + ROTATION_MS).seq == 2
    # A new leader that finds the keys stale (the masters were down) makes one at once.
    later = NOW_MS + 100 * ROTATION_MS
    stale = keys.due(later)
    assert stale is not None
    assert stale.activate_unix_ms == later


def test_a_bad_key_record_is_corruption() -> None:
    keys = TokenKeys(ROTATION_MS, VALIDITY_MS)
    bad = master_pb2.SysTskEntryPB(key_seq=1, private_key_der=b"junk", expires_unix_ms=NOW_MS)
    with pytest.raises(Exception, match="token-signing key 1"):
        keys.load([bad])


def test_privileges_parse() -> None:
    assert Privilege.parse("select, INSERT") == Privilege.SELECT | Privilege.INSERT
    assert Privilege.parse("all") == Privilege.ALL
    with pytest.raises(ValueError, match="unknown privilege"):
        Privilege.parse("read")
