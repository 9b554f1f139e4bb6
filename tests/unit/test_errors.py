"""The Rust error kinds and the Python exception tree agree."""

from __future__ import annotations

import pytest

from nyala import _native, errors


def test_every_native_error_kind_has_a_python_class() -> None:
    names = _native.error_classes()
    assert len(names) == len(set(names))
    for name in names:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.NyalaError), name


@pytest.mark.parametrize(
    ("cls", "retriable"),
    [
        (errors.NotLeaderError, True),
        (errors.ServiceUnavailableError, True),
        (errors.TabletNotFoundError, True),
        (errors.NetworkError, True),
        (errors.TimedOutError, True),
        (errors.WrongServerUuidError, True),
        (errors.TabletFailedError, True),
        (errors.CorruptionError, False),
        (errors.DiskFullError, False),
        (errors.CasFailedError, False),
        (errors.InvalidArgumentError, False),
        (errors.NotFoundError, False),
    ],
)
def test_retriable_errors_are_kept_apart_from_final_ones(
    cls: type[errors.NyalaError], retriable: bool
) -> None:
    assert errors.is_retriable(cls("x")) is retriable
    assert issubclass(cls, errors.RETRIABLE) is retriable


def test_the_retriable_family_did_not_happen_and_the_timeout_is_indeterminate() -> None:
    assert issubclass(errors.NotLeaderError, errors.RetriableError)
    assert not issubclass(errors.TimedOutError, errors.RetriableError)


def test_not_leader_carries_the_leader_hint() -> None:
    err = errors.NotLeaderError("not the leader", leader_uuid="abc", leader_addr="127.0.0.1:7050")
    assert err.leader_uuid == "abc"
    assert err.leader_addr == "127.0.0.1:7050"
    assert "not the leader" in str(err)
