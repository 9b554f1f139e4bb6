"""What the cluster commands share: the ``-m/--masters`` and ``--timeout`` options, a connected
client, and errors as one stderr line (a JSON object under ``--format json``).

``one_line`` turns every failure a user can cause (a nyala error, a missing file, malformed
data that pyarrow refuses) into ``nyala: error: <Class>: <message>`` on stderr and exit code 1,
never a traceback; under ``--format json`` the line is ``{"error": "<Class>", "message":
"..."}`` instead, so scripts parse failures the way they parse answers. click's own usage
errors keep click's message and exit code 2.

``--timeout SECONDS`` bounds every RPC of the command and its waits (default 15 s; the replica
moves that wait for the master default to 300 s). When no master can be reached at all (nothing
listens at any address), the command fails within ``UNREACHABLE_FAIL_MS`` with each master's own
error ("Connection refused") rather than retrying until the timeout.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from nyala.errors import InvalidArgumentError, NyalaError

_F = TypeVar("_F", bound=Callable[..., Any])

MASTERS_HELP = "Comma-separated master addresses (default: $NYALA_MASTERS)."
#: Deadline of one command's RPCs when ``--timeout`` is not given, in milliseconds.
CLI_TIMEOUT_MS = 15_000
#: A command gives up this soon when no master can be reached at all.
UNREACHABLE_FAIL_MS = 1_000
_TIMEOUT_KEY = "nyala.timeout_ms"


def _store_timeout(ctx: click.Context, _: click.Parameter, value: float | None) -> None:
    if value is not None:
        ctx.meta[_TIMEOUT_KEY] = max(1, round(value * 1000))


def timeout_option(fn: _F, *, default_s: float = CLI_TIMEOUT_MS / 1000) -> _F:
    """Adds ``--timeout SECONDS`` (read back with ``timeout_ms()``); ``default_s`` is only
    what the help says: the command passes the same default to ``timeout_ms``."""
    option = click.option(
        "--timeout",
        type=click.FloatRange(min=0, min_open=True),
        default=None,
        expose_value=False,
        is_eager=True,
        callback=_store_timeout,
        metavar="SECONDS",
        help=f"Give up after this many seconds (default: {default_s:g}).",
    )
    return option(fn)


def timeout_ms(default_ms: int = CLI_TIMEOUT_MS) -> int:
    """The command's ``--timeout`` in milliseconds, or ``default_ms``."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return default_ms
    value = ctx.meta.get(_TIMEOUT_KEY)
    return default_ms if value is None else int(value)


def masters_option(fn: _F) -> _F:
    """Adds ``-m/--masters`` (default ``$NYALA_MASTERS``) and ``--timeout``."""
    option = click.option(
        "-m", "--masters", envvar="NYALA_MASTERS", required=True, help=MASTERS_HELP
    )
    return timeout_option(option(fn))


def client_for(masters: str | list[str], *, default_timeout_ms: int | None = None) -> Any:
    """A connected ``nyala.Client`` (imported here so ``--help`` stays fast) whose calls are
    bounded by ``--timeout`` (else ``default_timeout_ms``, else the client's defaults)."""
    from nyala.client import connect
    from nyala.client.client import ADMIN_TIMEOUT_MS

    given = timeout_ms(0) or default_timeout_ms
    deadline_ms = given or CLI_TIMEOUT_MS
    return connect(
        masters,
        timeout_ms=deadline_ms,
        admin_timeout_ms=given or ADMIN_TIMEOUT_MS,
        unreachable_fail_ms=min(UNREACHABLE_FAIL_MS, deadline_ms),
    )


def fail(exc: BaseException, fmt: str = "table") -> None:
    """Prints ``exc`` as one line on stderr (JSON under ``--format json``) and exits 1."""
    message = " ".join(str(exc).split()) or type(exc).__name__
    if fmt == "json":
        line = json.dumps({"error": type(exc).__name__, "message": message})
    else:
        line = f"nyala: error: {type(exc).__name__}: {message}"
    print(line, file=sys.stderr)
    sys.exit(1)


def _is_user_error(exc: BaseException) -> bool:
    arrow = sys.modules.get("pyarrow")
    return isinstance(exc, (ValueError, TypeError)) or (
        arrow is not None and isinstance(exc, arrow.ArrowException)
    )


def one_line(fn: _F) -> _F:
    """Reports user-caused failures as one line on stderr and exits 1."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        fmt = str(kwargs.get("fmt", "table"))
        try:
            return fn(*args, **kwargs)
        except (NyalaError, OSError) as exc:
            fail(exc, fmt)
        except KeyboardInterrupt:
            print("nyala: interrupted", file=sys.stderr)
            sys.exit(130)
        except Exception as exc:
            if not _is_user_error(exc):
                raise
            fail(InvalidArgumentError(str(exc)), fmt)

    return run  # type: ignore[return-value]


__all__ = [
    "CLI_TIMEOUT_MS",
    "client_for",
    "fail",
    "masters_option",
    "one_line",
    "timeout_ms",
    "timeout_option",
]
