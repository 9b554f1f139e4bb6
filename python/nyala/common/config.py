"""Settings of a server as frozen dataclasses, and their conversion from flags.

A settings class lists every tunable with its unit in its name and its default (DESIGN.md §8).
This module owns the generic parts: which fields are tunable, parsing a flag's text into the
field's type, and building an instance with a clear error for a bad value. The command line
(``nyala.cli``) turns the same fields into ``--flag-name`` options.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from nyala.errors import InvalidArgumentError

_T = TypeVar("_T")

_SCALARS: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}


def tunable_fields(cls: type[Any]) -> list[dataclasses.Field[Any]]:
    """The fields of a settings dataclass that take a scalar value (int, float, str, bool)."""
    hints = typing.get_type_hints(cls)
    return [f for f in dataclasses.fields(cls) if hints[f.name] in _SCALARS.values()]


def field_type(cls: type[Any], name: str) -> type:
    """The scalar type of one tunable field."""
    return typing.get_type_hints(cls)[name]  # type: ignore[no-any-return]


def parse_value(kind: type, text: str, *, name: str) -> Any:
    """``text`` as a value of ``kind``; ``InvalidArgumentError`` naming the setting if bad."""
    if kind is bool:
        lowered = text.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise InvalidArgumentError(f"setting {name}: {text!r} is not a boolean")
    try:
        return kind(text.replace("_", "")) if kind in (int, float) else kind(text)
    except ValueError:
        raise InvalidArgumentError(
            f"setting {name}: {text!r} is not a valid {kind.__name__}"
        ) from None


def from_mapping(cls: type[_T], values: Mapping[str, Any]) -> _T:
    """An instance of ``cls`` from ``values`` (strings are parsed; unknown names are refused).

    Validation in the class's ``__post_init__`` that raises ``ValueError`` becomes
    ``InvalidArgumentError``.
    """
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - known)
    if unknown:
        raise InvalidArgumentError(f"unknown setting(s): {', '.join(unknown)}")
    kwargs: dict[str, Any] = {}
    tunable = {f.name for f in tunable_fields(cls)}
    for name, value in values.items():
        if isinstance(value, str) and name in tunable:
            value = parse_value(field_type(cls, name), value, name=name)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except ValueError as exc:
        raise InvalidArgumentError(f"bad settings: {exc}") from None


def read_flagfile(path: Path) -> dict[str, str]:
    """Settings from a file of ``name = value`` lines (``#`` starts a comment).

    Names may be written as flags (``--heartbeat-interval-ms``) or as fields
    (``heartbeat_interval_ms``). A malformed line is an ``InvalidArgumentError`` naming the
    file and line; values are parsed later, with the command line's, by ``from_mapping``.
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidArgumentError(f"{path}: cannot read flag file: {exc.strerror}") from None
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip():
            raise InvalidArgumentError(f"{path}:{number}: expected 'name = value', got {raw!r}")
        values[name.strip().removeprefix("--").replace("-", "_")] = value.strip()
    return values
