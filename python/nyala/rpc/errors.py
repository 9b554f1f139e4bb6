"""The one mapping between wire error codes (``ErrorPB``) and ``nyala.errors`` exceptions.

Servers turn an exception into an ``ErrorPB`` with ``error_to_pb``; clients turn an ``ErrorPB``
back into the same exception class with ``error_from_pb``, and a gRPC transport failure into
``NetworkError``/``TimedOutError``/... with ``error_from_grpc``. Nothing else in nyala knows
error codes.
"""

from __future__ import annotations

from typing import TypeAlias, TypeVar

import grpc

from nyala import errors
from nyala._proto import common_pb2
from nyala.rpc.messages import Answer

ErrorCode = common_pb2.ErrorCode
_Code: TypeAlias = common_pb2.ErrorCode.ValueType


_Answer = TypeVar("_Answer", bound=Answer)

# Code -> class. Each class appears once, so the mapping round-trips; a subclass is listed
# before its base class in lookups (see ``_code_for``).
CODE_TO_CLASS: dict[_Code, type[errors.NyalaError]] = {
    common_pb2.UNKNOWN_ERROR: errors.NyalaError,
    common_pb2.INVALID_ARGUMENT: errors.InvalidArgumentError,
    common_pb2.NOT_THE_LEADER: errors.NotLeaderError,
    common_pb2.WRONG_SERVER_UUID: errors.WrongServerUuidError,
    common_pb2.TABLET_NOT_FOUND: errors.TabletNotFoundError,
    common_pb2.TABLET_NOT_RUNNING: errors.TabletNotRunningError,
    common_pb2.TABLET_FAILED: errors.TabletFailedError,
    common_pb2.CAS_FAILED: errors.CasFailedError,
    common_pb2.ALREADY_INPROGRESS: errors.AlreadyInProgressError,
    common_pb2.THROTTLED: errors.ThrottledError,
    common_pb2.SERVICE_UNAVAILABLE: errors.ServiceUnavailableError,
    common_pb2.MISMATCHED_SCHEMA: errors.SchemaMismatchError,
    common_pb2.SCANNER_EXPIRED: errors.ScannerExpiredError,
    common_pb2.ALREADY_PRESENT: errors.AlreadyPresentError,
    common_pb2.NOT_FOUND: errors.NotFoundError,
    common_pb2.ILLEGAL_STATE: errors.IllegalStateError,
    common_pb2.CORRUPTION: errors.CorruptionError,
    common_pb2.DISK_ERROR: errors.DiskError,
    common_pb2.DISK_FULL: errors.DiskFullError,
    common_pb2.ABORTED: errors.AbortedError,
    common_pb2.NOT_SUPPORTED: errors.NotSupportedError,
    common_pb2.TIMED_OUT: errors.TimedOutError,
    common_pb2.NOT_AUTHENTICATED: errors.NotAuthenticatedError,
    common_pb2.NOT_AUTHORIZED: errors.NotAuthorizedError,
}

_CLASS_TO_CODE: dict[type[errors.NyalaError], _Code] = {
    cls: code for code, cls in CODE_TO_CLASS.items()
}
assert len(_CLASS_TO_CODE) == len(CODE_TO_CLASS), "each class maps to exactly one code"

# Transport failures (the call never got a nyala answer). Anything not listed is UNKNOWN.
_GRPC_STATUS_TO_CLASS: dict[grpc.StatusCode, type[errors.NyalaError]] = {
    grpc.StatusCode.UNAVAILABLE: errors.NetworkError,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.TimedOutError,
    grpc.StatusCode.CANCELLED: errors.AbortedError,
    grpc.StatusCode.UNIMPLEMENTED: errors.NotSupportedError,
    # A message over the size limit: sending it again gives the same answer.
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.InvalidArgumentError,
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgumentError,
    # Refused by the server's authentication check (nyala.rpc.auth).
    grpc.StatusCode.UNAUTHENTICATED: errors.NotAuthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: errors.NotAuthorizedError,
}


def _code_for(exc: BaseException) -> _Code:
    """The code of the most specific mapped class ``exc`` is an instance of."""
    for cls in type(exc).__mro__:
        code = _CLASS_TO_CODE.get(cls)
        if code is not None:
            return code
    return common_pb2.UNKNOWN_ERROR


def error_to_pb(exc: BaseException) -> common_pb2.ErrorPB:
    """The ``ErrorPB`` a server sends for ``exc`` (any exception; non-nyala ones are UNKNOWN)."""
    pb = common_pb2.ErrorPB(code=_code_for(exc), message=str(exc) or type(exc).__name__)
    if isinstance(exc, errors.NotLeaderError):
        if exc.leader_uuid:
            pb.leader_uuid = exc.leader_uuid
        if exc.leader_addr:
            host, port = split_host_port(exc.leader_addr)
            pb.leader_addr.host = host
            pb.leader_addr.port = port
    if isinstance(exc, errors.CasFailedError) and exc.committed_opid_index is not None:
        pb.committed_opid_index = exc.committed_opid_index
    return pb


def error_from_pb(pb: common_pb2.ErrorPB) -> errors.NyalaError:
    """The exception a client raises for an ``ErrorPB``."""
    cls = CODE_TO_CLASS.get(pb.code, errors.NyalaError)
    message = pb.message
    if cls is errors.NyalaError and pb.code != common_pb2.UNKNOWN_ERROR:
        message = f"{message} (unknown error code {pb.code})"
    if cls is errors.NotLeaderError:
        addr = None
        if pb.HasField("leader_addr") and pb.leader_addr.host:
            addr = join_host_port(pb.leader_addr.host, pb.leader_addr.port)
        return errors.NotLeaderError(message, leader_uuid=pb.leader_uuid or None, leader_addr=addr)
    if cls is errors.CasFailedError:
        index = pb.committed_opid_index if pb.HasField("committed_opid_index") else None
        return errors.CasFailedError(message, committed_opid_index=index)
    return cls(message)


def raise_for_response(response: _Answer) -> _Answer:
    """Returns ``response`` unless its ``error`` field is set, in which case raises it."""
    if response.HasField("error"):
        raise error_from_pb(response.error)
    return response


def error_from_grpc(err: grpc.RpcError, *, target: str) -> errors.NyalaError:
    """The exception for a call that failed in the transport (no nyala answer arrived)."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    cls = _GRPC_STATUS_TO_CLASS.get(code, errors.NyalaError)
    return cls(f"rpc to {target} failed: {code.name}: {details}")


def split_host_port(addr: str) -> tuple[str, int]:
    """``"h:p"`` or ``"[v6]:p"`` as (host, port); ``InvalidArgumentError`` if malformed."""
    host, sep, port_text = addr.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise errors.InvalidArgumentError(f"bad address {addr!r}: expected HOST:PORT")
    return host.removeprefix("[").removesuffix("]"), int(port_text)


def join_host_port(host: str, port: int) -> str:
    """The inverse of ``split_host_port``."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
