"""The nyala exception tree.

Every error nyala raises is a ``NyalaError``. Errors split into two families:

* ``RetriableError``: the operation did not happen (or its outcome will be settled by a retry
  of the same request id) and the same call may succeed later, against another server or after
  a back-off: ``NotLeaderError``, ``ServiceUnavailableError``, ``TabletNotFoundError``,
  ``NetworkError``.
* everything else is final for that request: retrying the same input gives the same answer.

``TimedOutError`` is neither: the outcome is unknown (indeterminate). Clients that attach a
request id can retry it safely; others must read to find out. ``PartialWriteError`` is its
row-by-row form for a client write: it carries the per-row outcomes and the retry.

``RETRIABLE`` (and ``is_retriable``) is the one definition of which errors a client answers by
sending the same request again: the ``RetriableError`` family plus the few final-looking errors
that concern one server or one attempt, not the request.

Native (Rust) errors arrive here through one mapping (``pyext/src/errors.rs``): each Rust error
kind names one class below. Keep ``ErrorKind::python_class`` and this module in step.
"""

from __future__ import annotations

from typing import Any, TypeVar


class NyalaError(Exception):
    """Base class of every error nyala raises."""


class RetriableError(NyalaError):
    """The operation may succeed if retried (possibly elsewhere, after a back-off)."""


# --- retriable -----------------------------------------------------------------------------


class NotLeaderError(RetriableError):
    """The server is not the leader of the tablet (or of the master catalog).

    ``leader_uuid``/``leader_addr`` carry the hint, when the server knows one.
    """

    def __init__(
        self, message: str = "", *, leader_uuid: str | None = None, leader_addr: str | None = None
    ) -> None:
        super().__init__(message)
        self.leader_uuid = leader_uuid
        self.leader_addr = leader_addr


class ServiceUnavailableError(RetriableError):
    """The server is overloaded, throttled, or not ready yet; retry after a back-off."""


class TabletNotFoundError(RetriableError):
    """The server does not host a running replica of the tablet (refresh locations)."""


class NetworkError(RetriableError):
    """The server could not be reached, or the connection broke before an answer."""


class TabletNotRunningError(ServiceUnavailableError):
    """The replica exists but is bootstrapping or stopping; retry after a back-off."""


class ThrottledError(ServiceUnavailableError):
    """The server refused the work to protect itself (queue or memory limit)."""


class AlreadyInProgressError(ServiceUnavailableError):
    """The same operation (e.g. a tablet copy of this tablet) is already running there."""


class StaleReplicaError(ServiceUnavailableError):
    """A follower refused a follower read: it has not heard from its leader within the
    request's staleness bound (or is behind it); read another replica or the leader.
    SERVICE_UNAVAILABLE on the wire."""


# --- indeterminate -------------------------------------------------------------------------


class TimedOutError(NyalaError):
    """The deadline passed before an answer: the operation may or may not have happened."""


class PartialWriteError(NyalaError):
    """A write whose requests did not all get an answer: some rows may or may not have been
    applied. ``result`` is the call's ``nyala.WriteResult``: every row applied, failed (with
    its reason) or unknown; ``result.retry()`` resends the unanswered requests under their
    original request ids, so nothing is applied twice (docs/write-semantics.md)."""

    def __init__(self, message: str = "", *, result: Any = None) -> None:
        super().__init__(message)
        self.result = result


# --- final ---------------------------------------------------------------------------------


class InvalidArgumentError(NyalaError):
    """Bad input: malformed data, a schema mismatch, an out-of-range setting."""


class CorruptionError(NyalaError):
    """Persisted data failed a checksum or invariant. Nothing was deleted or truncated."""


class DiskError(NyalaError):
    """The operating system refused an I/O operation."""


class DiskFullError(DiskError):
    """No space left on the device. Nothing acknowledged was lost."""


class NotFoundError(NyalaError):
    """The named object (table, tablet, entry, file, server) does not exist."""


class AlreadyPresentError(NyalaError):
    """The object already exists."""


class IllegalStateError(NyalaError):
    """The call is not valid in the object's current state."""


class AbortedError(NyalaError):
    """The operation was cancelled or aborted before it completed."""


class NotSupportedError(NyalaError):
    """The feature or on-disk format version is not supported by this build."""


class CasFailedError(IllegalStateError):
    """A compare-and-set on the committed Raft config failed: the config moved.

    ``committed_opid_index`` is the committed config's op index at the time of the refusal.
    """

    def __init__(self, message: str = "", *, committed_opid_index: int | None = None) -> None:
        super().__init__(message)
        self.committed_opid_index = committed_opid_index


class WrongServerUuidError(NyalaError):
    """The request named a server UUID that is not the receiving server's."""


class NotAuthenticatedError(NyalaError):
    """The server could not tell who the caller is: no credentials, or credentials it does not
    accept (another cluster's, expired, forged). Pass credentials (``nyala.connect(...,
    credentials=DIR)``, ``NYALA_CREDENTIALS``); retrying as is gives the same answer."""


class NotAuthorizedError(NyalaError):
    """The caller is known but may not do this (an admin-only RPC from a user, a server-to-server
    RPC from a client, a join credential used twice or for another server)."""


class MissingDependencyError(NyalaError, ImportError):
    """A feature needs an optional dependency that is not installed. The message names the
    extra that brings it (``pip install 'nyala[pandas]'``); ``extra`` holds its name. Also an
    ``ImportError``, so code that guards an import with ``except ImportError`` still works."""

    def __init__(self, message: str, *, name: str | None = None, extra: str) -> None:
        super().__init__(message, name=name)
        self.extra = extra


class TabletFailedError(IllegalStateError):
    """The replica failed to start or hit an unrecoverable error and is offline."""


class SchemaMismatchError(InvalidArgumentError):
    """The request was encoded for another schema version; refresh the schema and retry."""


class ScannerExpiredError(NotFoundError):
    """The scanner is unknown to the server: it expired or was never opened."""


#: Errors after which a client may send the same request again, to the same or another server,
#: without risk: writes carry a request id, so a retry of an applied write is answered from the
#: replicas' result cache rather than applied twice. Besides the ``RetriableError`` family:
#: a timeout (outcome unknown: the retry settles it), a request that reached the wrong server
#: (stale address), an aborted attempt and a failed replica (another replica may serve it).
RETRIABLE: tuple[type[NyalaError], ...] = (
    RetriableError,
    TimedOutError,
    WrongServerUuidError,
    AbortedError,
    TabletFailedError,
)


def is_retriable(error: BaseException) -> bool:
    """Whether ``error`` is one of ``RETRIABLE``."""
    return isinstance(error, RETRIABLE)


_E = TypeVar("_E", bound=BaseException)


def kept_as_answer(error: _E) -> _E:
    """``error``, to be kept as a value (one write's answer among several), without its
    traceback if it is a ``NyalaError``.

    A traceback holds every frame the error passed through, and so their locals: the request
    being served (tens of MB for a bulk write) and the list the error is kept in, which holds
    the error. That cycle is freed only by Python's cyclic collector, which a server runs
    rarely (``nyala.common.process.tune_gc``); a tablet server refusing bulk writes over its
    soft memory limit kept 1 GB of refused requests alive so (docs/performance.md, "Refused
    writes kept alive"). A ``NyalaError`` is the answer itself and its traceback is not
    reported, nor are those of the errors it was raised from (``__cause__``, ``__context__``),
    whose frames hold the same locals; any other error keeps its traceback for the log that
    reports it."""
    if isinstance(error, NyalaError):
        chained: BaseException | None = error
        seen: set[int] = set()
        while chained is not None and id(chained) not in seen:
            seen.add(id(chained))
            chained.__traceback__ = None
            chained = chained.__cause__ or chained.__context__
    return error


__all__ = [
    "RETRIABLE",
    "AbortedError",
    "AlreadyInProgressError",
    "AlreadyPresentError",
    "CasFailedError",
    "CorruptionError",
    "DiskError",
    "DiskFullError",
    "IllegalStateError",
    "InvalidArgumentError",
    "MissingDependencyError",
    "NetworkError",
    "NotAuthenticatedError",
    "NotAuthorizedError",
    "NotFoundError",
    "NotLeaderError",
    "NotSupportedError",
    "NyalaError",
    "PartialWriteError",
    "RetriableError",
    "ScannerExpiredError",
    "SchemaMismatchError",
    "ServiceUnavailableError",
    "StaleReplicaError",
    "TabletFailedError",
    "TabletNotFoundError",
    "TabletNotRunningError",
    "ThrottledError",
    "TimedOutError",
    "WrongServerUuidError",
    "is_retriable",
]
