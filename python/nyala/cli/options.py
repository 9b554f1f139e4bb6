"""Helpers every command module shares: settings as flags, and one-line errors.

``settings_options(cls)`` turns each tunable field of a settings dataclass into a
``--field-name`` option (``heartbeat_interval_ms`` -> ``--heartbeat-interval-ms``), so a new
setting is a flag without touching the command line code.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import click

from nyala.common.config import field_type, tunable_fields
from nyala.errors import NyalaError

_F = TypeVar("_F", bound=Callable[..., Any])


def flag_name(field_name: str) -> str:
    """``heartbeat_interval_ms`` -> ``--heartbeat-interval-ms``."""
    return "--" + field_name.replace("_", "-")


def settings_options(cls: type[Any], *, exclude: Iterable[str] = ()) -> Callable[[_F], _F]:
    """Adds one option per tunable field of ``cls`` (default: the field's default)."""
    skipped = set(exclude)

    def decorate(fn: _F) -> _F:
        for field in reversed(tunable_fields(cls)):
            if field.name in skipped:
                continue
            kind = field_type(cls, field.name)
            option: Any
            if kind is bool:
                option = click.option(
                    f"{flag_name(field.name)}/--no-{field.name.replace('_', '-')}",
                    field.name,
                    default=None,
                    help=f"(default: {field.default})",
                )
            else:
                option = click.option(
                    flag_name(field.name),
                    field.name,
                    type=kind,
                    default=None,
                    show_default=False,
                    help=f"(default: {field.default})",
                )
            fn = option(fn)
        return fn

    return decorate


def given(values: dict[str, Any]) -> dict[str, Any]:
    """The options the user actually set (``None`` means: keep the setting's default)."""
    return {name: value for name, value in values.items() if value is not None}


def one_line_errors(fn: _F) -> _F:
    """Reports a ``NyalaError`` as one line on stderr (JSON under ``--format json``) and exits
    1 (no traceback); the cluster commands use the broader ``cluster_client.one_line``."""
    from nyala.cli.cluster_client import fail

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except NyalaError as exc:
            fail(exc, str(kwargs.get("fmt", "table")))

    return run  # type: ignore[return-value]
