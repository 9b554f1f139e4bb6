"""What the cluster commands (``table``, ``tablet``, ``tserver list``) share: the
``-m/--masters`` option, a connected client, and errors as one stderr line.

``one_line`` turns every failure a user can cause (a nyala error, a missing file, malformed
data that pyarrow refuses) into ``nyala: error: <Class>: <message>`` on stderr and exit code 1,
never a traceback; click's own usage errors keep click's message and exit code 2.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
import pyarrow as pa

from nyala.errors import InvalidArgumentError, NyalaError

_F = TypeVar("_F", bound=Callable[..., Any])

MASTERS_HELP = "Comma-separated master addresses (default: $NYALA_MASTERS)."
#: Deadline of one command's RPCs, in milliseconds.
CLI_TIMEOUT_MS = 15_000


def masters_option(fn: _F) -> _F:
    """Adds ``-m/--masters`` (default ``$NYALA_MASTERS``)."""
    option = click.option(
        "-m", "--masters", envvar="NYALA_MASTERS", required=True, help=MASTERS_HELP
    )
    return option(fn)


def client_for(masters: str) -> Any:
    """A connected ``nyala.Client`` (imported here so ``--help`` stays fast)."""
    from nyala.client import connect

    return connect(masters, timeout_ms=CLI_TIMEOUT_MS)


def _fail(exc: BaseException) -> None:
    message = " ".join(str(exc).split()) or type(exc).__name__
    print(f"nyala: error: {type(exc).__name__}: {message}", file=sys.stderr)
    sys.exit(1)


def one_line(fn: _F) -> _F:
    """Reports user-caused failures as one line on stderr and exits 1."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (NyalaError, OSError) as exc:
            _fail(exc)
        except (pa.ArrowException, ValueError, TypeError) as exc:
            _fail(InvalidArgumentError(str(exc)))
        except KeyboardInterrupt:
            print("nyala: interrupted", file=sys.stderr)
            sys.exit(130)

    return run  # type: ignore[return-value]


__all__ = ["CLI_TIMEOUT_MS", "client_for", "masters_option", "one_line"]
