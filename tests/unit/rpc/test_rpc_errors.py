"""The wire error codes and the exception tree map onto each other, both ways."""

from __future__ import annotations

import grpc
import pytest

from nyala import errors
from nyala._proto import common_pb2, tserver_pb2
from nyala.rpc.errors import (
    CODE_TO_CLASS,
    error_from_grpc,
    error_from_pb,
    error_to_pb,
    join_host_port,
    raise_for_response,
    split_host_port,
)


def test_every_wire_code_has_a_class() -> None:
    wire_codes = set(common_pb2.ErrorCode.values())
    assert set(CODE_TO_CLASS) == wire_codes


@pytest.mark.parametrize("code", sorted(CODE_TO_CLASS))
def test_each_code_round_trips_through_its_exception(code: int) -> None:
    cls = CODE_TO_CLASS[code]
    exc = error_from_pb(common_pb2.ErrorPB(code=code, message="boom"))
    assert type(exc) is cls
    assert str(exc) == "boom"
    assert error_to_pb(exc).code == code


def test_not_leader_carries_the_hint_across_the_wire() -> None:
    exc = errors.NotLeaderError("follower", leader_uuid="ab" * 16, leader_addr="10.0.0.7:7050")
    pb = error_to_pb(exc)
    assert pb.code == common_pb2.NOT_THE_LEADER
    assert (pb.leader_addr.host, pb.leader_addr.port) == ("10.0.0.7", 7050)
    back = error_from_pb(pb)
    assert isinstance(back, errors.NotLeaderError)
    assert back.leader_uuid == "ab" * 16
    assert back.leader_addr == "10.0.0.7:7050"
    assert errors.is_retriable(back)


def test_not_leader_without_a_hint_has_none() -> None:
    back = error_from_pb(error_to_pb(errors.NotLeaderError("no leader known")))
    assert isinstance(back, errors.NotLeaderError)
    assert back.leader_uuid is None
    assert back.leader_addr is None


def test_cas_failure_carries_the_committed_index_even_when_zero() -> None:
    pb = error_to_pb(errors.CasFailedError("moved", committed_opid_index=0))
    assert pb.HasField("committed_opid_index")
    back = error_from_pb(pb)
    assert isinstance(back, errors.CasFailedError)
    assert back.committed_opid_index == 0
    unset = error_from_pb(error_to_pb(errors.CasFailedError("moved")))
    assert isinstance(unset, errors.CasFailedError)
    assert unset.committed_opid_index is None


def test_subclass_without_its_own_code_uses_the_nearest_mapped_base() -> None:
    class LocalDiskFull(errors.DiskFullError):
        pass

    assert error_to_pb(LocalDiskFull("full")).code == common_pb2.DISK_FULL


def test_a_bug_is_sent_as_unknown_with_its_message() -> None:
    pb = error_to_pb(KeyError("missing"))
    assert pb.code == common_pb2.UNKNOWN_ERROR
    assert "missing" in pb.message
    assert type(error_from_pb(pb)) is errors.NyalaError


def test_a_code_from_a_newer_server_is_not_lost() -> None:
    exc = error_from_pb(common_pb2.ErrorPB(code=999, message="new thing"))
    assert type(exc) is errors.NyalaError
    assert "999" in str(exc)


def test_raise_for_response_passes_success_through_and_raises_errors() -> None:
    ok = tserver_pb2.PingResponsePB(server_uuid="x")
    assert raise_for_response(ok) is ok
    failed = tserver_pb2.PingResponsePB()
    failed.error.code = common_pb2.WRONG_SERVER_UUID
    with pytest.raises(errors.WrongServerUuidError):
        raise_for_response(failed)


class _FakeRpcError(grpc.RpcError):
    """The two accessors grpc's errors expose; gRPC itself is exercised in test_rpc_service."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (grpc.StatusCode.UNAVAILABLE, errors.NetworkError),
        (grpc.StatusCode.DEADLINE_EXCEEDED, errors.TimedOutError),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, errors.InvalidArgumentError),
        (grpc.StatusCode.UNIMPLEMENTED, errors.NotSupportedError),
        (grpc.StatusCode.CANCELLED, errors.AbortedError),
        (grpc.StatusCode.INTERNAL, errors.NyalaError),
    ],
)
def test_transport_failures_map_to_typed_errors(
    status: grpc.StatusCode, cls: type[errors.NyalaError]
) -> None:
    exc = error_from_grpc(_FakeRpcError(status, "details here"), target="h:1")
    assert type(exc) is cls
    assert "h:1" in str(exc)
    assert "details here" in str(exc)


@pytest.mark.parametrize(
    ("addr", "host", "port"),
    [("127.0.0.1:7050", "127.0.0.1", 7050), ("[::1]:80", "::1", 80), ("h:0", "h", 0)],
)
def test_host_port_round_trip(addr: str, host: str, port: int) -> None:
    assert split_host_port(addr) == (host, port)
    assert join_host_port(host, port) == addr


@pytest.mark.parametrize("addr", ["", "host", ":80", "h:x", "h:70000", "h:-1"])
def test_malformed_addresses_are_refused(addr: str) -> None:
    with pytest.raises(errors.InvalidArgumentError):
        split_host_port(addr)
