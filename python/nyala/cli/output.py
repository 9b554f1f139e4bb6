"""How every ``nyala`` command prints its answer: a readable table, or JSON for scripts.

Commands build a list of flat rows (dicts with the same keys) and hand it to ``emit`` with the
user's ``--format``; ``format_option`` is that flag. JSON output is one document on stdout
(a list of objects, or one object for ``emit_one``) so ``jq`` and tests can parse it whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import click

_F = TypeVar("_F", bound=Callable[..., Any])

FORMATS = ("table", "json")


def format_option(fn: _F) -> _F:
    """Adds ``--format table|json`` (default ``table``)."""
    option = click.option(
        "--format",
        "fmt",
        type=click.Choice(FORMATS),
        default="table",
        show_default=True,
        help="Output format: a readable table, or JSON for scripts.",
    )
    return option(fn)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ",".join(_cell(v) for v in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def render_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Rows as aligned text columns under an upper-case header."""
    if columns is None:
        columns = list(rows[0]) if rows else []
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    header = [c.upper().replace("_", " ") for c in columns]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    for r in cells:
        lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)


def emit(rows: Sequence[Mapping[str, Any]], fmt: str, columns: Sequence[str] | None = None) -> None:
    """Prints ``rows`` as a table (``columns`` picks and orders them) or as a JSON list."""
    if fmt == "json":
        click.echo(json.dumps(list(rows), indent=2, sort_keys=True, default=str))
    elif rows:
        click.echo(render_table(rows, columns))
    else:
        click.echo("(none)")


def emit_one(doc: Mapping[str, Any], fmt: str) -> None:
    """Prints one object: ``key: value`` lines, or a JSON object."""
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2, sort_keys=True, default=str))
        return
    width = max((len(k) for k in doc), default=0)
    for key, value in doc.items():
        text = json.dumps(value, default=str) if isinstance(value, (dict, list)) else _cell(value)
        click.echo(f"{key.ljust(width)}  {text}")


def replica_label(uuid: str | None, replicas: Sequence[Mapping[str, Any]]) -> str:
    """A replica as tables print it everywhere: ``<uuid prefix>@<address>`` ("" if none)."""
    if not uuid:
        return ""
    addr = next((r["addr"] for r in replicas if r["uuid"] == uuid), "?")
    return f"{uuid[:8]}@{addr}"


__all__ = ["FORMATS", "emit", "emit_one", "format_option", "render_table", "replica_label"]
